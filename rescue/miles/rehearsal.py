"""``make rehearsal``: the first steps of a real SWE arm through Miles' own process tree, on a CPU.

``python -m rescue.miles.rehearsal --arm protect --a 0.5 --miles-src /path/to/miles``

1. Builds the rehearsal's inputs in ``--out``: a tiny offline Qwen3-family tokenizer
   (``rescue.rehearsal.tokenizer``, the chat template read from the Miles checkout), tiny
   SWE-smith-shaped task repositories for the stand-in ``docker`` (one task whose image is
   missing, so a sandbox fault happens before any model call), and their prompt JSONL.
2. Runs ``launch/swe_arm.sh`` with ``DRY_RUN=1`` and the arm's settings plus the
   rehearsal's sizes (``SETTINGS``), and takes the printed ``ray job submit`` command:
   the exact training command of the arm.
3. Applies the ``argument`` rows of ``rescue.miles.cpu_changes.CHANGES`` and prints the
   whole table (patches and probes load in every process through ``sitecustomize``).
4. Starts the stand-in engine (``rescue.rehearsal.engine``) with the parsers and context
   the command asks SGLang for (``--sglang-tool-call-parser``, ``--sglang-reasoning-parser``,
   ``--sglang-context-length``). Pre-flight: one chat request with a tool must come back
   with ``tool_calls``; otherwise the run stops there with the reason.
5. Starts a Ray head of its own (free ports, logical resources), submits the job, waits.
6. Stops the Ray head and every process it started (also on failure or Ctrl-C: processes
   are found by the run folder in their environment, never by name), then checks the run
   (``rescue.rehearsal.report``) and prints the report. Exit 0 only when every check holds.
"""

from __future__ import annotations

import argparse
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

from rescue.miles.cpu_changes import CHANGES
from rescue.miles.rehearsal_command import (
    ROOT,
    RehearsalError,
    cpu_flags,
    drop_option,
    free_port,
    fsdp_known_flags,
    launcher_command,
    option_values,
)
from rescue.rehearsal import tasks as task_repos
from rescue.rehearsal.tokenizer import build_model_dir

SITE = Path(__file__).with_name("rehearsal_site")
ARMS = ("drop", "never-drop", "protect")

#: Launcher settings of the rehearsal (name, value, reason). Set on the launcher's
#: command line like any user setting; everything else is the arm's own default.
SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("ROLLOUT_BATCH_SIZE", "2", "2 cores: 2 prompts a step"),
    ("N_SAMPLES", "4", "group size 4: one trial of each scripted behaviour per group"),
    ("MAX_TURNS", "8", "turn cap the loop behaviour reaches within seconds"),
    ("GPUS_PER_NODE", "2", "Ray logical GPUs: one actor, one (external) engine"),
    ("TP", "1", "one training GPU (the TP flag is Megatron's and removed anyway)"),
    ("CP", "1", "the FSDP backend refuses context parallelism"),
    ("WANDB_MODE", "offline", "no network; the report reads the offline history"),
    ("DUMP_STEPS", "all", "every step's rollout dump, for the replay check"),
    ("PREFLIGHT", "0", "the cluster pre-flight checks GPUs and Docker; the rehearsal has its own"),
    ("REAP", "0", "no real containers"),
    ("RAY_STOP", "0", "never stop another Ray on a shared machine"),
)


def print_table(removed: list[str], settings: dict[str, str]) -> None:
    print("rehearsal: launcher settings (everything else is the arm's own)")
    reasons = {name: why for name, _, why in SETTINGS}
    for name, value in settings.items():
        print(f"  {name}={value}  ({reasons.get(name, 'the rehearsal input')})")
    print("rehearsal: CPU-forced changes (rescue/miles/cpu_changes.py)")
    for change in CHANGES:
        print(f"  [{change.kind}] {change.what}\n      why: {change.reason}")
    print(f"  removed flags: {' '.join(removed) or '(none)'}")


def preflight(port: int) -> None:
    """One chat request with a tool: the reply must carry ``tool_calls``, as the agent needs."""
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


def _post(url: str, body: dict[str, Any], timeout: float = 30) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _wait_http(url: str, deadline_s: float, proc: subprocess.Popen | None = None) -> None:
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


def write_inputs(out: Path, miles_src: Path, python: str) -> dict[str, Path]:
    """Tokenizer folder, task images, docker shim and prompt JSONL under ``out``."""
    template = miles_src / "miles/utils/chat_template_utils/templates/qwen3_fixed.jinja"
    model = build_model_dir(out / "model", template.read_text())
    docker_root = task_repos.docker_state(out / "docker")
    shim = task_repos.write_docker_shim(out / "bin", python)
    rows = []
    for k in range(3):
        iid = f"{task_repos.INSTANCE_ID[:-4]}{k:04d}"
        image = f"{task_repos.IMAGE}.t{k}"
        task_repos.make_task_image(docker_root / "images", image, iid)
        rows.append(
            {
                "prompt": f"Task {k}: {task_repos.PROBLEM}",
                "metadata": task_repos.task_metadata(iid, image),
            }
        )
    missing = task_repos.task_metadata(
        f"{task_repos.INSTANCE_ID[:-4]}9999", f"{task_repos.IMAGE}.gone"
    )
    rows.append({"prompt": f"Task 9: {task_repos.PROBLEM}", "metadata": missing})
    prompts = out / "data" / "tasks.jsonl"
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": model, "docker_root": docker_root, "shim": shim, "prompts": prompts}


@contextlib.contextmanager
def processes(out: Path, ray_dir: Path) -> Iterator[list[subprocess.Popen]]:
    """Processes started here; on exit every process whose environment names ``out`` is
    stopped and Ray's temporary folder ``ray_dir`` removed (the job's output is in ``out``)."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        stop_all(started, out)
        shutil.rmtree(ray_dir, ignore_errors=True)


def stop_all(started: list[subprocess.Popen], out: Path) -> None:
    import psutil

    for proc in reversed(started):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    me = os.getpid()
    for _ in range(3):
        leftovers = []
        for p in psutil.process_iter(["pid"]):
            if p.pid == me:
                continue
            with contextlib.suppress(psutil.Error):
                if p.environ().get("RESCUE_REHEARSAL_DIR") == str(out):
                    leftovers.append(p)
        if not leftovers:
            return
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(leftovers, timeout=10)


def launcher_settings(
    args: argparse.Namespace, miles_src: Path, out: Path, inputs: dict[str, Path], python: str
) -> dict[str, str]:
    """The launcher variables of the rehearsal: ``SETTINGS``, the arm's and the inputs'."""
    settings = {name: value for name, value, _ in SETTINGS}
    settings.update(
        ARM=args.arm,
        SEED=str(args.seed),
        NUM_ROLLOUT=str(args.steps + 1),
        MILES_DIR=str(miles_src),
        OUTPUT_DIR=str(out / "runs"),
        HF_CHECKPOINT=str(inputs["model"]),
        PROMPT_DATA=str(inputs["prompts"]),
        JOB_PYTHON=python,
        RESCUE_PY=python,
    )
    if args.a is not None:
        settings["A"] = args.a
    if args.staleness is not None:
        settings["STALENESS"] = str(args.staleness)
    if args.extra_args:
        settings["EXTRA_ARGS"] = args.extra_args
    return settings


def version_stride(chosen: int | None, flags: list[str]) -> int:
    """Versions per update: ``chosen``, else K+1 with ``--max-weight-staleness K``, else 1."""
    if chosen is not None:
        return chosen
    k = option_values(flags, "--max-weight-staleness")
    return int(k[0]) + 1 if k else 1


def run(args: argparse.Namespace) -> int:
    miles_src = Path(args.miles_src).resolve()
    if not (miles_src / "train_async.py").is_file():
        raise RehearsalError(
            f"MILES_SRC={args.miles_src}: no train_async.py there; set MILES_SRC to a Miles checkout"
        )
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise RehearsalError(f"--out {out} is not empty: choose a new folder")
    (out / "probes").mkdir(parents=True)
    started_at = time.monotonic()
    python = sys.executable
    inputs = write_inputs(out, miles_src, python)
    settings = launcher_settings(args, miles_src, out, inputs, python)

    runtime, flags = launcher_command(settings)
    for name in args.without:
        flags = drop_option(flags, name)
    ports = {k: free_port() for k in ("engine", "router", "session")}
    known = fsdp_known_flags(miles_src, flags)
    flags, removed = cpu_flags(
        flags,
        known,
        engine_port=ports["engine"],
        router_port=ports["router"],
        session_port=ports["session"],
        router=args.router,
    )
    print_table(removed, settings)
    if args.without:
        print(
            f"rehearsal: removed from the launcher's command (--without): {' '.join(args.without)}"
        )
    (out / "command.json").write_text(
        json.dumps({"runtime_env": runtime, "flags": flags}, indent=1)
    )

    k = (option_values(flags, "--max-weight-staleness") or [None])[0]
    stride = version_stride(args.version_stride, flags)
    env_vars = dict(runtime.get("env_vars", {}))
    env_vars["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(ROOT), str(miles_src), env_vars.get("PYTHONPATH", "")]
    )
    env_vars.update(
        RESCUE_REHEARSAL_DIR=str(out),
        RESCUE_REHEARSAL_VERSION_STRIDE=str(stride),
        FAKE_DOCKER_ROOT=str(inputs["docker_root"]),
        MSWEA_DOCKER_EXECUTABLE=str(inputs["shim"]),
        WANDB_MODE="offline",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_DEDUP_LOGS="0",
        # Ray >= 2.5x turns token authentication on for `ray start` once a token exists in
        # ~/.ray (any local ray.init() writes one); this private head on 127.0.0.1 goes without
        RAY_AUTH_MODE="disabled",
    )
    runtime = {**runtime, "env_vars": env_vars}
    print(f"rehearsal: weight version +{stride} per update (--max-weight-staleness {k})")
    base_env = {**os.environ, **env_vars}

    tool_parser = (option_values(flags, "--sglang-tool-call-parser") or [None])[0]
    reasoning = (option_values(flags, "--sglang-reasoning-parser") or [None])[0]
    context = (option_values(flags, "--sglang-context-length") or [None])[0]
    engine_cmd = [
        python, "-m", "rescue.rehearsal.engine", "--port", str(ports["engine"]),
        "--model-path", str(inputs["model"]), "--record", str(out / "probes" / "engine.jsonl"),
        "--base-gpu-id", "1",
    ]  # fmt: skip
    if tool_parser:
        engine_cmd += ["--tool-call-parser", tool_parser]
    if reasoning:
        engine_cmd += ["--reasoning-parser", reasoning]
    if context:
        engine_cmd += ["--context-length", context]

    ray_dir = Path(f"/tmp/rrh-{os.getpid()}")
    ray_ports = {k: free_port() for k in ("gcs", "dashboard", "client", "agent", "metrics")}
    dashboard = f"http://127.0.0.1:{ray_ports['dashboard']}"
    log = out / "job.log"
    status = "not submitted"
    with processes(out, ray_dir) as started:
        engine_log = (out / "engine.log").open("w")
        started.append(
            subprocess.Popen(
                engine_cmd, env=base_env, stdout=engine_log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{ports['engine']}/health", 60, started[-1])
        preflight(ports["engine"])
        print(f"rehearsal: engine on :{ports['engine']} passed pre-flight; starting Ray")
        ray_log = (out / "ray.log").open("w")
        started.append(
            subprocess.Popen(
                [
                    str(Path(python).with_name("ray")), "start", "--head", "--block",
                    "--node-ip-address", "127.0.0.1", "--port", str(ray_ports["gcs"]),
                    "--dashboard-host", "127.0.0.1",
                    "--dashboard-port", str(ray_ports["dashboard"]),
                    "--ray-client-server-port", str(ray_ports["client"]),
                    "--dashboard-agent-listen-port", str(ray_ports["agent"]),
                    "--metrics-export-port", str(ray_ports["metrics"]),
                    "--num-cpus", "8", "--num-gpus", "2", "--temp-dir", str(ray_dir),
                    "--disable-usage-stats",
                ],
                env=base_env, stdout=ray_log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
        _wait_http(f"{dashboard}/api/version", 180, started[-1])
        print(f"rehearsal: Ray head up ({dashboard}); submitting {args.steps} steps")
        submit = [
            str(Path(python).with_name("ray")), "job", "submit", "--address", dashboard,
            "--submission-id", f"rescue-rehearsal-{os.getpid()}",
            "--runtime-env-json", json.dumps(runtime), "--",
            python, str(miles_src / "train_async.py"), *flags,
        ]  # fmt: skip
        with log.open("w") as f:
            job = subprocess.Popen(
                submit, env=base_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
            started.append(job)
            try:
                rc = job.wait(timeout=args.timeout)
                status = "SUCCEEDED" if rc == 0 else f"FAILED (ray job submit exit {rc})"
            except subprocess.TimeoutExpired:
                status = f"TIMEOUT after {args.timeout} s"
    wall = time.monotonic() - started_at
    from rescue.rehearsal.report import check_run

    report = check_run(
        out,
        arm=args.arm,
        a=float(args.a) if args.a else None,
        job_status=status,
        steps_checked=args.steps,
    )
    print(report.render(wall_s=wall))
    (out / "report.json").write_text(json.dumps(report.as_dict(wall_s=wall), indent=1))
    return 0 if report.ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The rehearsal's flags, checked (an error names the flag and what is allowed)."""
    p = argparse.ArgumentParser(prog="python -m rescue.miles.rehearsal", description=__doc__)
    p.add_argument("--arm", default="protect", help=f"one of {', '.join(ARMS)} (default protect)")
    p.add_argument("--a", default=None, help="keep probability for protect (default 0.5)")
    p.add_argument("--miles-src", default=os.environ.get("MILES_SRC"), help="Miles checkout")
    p.add_argument(
        "--steps",
        type=int,
        default=6,
        help="steps checked (default 6); the run makes one more, whose rollout metrics "
        "Miles can lose at exit",
    )
    p.add_argument("--seed", type=int, default=1, help="SEED of the launcher (default 1)")
    p.add_argument(
        "--staleness", type=int, default=None, help="STALENESS K (default: the launcher's)"
    )
    p.add_argument(
        "--version-stride",
        type=int,
        default=None,
        help="weight versions per update (default K+1 with --max-weight-staleness K, so a "
        "group that crosses an update is stale; else 1)",
    )
    p.add_argument(
        "--router",
        default="miles",
        help="miles (Miles' own router, default) or sglang (PyPI sglang-router)",
    )
    p.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="FLAG",
        help="rehearse the launcher's command without FLAG, e.g. "
        "--without=--sglang-tool-call-parser (repeatable; default none)",
    )
    p.add_argument("--extra-args", default="", help="EXTRA_ARGS of the launcher (default none)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds for the job (default 1800)")
    p.add_argument("--out", default=None, help="run folder (default runs/rehearsal/ARM-TIME)")
    a = p.parse_args(argv)
    if a.arm not in ARMS:
        p.error(f"--arm={a.arm!r}; allowed: {', '.join(ARMS)}")
    if a.arm == "protect" and a.a is None:
        a.a = "0.5"
    if not a.miles_src:
        p.error("--miles-src (or MILES_SRC) is required: a Miles checkout with train_async.py")
    if a.router not in ("miles", "sglang"):
        p.error(f"--router={a.router!r}; allowed: miles, sglang")
    bad = [f for f in a.without if not f.startswith("--")]
    if bad:
        p.error(f"--without={bad[0]!r}; allowed: a flag name such as --sglang-tool-call-parser")
    if a.version_stride is not None and a.version_stride < 1:
        p.error(f"--version-stride={a.version_stride}; allowed: an integer >= 1")
    if a.steps < 1:
        p.error(f"--steps={a.steps}; allowed: an integer >= 1")
    a.out = a.out or str(ROOT / "runs" / "rehearsal" / f"{a.arm}-{time.strftime('%Y%m%d-%H%M%S')}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every process the run started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(a)
    except RehearsalError as e:
        print(f"rehearsal: FAILED: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
