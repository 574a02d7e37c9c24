"""``make rehearsal``: an arm trained through Miles' own loop, on a CPU, for a few steps.

``python -m rescue.rehearsal.miles --arm protect --a 0.5 --miles-src M --megatron-src L``

1. Builds the rehearsal's inputs in ``--out``: a tiny offline Qwen3-family tokenizer and a
   tiny Qwen3 checkpoint drawn from ``--seed`` (``rescue.rehearsal.tokenizer``,
   ``rescue.rehearsal.policy``), tiny SWE-smith-shaped task repositories for the stand-in
   ``docker`` (one task whose image is missing, so a sandbox fault happens before any model
   call), their prompt JSONL, and an empty folder the trainer starts from.
2. Runs ``launch/swe_arm.sh`` with ``DRY_RUN=1`` and the arm's settings plus the
   rehearsal's (``SETTINGS``), and takes the printed ``ray job submit`` command: the exact
   training command of the arm, Megatron backend and all.
3. Applies the ``argument`` rows of ``rescue.rehearsal.miles.changes.CHANGES`` and prints
   the whole table (patches and probes load in every process through ``sitecustomize``).
4. Starts the stand-in engine (``rescue.rehearsal.engine --policy``: the tiny model, Miles'
   weight updates by broadcast) with the parsers and context the command asks SGLang for.
   Pre-flight: one chat request with a tool must come back with ``tool_calls``; otherwise
   the run stops there with the reason.
5. Starts a Ray head of its own (free ports, logical resources), submits Miles'
   ``train_async.py``, and prints the steps trained every 30 s while it waits.
6. Stops the Ray head and every process it started (also on failure, Ctrl-C or SIGTERM:
   processes are found by the run folder in their environment, never by name), then checks
   the run (``rescue.rehearsal.report``) and prints the report. Exit 0 only when every
   check holds.
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

from rescue.rehearsal import tasks as task_repos
from rescue.rehearsal.miles.changes import CHANGES, FAULT_ENV, FAULTS
from rescue.rehearsal.miles.command import (
    ROOT,
    RehearsalError,
    cpu_flags,
    drop_option,
    free_port,
    launcher_command,
    option_values,
)
from rescue.rehearsal.processes import CpuMeter, reap
from rescue.rehearsal.tokenizer import build_model_dir

SITE = Path(__file__).with_name("site")
STALE_ARMS = ("drop", "never-drop", "protect", "pace")
BUDGET_ARMS = ("zero", "mask", "matched", "drgrpo-mask", "survivor", "turn")
ARMS = (*STALE_ARMS, *BUDGET_ARMS)
OFFPOLICY = ("tis-sc", "tis")

#: Launcher settings of the rehearsal (name, value, reason). Set on the launcher's command
#: line like any user setting; everything else is the arm's own default. ``{out}`` is the
#: run folder.
SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("ROLLOUT_BATCH_SIZE", "2", "2 cores: 2 prompts a step"),
    ("N_SAMPLES", "4", "group size 4: one trial of each scripted behaviour per group"),
    ("MAX_TURNS", "8", "a turn cap the loop behaviour reaches within seconds"),
    (
        "MAX_SEQ_LEN",
        "4096",
        "the agent's system prompt (1.3k tokens of the tiny tokenizer) and 8 turns fit; the "
        "overrun behaviour fills it in a few turns",
    ),
    ("MAX_RESPONSE_LEN", "1024", "below MAX_SEQ_LEN, as the launcher requires"),
    (
        "STALENESS",
        "0",
        "K = 0: a group generated across a weight update is stale, so a few steps have "
        "stale groups",
    ),
    ("AGENT_CONCURRENCY", "16", "4 groups' trials at once (with the EXTRA_ARGS below)"),
    (
        "EXTRA_ARGS",
        "--async-max-concurrent-samples 16",
        "4 groups in flight, not Miles' default of one step's 2: groups that start while "
        "the trainer steps make model calls before the next weight update, so stale groups "
        "appear every step (the rehearsal's --extra-args are added after)",
    ),
    ("GPUS_PER_NODE", "2", "Ray logical GPUs: one train actor, one (external) engine"),
    ("TP", "1", "one training process"),
    ("CP", "1", "one training process"),
    ("MAX_TOKENS_PER_GPU", "4096", "micro-batches of a few trajectories"),
    ("LR", "1e-3", "a step moves the bf16 weights (1e-6 moves only the fp32 main weights)"),
    (
        "REF_LOAD",
        "{out}/ref",
        "empty: the trainer starts from Megatron's seeded initialization; the engine "
        "receives those weights at Miles' first weight update",
    ),
    ("SAVE_INTERVAL", "1000", "one checkpoint, at the last step"),
    ("WANDB_MODE", "offline", "no network; the report reads the offline history"),
    ("DUMP_STEPS", "all", "every step's rollout dump, for the replay check"),
    ("PREFLIGHT", "0", "the cluster pre-flight checks GPUs and Docker; the rehearsal has its own"),
    ("REAP", "0", "no real containers"),
    ("RAY_STOP", "0", "never stop another Ray on a shared machine"),
)


#: Settings of one arm over ``SETTINGS`` (name, value, reason).
ARM_SETTINGS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "pace": (("STALENESS", "1", "pace needs K >= 1 for a window wider than one step's batch"),),
    "drop": (
        ("AGENT_CONCURRENCY", "12", "3 groups' trials at once (with the EXTRA_ARGS below)"),
        (
            "EXTRA_ARGS",
            "--async-max-concurrent-samples 12",
            "3 groups in flight: one crosses each weight update and is dropped; with 4 nearly "
            "every group in flight went stale and each step waited for them to be generated "
            "again (the rehearsal's --extra-args are added after)",
        ),
    ),
}


def print_table(removed: list[str], settings: dict[str, str], arm: str) -> None:
    print("rehearsal: launcher settings (everything else is the arm's own)")
    reasons = {name: why for name, _, why in (*SETTINGS, *ARM_SETTINGS.get(arm, ()))}
    for name, value in settings.items():
        print(f"  {name}={value}  ({reasons.get(name, 'the rehearsal input')})")
    print("rehearsal: CPU-forced changes (rescue/rehearsal/miles/changes.py)")
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


def _post(url: str, body: dict[str, Any], timeout: float = 60) -> Any:
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


def megatron_model_args(config: dict[str, Any]) -> str:
    """Megatron's architecture flags for a Qwen3 ``config.json`` (as Miles' model scripts
    write them for the family, ``scripts/models/qwen3-*.py``)."""
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    args = [
        "--swiglu",
        f"--num-layers {config['num_hidden_layers']}",
        f"--hidden-size {config['hidden_size']}",
        f"--ffn-hidden-size {config['intermediate_size']}",
        f"--num-attention-heads {config['num_attention_heads']}",
        "--group-query-attention",
        f"--num-query-groups {config['num_key_value_heads']}",
        "--use-rotary-position-embeddings",
        "--disable-bias-linear",
        "--normalization RMSNorm",
        f"--norm-epsilon {config['rms_norm_eps']}",
        f"--rotary-base {int(rope_theta)}",
        f"--vocab-size {config['vocab_size']}",
        f"--kv-channels {config['head_dim']}",
        "--qk-layernorm",
    ]
    if not config.get("tie_word_embeddings", False):
        args.append("--untie-embeddings-and-output-weights")
    return " ".join(args)


def agent_prompts() -> tuple[str, ...]:
    """The SWE agent's prompt templates (mini-swe-agent's config the agent reads), so the
    tiny tokenizer learns them: the system prompt takes about 1.1k tokens instead of 3.2k."""
    import yaml
    from minisweagent.config import get_config_path

    from swe_smith_tasks.agent_settings import AgentSettings

    config = yaml.safe_load(get_config_path(AgentSettings().config).read_text()) or {}
    agent = config.get("agent", {})
    return tuple(str(agent[k]) for k in ("system_template", "instance_template") if k in agent)


def write_inputs(out: Path, miles_src: Path, seed: int) -> dict[str, Path]:
    """Tokenizer and checkpoint, task images, docker shim, prompt JSONL and the empty
    folder the trainer starts from, under ``out``."""
    from rescue.rehearsal.policy import write_checkpoint

    template = miles_src / "miles/utils/chat_template_utils/templates/qwen3_fixed.jinja"
    model = build_model_dir(
        out / "model", template.read_text(), vocab_size=2048, corpus=agent_prompts()
    )
    write_checkpoint(model, seed)
    docker_root = task_repos.docker_state(out / "docker")
    shim = task_repos.write_docker_shim(out / "bin", sys.executable)
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
    (out / "ref").mkdir()
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
    for proc in reversed(started):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    reap(out)


def launcher_settings(
    args: argparse.Namespace, miles_src: Path, megatron_src: Path, out: Path,
    inputs: dict[str, Path],
) -> dict[str, str]:  # fmt: skip
    """The launcher variables of the rehearsal: ``SETTINGS``, the arm's and the inputs'."""
    settings = {
        name: value.format(out=out)
        for name, value, _ in (*SETTINGS, *ARM_SETTINGS.get(args.arm, ()))
    }
    config = json.loads((inputs["model"] / "config.json").read_text())
    settings.update(
        ARM=args.arm,
        SEED=str(args.seed),
        OFFPOLICY=args.offpolicy,
        NUM_ROLLOUT=str(args.steps + 1),
        MILES_DIR=str(miles_src),
        MEGATRON_DIR=str(megatron_src),
        OUTPUT_DIR=str(out / "runs"),
        HF_CHECKPOINT=str(inputs["model"]),
        MODEL_ARGS=megatron_model_args(config),
        PROMPT_DATA=str(inputs["prompts"]),
        JOB_PYTHON=sys.executable,
        RESCUE_PY=sys.executable,
    )
    if args.a is not None:
        settings["A"] = args.a
    if args.staleness is not None:
        settings["STALENESS"] = str(args.staleness)
    if args.extra_args:
        settings["EXTRA_ARGS"] += f" {args.extra_args}"
    return settings


def _engine_command(flags: list[str], port: int, inputs: dict[str, Path], out: Path, seed: int):
    cmd = [
        sys.executable, "-m", "rescue.rehearsal.engine", "--port", str(port), "--policy",
        "--seed", str(seed), "--model-path", str(inputs["model"]),
        "--record", str(out / "probes" / "engine.jsonl"),
        "--weights-record", str(out / "probes" / "engine_weights.jsonl"), "--base-gpu-id", "1",
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


def _ray_command(ports: dict[str, int], ray_dir: Path) -> list[str]:
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


def _progress(out: Path, started_at: float, steps: int) -> str:
    """One line: seconds since the start and the steps trained so far (weight updates
    after the first, which only loads the trainer's initial weights)."""
    log = out / "probes" / "trainer_weights.jsonl"
    updates = len(log.read_text().splitlines()) if log.exists() else 0
    trained = max(0, updates - 1)
    return f"rehearsal: {time.monotonic() - started_at:.0f} s, {trained} of {steps} steps trained"


def run(args: argparse.Namespace) -> int:
    miles_src = Path(args.miles_src).resolve()
    megatron_src = Path(args.megatron_src).resolve()
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise RehearsalError(f"--out {out} is not empty: choose a new folder")
    (out / "probes").mkdir(parents=True)
    started_at = time.monotonic()
    marks = {"start": time.time()}

    def mark(name: str) -> None:
        marks[name] = time.time()
        (out / "marks.json").write_text(json.dumps(marks))

    inputs = write_inputs(out, miles_src, args.seed)
    mark("inputs")
    settings = launcher_settings(args, miles_src, megatron_src, out, inputs)
    runtime, flags = launcher_command(settings)
    for name in args.without:
        flags = drop_option(flags, name)
    ports = {k: free_port() for k in ("engine", "router", "session")}
    flags, removed = cpu_flags(
        flags,
        engine_port=ports["engine"],
        router_port=ports["router"],
        session_port=ports["session"],
        router=args.router,
    )
    print_table(removed, settings, args.arm)
    if args.without:
        print(
            f"rehearsal: removed from the launcher's command (--without): {' '.join(args.without)}"
        )
    (out / "command.json").write_text(
        json.dumps({"runtime_env": runtime, "flags": flags}, indent=1)
    )

    env_vars = dict(runtime.get("env_vars", {}))
    env_vars["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(ROOT), str(miles_src), str(megatron_src), env_vars.get("PYTHONPATH", "")]
    )
    env_vars.update(
        RESCUE_REHEARSAL_DIR=str(out),
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
    if args.fault:
        env_vars[FAULT_ENV] = args.fault
    runtime = {**runtime, "env_vars": env_vars}
    base_env = {**os.environ, **env_vars}

    ray_dir = Path(f"/tmp/rrh-{os.getpid()}")
    ray_ports = {k: free_port() for k in ("gcs", "dashboard", "client", "agent", "metrics")}
    dashboard = f"http://127.0.0.1:{ray_ports['dashboard']}"
    status = "not submitted"
    with processes(out, ray_dir) as started:

        def spawn(cmd: list[str], log: str) -> subprocess.Popen:
            f = (out / log).open("w")
            started.append(
                subprocess.Popen(
                    cmd, env=base_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            return started[-1]

        engine = spawn(
            _engine_command(flags, ports["engine"], inputs, out, args.seed), "engine.log"
        )
        _wait_http(f"http://127.0.0.1:{ports['engine']}/health", 120, engine)
        preflight(ports["engine"])
        mark("engine")
        print(f"rehearsal: engine on :{ports['engine']} passed pre-flight; starting Ray")
        ray = spawn(_ray_command(ray_ports, ray_dir), "ray.log")
        _wait_http(f"{dashboard}/api/version", 180, ray)
        mark("ray")
        print(f"rehearsal: Ray head up ({dashboard}); submitting {args.steps} steps")
        job = spawn(
            [
                str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", dashboard,
                "--submission-id", f"rescue-rehearsal-{os.getpid()}",
                "--runtime-env-json", json.dumps(runtime), "--",
                sys.executable, str(miles_src / "train_async.py"), *flags,
            ],
            "job.log",
        )  # fmt: skip
        mark("submitted")
        deadline = started_at + args.timeout
        meter, said = CpuMeter(out), time.monotonic()
        while job.poll() is None and time.monotonic() < deadline:
            meter.sample()
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.wait(timeout=min(5, max(0.1, deadline - time.monotonic())))
            if job.poll() is None and time.monotonic() - said >= 30:
                said = time.monotonic()
                print(_progress(out, started_at, args.steps), flush=True)
        mark("job end")
        (out / "cpu.json").write_text(json.dumps(meter.totals()))
        rc = job.poll()
        if rc is None:
            status = f"TIMEOUT after {args.timeout} s"
        else:
            status = "SUCCEEDED" if rc == 0 else f"FAILED (ray job submit exit {rc})"
    wall = time.monotonic() - started_at
    from rescue.rehearsal.report import check_run

    report = check_run(
        out,
        arm=args.arm,
        a=float(args.a) if args.a else None,
        offpolicy=args.offpolicy,
        job_status=status,
        steps_checked=args.steps,
    )
    from rescue.rehearsal.profile import profile, render

    report.facts["profile"] = profile(out)
    print(render(report.facts["profile"]))
    print(report.render(wall_s=wall))
    (out / "report.json").write_text(json.dumps(report.as_dict(wall_s=wall), indent=1))
    return 0 if report.ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The rehearsal's flags, checked (an error names the flag and what is allowed)."""
    p = argparse.ArgumentParser(prog="python -m rescue.rehearsal.miles", description=__doc__)
    p.add_argument("--arm", default="protect", help=f"one of {', '.join(ARMS)} (default protect)")
    p.add_argument("--a", default=None, help="keep probability for protect (default 0.5)")
    p.add_argument("--miles-src", default=os.environ.get("MILES_SRC"), help="Miles checkout")
    p.add_argument(
        "--megatron-src",
        default=os.environ.get("MEGATRON_SRC"),
        help="Megatron-LM checkout (megatron.core, megatron.training; default $MEGATRON_SRC)",
    )
    p.add_argument(
        "--offpolicy",
        default="tis-sc",
        help="OFFPOLICY of the launcher: tis-sc (default, TIS with score centering) or tis",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        help="trained steps checked (default 3); the run makes one more, whose rollout "
        "metrics Miles can lose at exit",
    )
    p.add_argument("--seed", type=int, default=1, help="SEED of the launcher (default 1)")
    p.add_argument("--staleness", type=int, default=None, help="STALENESS K (default 0; pace 1)")
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
    p.add_argument(
        "--fault",
        default=None,
        help=f"break the run on purpose, to see the rehearsal catch it: {', '.join(FAULTS)} "
        "(default none)",
    )
    p.add_argument("--timeout", type=int, default=1200, help="seconds in all (default 1200)")
    p.add_argument("--out", default=None, help="run folder (default runs/rehearsal/ARM-TIME)")
    a = p.parse_args(argv)
    if a.arm not in ARMS:
        p.error(f"--arm={a.arm!r}; allowed: {', '.join(ARMS)}")
    if a.arm == "protect" and a.a is None:
        a.a = "0.5"
    if a.offpolicy not in OFFPOLICY:
        p.error(f"--offpolicy={a.offpolicy!r}; allowed: {', '.join(OFFPOLICY)}")
    for flag, value, what in (
        ("--miles-src", a.miles_src, "a Miles checkout with train_async.py"),
        ("--megatron-src", a.megatron_src, "a Megatron-LM checkout with megatron/training"),
    ):
        if not value:
            p.error(f"{flag} (or {flag[2:].upper().replace('-', '_')}) is required: {what}")
    if not (Path(a.miles_src) / "train_async.py").is_file():
        p.error(f"--miles-src={a.miles_src}: no train_async.py there; allowed: a Miles checkout")
    if not (Path(a.megatron_src) / "megatron" / "training").is_dir():
        p.error(
            f"--megatron-src={a.megatron_src}: no megatron/training there; allowed: a "
            "Megatron-LM checkout (the vendored megatron-2e64d788)"
        )
    if a.fault is not None and a.fault not in FAULTS:
        p.error(f"--fault={a.fault!r}; allowed: {', '.join(FAULTS)}")
    if a.router not in ("miles", "sglang"):
        p.error(f"--router={a.router!r}; allowed: miles, sglang")
    bad = [f for f in a.without if not f.startswith("--")]
    if bad:
        p.error(f"--without={bad[0]!r}; allowed: a flag name such as --sglang-tool-call-parser")
    if a.steps < 1:
        p.error(f"--steps={a.steps}; allowed: an integer >= 1")
    if a.timeout < 1:
        p.error(f"--timeout={a.timeout}; allowed: seconds >= 1")
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
    except KeyboardInterrupt:
        print("rehearsal: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
