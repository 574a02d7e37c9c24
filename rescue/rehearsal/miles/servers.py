"""The processes of a rehearsal run and how they are reached: the stand-in engine's and the
Ray head's commands, waiting for a server to answer, the engine's pre-flight check, and the
process tree stopped at the end (found by the run folder in the environment, never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rescue.rehearsal.miles.command import RehearsalError, option_values
from rescue.rehearsal.verdict.processes import reap


def preflight(port: int, launcher: str) -> None:
    """The engine answers what the launcher's path needs: a SWE engine returns a chat tool
    call in ``tool_calls`` (the agent reads nothing else); a single-turn or text-game engine
    a reply sampled from the model with its finish reason."""
    if launcher != "swe":
        reply = _post(
            f"http://127.0.0.1:{port}/generate",
            {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
        )
        if not reply.get("output_ids") or "finish_reason" not in reply.get("meta_info", {}):
            raise RehearsalError(f"pre-flight: /generate returned no sampled reply: {reply}")
        return
    tool = {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    body = {
        "messages": [
            {"role": "system", "content": "pre-flight"},
            {"role": "user", "content": "pre-flight: run one command"},
        ],
        "tools": [tool],
        "max_tokens": 256,
    }
    reply = _post(f"http://127.0.0.1:{port}/v1/chat/completions", body)
    message = reply["choices"][0]["message"]
    if not message.get("tool_calls"):
        raise RehearsalError(
            "pre-flight: the engine returned the tool call as text in message.content "
            "(no tool_calls): the training command sets no --sglang-tool-call-parser, and "
            "Miles does not derive one from --tito-model; mini-swe-agent reads only "
            "tool_calls, so every trial would end in a format error"
        )


def _post(url: str, body: dict[str, Any], timeout: float = 60) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url`` answers (an error when ``proc`` exits first, or on a refusal)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RehearsalError(f"{proc.args[0]} exited with {proc.returncode} while starting")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):  # a refusal: waiting longer will not change it
                raise RehearsalError(f"{url} answered HTTP {e.code} {e.reason}") from e
        except OSError:
            pass
        time.sleep(0.5)
    raise RehearsalError(f"{url} did not answer within {deadline_s:.0f} s")


@contextlib.contextmanager
def processes(out: Path, ray_dirs: list[Path]) -> Iterator[list[subprocess.Popen]]:
    """Processes started here; on exit every process whose environment names ``out`` (or a
    run folder under it) is stopped and Ray's temporary folders ``ray_dirs`` removed."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        stop_all(started, out)
        for ray_dir in ray_dirs:
            shutil.rmtree(ray_dir, ignore_errors=True)


def stop_all(started: list[subprocess.Popen], out: Path) -> None:
    """Stop the processes started here (SIGTERM to each group, newest first; up to 20 s in
    all), then every process whose environment names ``out``."""
    for proc in reversed(started):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    reap(out)


def stop_each(procs: list[subprocess.Popen | None]) -> None:
    """Stop each process still running (its process group, SIGTERM), in order, waiting up to
    20 s for each."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)


def engine_command(flags: list[str], port: int, model: Path, folder: Path, seed: int) -> list[str]:
    """One run's stand-in engine (``rescue.rehearsal.standins.engine --policy``), with the
    parsers and context length its training command asks SGLang for."""
    cmd = [
        sys.executable, "-m", "rescue.rehearsal.standins.engine", "--port", str(port), "--policy",
        "--seed", str(seed), "--model-path", str(model),
        "--record", str(folder / "probes" / "engine.jsonl"),
        "--weights-record", str(folder / "probes" / "engine_weights.jsonl"), "--base-gpu-id", "1",
    ]  # fmt: skip
    for flag, option in (
        ("--sglang-tool-call-parser", "--tool-call-parser"),
        ("--sglang-reasoning-parser", "--reasoning-parser"),
        ("--sglang-context-length", "--context-length"),
    ):
        value = (option_values(flags, flag) or [None])[0]
        if value:
            cmd += [option, value]
    return cmd


def ray_command(ports: dict[str, int], ray_dir: Path) -> list[str]:
    """A lane's Ray head on 127.0.0.1: its own ports and temporary folder, two logical GPUs."""
    return [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1", "--port", str(ports["gcs"]),
        "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"]),
        "--ray-client-server-port", str(ports["client"]),
        "--dashboard-agent-listen-port", str(ports["agent"]),
        "--metrics-export-port", str(ports["metrics"]),
        "--num-cpus", "8", "--num-gpus", "2", "--temp-dir", str(ray_dir),
        "--disable-usage-stats",
    ]  # fmt: skip
