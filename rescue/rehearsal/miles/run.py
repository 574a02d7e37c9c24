"""``make rehearsal``: arms trained through Miles' own loop, on a CPU, for a few steps.

``python -m rescue.rehearsal.miles [--launcher swe|rlvr|agent] --arm ARM --miles-src M
--megatron-src L`` (one run), or ``--arm A,B --seeds N [--parallel 2]`` (every arm x seed,
each its own run, lane by lane on the Ray heads of ``--parallel`` lanes):

1. Builds the inputs the runs share (``rescue.rehearsal.miles.inputs``): the tiny model
   (the SWE launcher's drawn from ``--seed``; the single-turn and text-game launchers' taught
   their task first, and written in Megatron's format for the trainer to start from), the
   prompt rows, and for the single-turn launcher the calibrated cap.
2. For each run, runs the launcher (``rescue.rehearsal.miles.launchers``: ``swe_arm.sh``,
   ``rlvr_arm.sh``, ``agent_arm.sh``) with ``DRY_RUN=1`` and the arm's settings plus the
   rehearsal's, and takes the printed ``ray job submit`` command: the exact training command
   of the arm and its Miles entry point (``train_async.py`` or ``train.py``).
3. Applies the ``argument`` rows of ``rescue.rehearsal.miles.changes.CHANGES`` and prints
   the whole table once (patches and probes load in every process through
   ``sitecustomize``).
4. For each run, starts the stand-in engine (``rescue.rehearsal.standins.engine --policy``: the tiny
   model, Miles' weight updates by broadcast) with the parsers and context the command asks
   SGLang for and checks it (pre-flight: a SWE engine must return ``tool_calls``, a
   single-turn or text-game engine a sampled reply; a failure stops the rehearsal there,
   before Ray), then submits the run's job to a Ray head of the rehearsal's own: one per
   lane of ``--parallel`` (free ports, two logical GPUs: Miles checks the engine's GPU id
   against the one Ray gives its bundle, so each head holds one run at a time), started for
   the lane's first run and reused by the next; the steps each run has trained are printed
   every 30 s.
5. When a run's job ends, stops its engine and every process of its folder, checks it
   (``rescue.rehearsal.verdict.report``), profiles it and prints its report; at the end stops the
   Ray head and every process it started (also on failure, Ctrl-C or SIGTERM: processes are
   found by the run folder in their environment, never by name). Exit 0 only when every
   check of every run holds.

With one run, its folder is ``--out``; with several, ``--out/<arm>[-a<A>]-seed<S>`` and
``--out/summary.json`` lists them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.rehearsal.miles import inputs as run_inputs
from rescue.rehearsal.miles import options, resume
from rescue.rehearsal.miles.changes import CHANGES, FAULT_ENV
from rescue.rehearsal.miles.command import (
    ROOT,
    RehearsalError,
    cpu_flags,
    drop_option,
    free_port,
    launcher_dry_run,
)
from rescue.rehearsal.miles.inputs import agent_prompts, megatron_model_args
from rescue.rehearsal.miles.jobs import Job
from rescue.rehearsal.miles.launchers import LAUNCHERS, SWE, Launcher
from rescue.rehearsal.miles.reports import report_run, summarize
from rescue.rehearsal.miles.servers import (
    engine_command,
    preflight,
    processes,
    ray_command,
    stop_each,
    wait_http,
)
from rescue.rehearsal.verdict.processes import CpuMeter, reap
from rescue.stages import write_progress

__all__ = ["agent_prompts", "main", "megatron_model_args", "parse_args"]

SITE = Path(__file__).with_name("site")
ARMS = SWE.arms
#: The SWE launcher's settings (``rescue.rehearsal.miles.launchers.SWE``).
SETTINGS = SWE.settings


@dataclass
class RunSpec:
    """One run of the rehearsal: an arm (with protect's a), a seed, its folder."""

    arm: str
    a: str | None
    seed: int
    folder: Path
    status: str = "not submitted"
    started: float = 0.0
    wall: float = 0.0
    ok: bool = False
    job: Job | None = None
    engine: subprocess.Popen | None = None
    meter: CpuMeter | None = None
    marks: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    lane: int = 0
    #: The life being run (2 after a kill: resumed with RESUME=1), and when the first began.
    life: int = 1
    began: float = 0.0
    save: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.arm}{f'-a{self.a}' if self.a else ''}-seed{self.seed}"

    def mark(self, what: str) -> None:
        self.marks[what] = time.time()
        (self.folder / "marks.json").write_text(json.dumps(self.marks))


def print_table(launcher: Launcher, removed: list[str], settings: dict[str, str], arm: str) -> None:
    print(f"rehearsal: {launcher.script} settings (everything else is the arm's own)")
    reasons = {name: why for name, _, why in launcher.settings_of(arm)}
    reasons.update(resume.KILL_REASONS)
    for name, value in settings.items():
        print(f"  {name}={value}  ({reasons.get(name, 'the rehearsal input')})")
    print("rehearsal: CPU-forced changes (rescue/rehearsal/miles/changes.py)")
    for change in CHANGES:
        print(f"  [{change.kind}] {change.what}\n      why: {change.reason}")
    print(f"  removed flags: {' '.join(removed) or '(none)'}")


def launcher_settings(
    args: argparse.Namespace, miles_src: Path, megatron_src: Path, out: Path,
    inputs: dict[str, Any], run: RunSpec | None = None,
) -> dict[str, str]:  # fmt: skip
    """The launcher variables of one run: the launcher's ``settings``, the arm's and the
    inputs'."""
    launcher = LAUNCHERS[args.launcher]
    arm = run.arm if run else args.arm
    a = run.a if run else args.a
    seed = run.seed if run else args.seed
    model = inputs["model"]
    megatron = inputs.get("megatron", "")
    settings = {
        name: value.format(out=out, model=model, megatron=megatron)
        for name, value, _ in launcher.settings_of(arm)
    }
    config = json.loads((Path(model) / "config.json").read_text())
    settings.update(
        ARM=arm,
        SEED=str(seed),
        OFFPOLICY=args.offpolicy,
        NUM_ROLLOUT=str(args.steps + 1),
        MILES_DIR=str(miles_src),
        MEGATRON_DIR=str(megatron_src),
        OUTPUT_DIR=str(out / "runs"),
        HF_CHECKPOINT=str(model),
        MODEL_ARGS=megatron_model_args(config),
        PROMPT_DATA=str(inputs["prompts"]),
        JOB_PYTHON=sys.executable,
        RESCUE_PY=sys.executable,
    )
    if args.launcher == "agent":
        settings.pop("OFFPOLICY")  # the text-game arms have no off-policy correction
    if inputs.get("cap_file"):
        settings["CAP_FILE"] = str(inputs["cap_file"])
    if a is not None:
        settings["A"] = a
    if args.launcher == "swe" and args.staleness is not None:
        settings["STALENESS"] = str(args.staleness)
    if args.extra_args:
        extra = settings.get("EXTRA_ARGS", "")
        settings["EXTRA_ARGS"] = f"{extra} {args.extra_args}".strip()
    if args.kill_engine_at is not None:
        settings.update(resume.ENGINE_DEATH)
    if args.kill_at is not None:  # a checkpoint at the step before the kill (and the last)
        settings["SAVE_INTERVAL"] = str(args.kill_at)
        if run is not None and run.life > 1:
            settings.update(resume.resume_env())
    return settings


def trained(folder: Path) -> int:
    """Steps a run has trained so far: weight updates after the first (which only loads
    the trainer's initial weights, or after a kill the checkpoint's), from the step the
    life resumed at."""
    updates = resume.lines(folder / "probes" / "trainer_weights.jsonl")
    kill = resume.last_kill(folder)
    if kill is None:
        return max(0, updates - 1)
    start = 0 if kill["checkpoint"] is None else kill["checkpoint"] + 1
    return start + max(0, updates - kill["probes"].get("trainer_weights.jsonl", 0) - 1)


def plan(args: argparse.Namespace, out: Path) -> list[RunSpec]:
    """Every run of the rehearsal, in order: arm by arm, seed by seed."""
    arms = [(arm, a) for arm, a in args.arm_list]
    seeds = range(1, args.seeds + 1) if args.seeds else [args.seed]
    specs = [RunSpec(arm, a, s, out) for arm, a in arms for s in seeds]
    if len(specs) > 1:
        for spec in specs:
            spec.folder = out / spec.name
    return specs


class Rehearsal:
    """The runs of one rehearsal on one Ray head (module docstring)."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.launcher = LAUNCHERS[args.launcher]
        self.miles_src = Path(args.miles_src).resolve()
        self.megatron_src = Path(args.megatron_src).resolve()
        self.runs = plan(args, out)
        self.shared: dict[str, Any] = {}
        self.started: list[subprocess.Popen] = []
        #: One Ray head per lane (``--parallel`` lanes), started for the lane's first run.
        self.dashboards: list[str] = [""] * args.parallel
        self.busy: list[bool] = [False] * args.parallel
        self.printed_table = False

    def build_inputs(self) -> None:
        a = self.args
        folder = self.out if len(self.runs) == 1 else self.out / "inputs"
        folder = Path(a.inputs).resolve() if a.inputs else folder
        folder.mkdir(parents=True, exist_ok=True)
        if a.launcher == "swe":
            self.shared = run_inputs.swe(folder, self.miles_src, a.seed, a.prompt_data)
        elif a.launcher == "rlvr":
            self.shared = run_inputs.rlvr(
                folder, self.miles_src, model=a.model, prompt_data=a.prompt_data,
                cap_file=a.cap_file,
            )  # fmt: skip
        else:
            self.shared = run_inputs.agent(
                folder, self.miles_src, model=a.model, prompt_data=a.prompt_data
            )
        print(f"rehearsal: inputs in {folder}: model {self.shared['model']}", flush=True)

    def spawn(self, cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with log.open("w") as f:
            proc = subprocess.Popen(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started.append(proc)
        return proc

    def command(self, run: RunSpec) -> tuple[dict[str, Any], str, list[str], dict[str, str]]:
        """(runtime env, entry point, flags, settings) of one run, the CPU rows applied."""
        if not run.inputs:  # a later life resumes on the first one's inputs
            run.inputs = run_inputs.for_run(self.args.launcher, run.folder, self.shared)
        inputs = run.inputs
        settings = launcher_settings(
            self.args, self.miles_src, self.megatron_src, run.folder, inputs, run
        )
        runtime, entry, flags, notes = launcher_dry_run(settings, self.launcher.script)
        if entry != self.launcher.entry:
            raise RehearsalError(
                f"{self.launcher.script} submits {entry}, not {self.launcher.entry}"
            )
        if self.args.kill_at is not None:
            resume.launch_record(
                run, runtime, flags, notes, settings["PROMPT_DATA"], self.miles_src
            )
        for name in self.args.without:
            flags = drop_option(flags, name)
        run.ports = {k: free_port() for k in ("engine", "router", "session")}
        flags, removed = cpu_flags(
            flags,
            engine_port=run.ports["engine"],
            router_port=run.ports["router"],
            session_port=run.ports["session"],
            router=self.args.router,
        )
        if not self.printed_table:
            print_table(self.launcher, removed, settings, run.arm)
            if self.args.without:
                print(f"rehearsal: removed from the launcher's command (--without): "
                      f"{' '.join(self.args.without)}")  # fmt: skip
            self.printed_table = True
        (run.folder / "command.json").write_text(
            json.dumps({"runtime_env": runtime, "flags": flags, "entry": entry}, indent=1)
        )
        return runtime, entry, flags, settings

    def kill_and_resume(self, run: RunSpec) -> None:
        """The kill of ``--kill-at`` (``rescue.rehearsal.miles.resume``), then the next life
        submitted on a new Ray head and engine."""
        entry = resume.kill(run.folder, run.save, self.args.kill_at, run.life)
        print(f"rehearsal: {run.name}: step {self.args.kill_at} in progress: "
              f"{resume.describe_kill(entry)}", flush=True)  # fmt: skip
        run.job, run.engine = None, None
        self.dashboards[run.lane] = ""  # the Ray head died with the run
        run.life += 1
        self.submit(run, run.lane)

    def env_of(self, run: RunSpec, runtime: dict[str, Any]) -> dict[str, str]:
        env_vars = dict(runtime.get("env_vars", {}))
        env_vars["PYTHONPATH"] = os.pathsep.join(
            [str(SITE), str(ROOT), str(self.miles_src), str(self.megatron_src),
             env_vars.get("PYTHONPATH", "")]
        )  # fmt: skip
        env_vars.update(
            RESCUE_REHEARSAL_DIR=str(run.folder),
            WANDB_MODE="offline",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            RAY_DEDUP_LOGS="0",
            # Ray >= 2.5x turns token authentication on for `ray start` once a token exists in
            # ~/.ray (any local ray.init() writes one); this private head on 127.0.0.1 goes
            # without
            RAY_AUTH_MODE="disabled",
        )
        inputs = run.inputs
        if "docker_root" in inputs:
            env_vars.update(
                FAKE_DOCKER_ROOT=str(inputs["docker_root"]),
                MSWEA_DOCKER_EXECUTABLE=str(inputs["shim"]),
            )
        if self.args.fault:
            env_vars[FAULT_ENV] = self.args.fault
        return env_vars

    def start_ray(self, lane: int) -> str:
        """The lane's Ray head (its own ports, two logical GPUs: a run's train actor and its
        external engine, so every run's engine is logical GPU 1, as its server info says)."""
        ray_dir = Path(f"/tmp/rrh-{os.getpid()}-{lane}")
        ports = {k: free_port() for k in ("gcs", "dashboard", "client", "agent", "metrics")}
        dashboard = f"http://127.0.0.1:{ports['dashboard']}"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT)]),
            "RESCUE_REHEARSAL_DIR": str(self.out),
            "RAY_AUTH_MODE": "disabled",
            "RAY_DEDUP_LOGS": "0",
        }
        log = self.out / ("ray.log" if lane == 0 else f"ray-{lane}.log")
        ray = self.spawn(ray_command(ports, ray_dir), log, env)
        wait_http(f"{dashboard}/api/version", 180, ray)
        print(f"rehearsal: Ray head up ({dashboard})", flush=True)
        self.dashboards[lane] = dashboard
        return dashboard

    def submit(self, run: RunSpec, lane: int) -> None:
        """Start the run's engine, check it, submit its job to the lane's Ray head."""
        run.started = time.monotonic()
        run.began = run.began or run.started
        (run.folder / "probes").mkdir(parents=True, exist_ok=True)
        run.mark("start")
        runtime, entry, flags, _ = self.command(run)
        run.mark("inputs")
        env_vars = self.env_of(run, runtime)
        env = {**os.environ, **env_vars}
        port = run.ports["engine"]
        model = run.inputs["model"]
        run.engine = self.spawn(
            engine_command(flags, port, model, run.folder, run.seed), run.folder / "engine.log",
            env,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/health", 120, run.engine)
        preflight(port, self.args.launcher)
        run.mark("engine")
        # after the lane's first pre-flight: a run that cannot start stops before Ray
        dashboard = self.dashboards[lane] or self.start_ray(lane)
        run.mark("ray")
        submission_id = f"rescue-rehearsal-{os.getpid()}-{run.name}"
        tail = self.spawn(
            [
                str(Path(sys.executable).with_name("ray")), "job", "submit",
                "--address", dashboard,
                "--submission-id", submission_id,
                "--runtime-env-json", json.dumps({**runtime, "env_vars": env_vars}), "--",
                sys.executable, str(self.miles_src / entry), *flags,
            ],
            run.folder / "job.log", env,
        )  # fmt: skip
        run.job = Job(dashboard, submission_id, tail)
        run.mark("submitted")
        run.meter = CpuMeter(run.folder)
        run.status = "running"
        run.lane = lane
        print(f"rehearsal: {run.name}: engine on :{port} passed pre-flight; submitted "
              f"{self.args.steps} steps", flush=True)  # fmt: skip

    def finish(self, run: RunSpec) -> None:
        """The run's job ended (or ran out of time): stop its processes, check it."""
        run.mark("job end")
        if run.meter is not None:
            (run.folder / "cpu.json").write_text(json.dumps(run.meter.totals()))
        if run.job is None or not run.job.ended():
            run.status = f"TIMEOUT after {self.args.timeout} s"
        else:
            run.status = run.job.outcome()
        if run.job is not None:
            run.job.keep_log(run.folder / "driver.log")
        stop_each([run.job.tail if run.job else None, run.engine])
        if run.folder != self.out:
            reap(run.folder)
        run.wall = time.monotonic() - (run.began or run.started)
        report_run(run, self.args, progress=len(self.runs) == 1)

    def run(self) -> int:
        args = self.args
        started_at = time.monotonic()
        self.build_inputs()
        queue = list(self.runs)
        active: list[RunSpec] = []
        said = time.monotonic()
        while queue or active:
            while queue and not all(self.busy):
                lane = self.busy.index(False)
                run = queue.pop(0)
                self.busy[lane] = True
                self.submit(run, lane)
                active.append(run)
            for run in list(active):
                if run.meter is not None:
                    run.meter.sample()
                if resume.kill_due(self.args, run):
                    self.kill_and_resume(run)
                    continue
                if resume.engine_death_due(self.args, run):
                    resume.kill_engine(self.args, run)
                late = time.monotonic() - run.started > args.timeout
                if run.job is not None and (run.job.ended() or late):
                    active.remove(run)
                    self.finish(run)
                    self.busy[run.lane] = False
            steps = ", ".join(f"{r.name} {trained(r.folder)}/{args.steps}" for r in active)
            done = len(self.runs) - len(queue) - len(active)
            write_progress(done, len(self.runs), "runs", f"training: {steps}" if active else "")
            if active and time.monotonic() - said >= 30:
                said = time.monotonic()
                print(f"rehearsal: {time.monotonic() - started_at:.0f} s, steps trained: {steps}",
                      flush=True)  # fmt: skip
            time.sleep(2 if active else 0)
        wall = time.monotonic() - started_at
        if len(self.runs) > 1:
            summarize(self.runs, self.out, args.launcher, wall)
        return 0 if all(r.ok for r in self.runs) else 1


def run(args: argparse.Namespace) -> int:
    final = Path(args.out).resolve()
    out = final.with_name(final.name + ".partial") if args.replace else final
    if args.replace:  # an unfinished earlier attempt, never a result: start it afresh
        shutil.rmtree(out, ignore_errors=True)
    elif out.exists() and any(out.iterdir()):
        raise RehearsalError(f"--out {out} is not empty: choose a new folder (or --replace)")
    out.mkdir(parents=True, exist_ok=True)
    rehearsal = Rehearsal(args, out)
    with processes(
        out, [Path(f"/tmp/rrh-{os.getpid()}-{k}") for k in range(args.parallel)]
    ) as started:
        rehearsal.started = started
        code = rehearsal.run()
    if args.replace:
        if code != 0:
            print(f"rehearsal: failed: its folder {out} is kept; {final} is unchanged")
            return code
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        out.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        print(f"rehearsal: every run passed: {final}")
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The rehearsal's flags, checked (``rescue.rehearsal.miles.options``); --help prints
    this module's docstring."""
    return options.parse(argv, __doc__)


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
