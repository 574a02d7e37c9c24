"""Kill and resume: a run killed hard mid-step after a checkpoint, resumed through the
launcher's ``RESUME=1`` path from Miles' checkpoint (``--kill-at STEP``).

The driver (``rescue.rehearsal.miles.run``) calls, in order:

1. ``record_launch`` when it submits the first life: the run's record beside its
   checkpoints, written as a launch that is not a dry run writes it
   (``swe_smith_tasks.run_record``: the launcher's flags, the job's environment, the prompt
   data), so that the second life's dry run with ``RESUME=1`` compares against it (and the
   resumed launch is then noted in it, as the launcher notes it);
2. ``due(run, step)`` on every poll: the kill is due once Miles' checkpoint of some step N
   exists, the trainer has sent the engine the weights after N (version N + 2), and the
   rollout of ``step`` has been converted to train data (its census and metrics logged;
   its step not yet trained through): a step in progress, groups buffered and in flight;
3. ``kill(run)``: SIGKILL of every process of the run (the Ray head, the job's driver and
   actors with the agents and their sandboxes, the router, the session server, wandb, the
   stand-in engine), found by the run folder in their environment, no clean-up; then each
   probe file cut to its last whole line (a write the kill cut short) and its line count
   kept in ``lives.json`` (where the next life's rows begin), the first life's logs moved
   to ``life1/``;
4. the second life is submitted as the first was, with ``RESUME=1`` (the launcher's dry run
   must say it resumes the run in its save directory) on a new Ray head and a new engine.

``lives.json``: ``{"kill_at": STEP, "kills": [{"life": 1, "time": T, "checkpoint": N,
"probes": {"census.jsonl": lines, ...}}]}``.

An engine's death (``--kill-engine-at STEP``): ``engine_death_due`` says when step STEP's
rollout is being generated (step 0: Miles' first weight update on the engine and
``ENGINE_TURNS`` chat turns since; a later step: the rollout before it just handed to the
trainer), ``kill_engine`` makes the stand-in engine die as SGLang dies (SIGUSR1,
``rescue.rehearsal.standins.engine``), for good; the run's settings (``ENGINE_DEATH``) let the
watchdog judge the rehearsal's few groups and a trial give up on a dead endpoint in 20 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from rescue.rehearsal.miles.command import RehearsalError, option_values
from rescue.rehearsal.verdict.processes import reap, survivors

#: Why a kill-and-resume rehearsal (``--kill-at``) and an engine death (``--kill-engine-at``)
#: set what they set.
KILL_REASONS = {
    "SAVE_INTERVAL": "--kill-at STEP: a checkpoint every STEP steps, so one at the step "
    "before the kill (and at the last)",
    "RESUME": "--kill-at: the life after the kill resumes the run through the launcher's path",
    "WATCHDOG_WINDOW": "--kill-engine-at: the watchdog judges the last 4 groups (the "
    "rehearsal's four in flight), not a cluster's 64",
    "AGENT_ENV": "--kill-engine-at: a trial waits 20 s for a dead endpoint (the cluster "
    "default, 1800 s, would outlast the rehearsal)",
}
#: Chat turns the engine serves (the pre-flight's among them) before it dies at step 0.
ENGINE_TURNS = 8
#: The settings of an engine-death rehearsal (``--kill-engine-at``).
ENGINE_DEATH = {"WATCHDOG_WINDOW": "4", "AGENT_ENV": "RESCUE_SWE_ENDPOINT_PATIENCE=20"}

#: The rehearsal's file of a killed run's lives (module docstring).
LIVES = "lives.json"
#: Logs of a life, moved to ``life<N>/`` when it is killed.
LIFE_LOGS = ("job.log", "driver.log", "engine.log", "ray.log", "marks.json", "cpu.json",
             "command.json")  # fmt: skip


def save_dir(flags: list[str]) -> Path:
    """The run's save directory: the launcher's ``--save``."""
    values = option_values(flags, "--save")
    if not values:
        raise RehearsalError("the launcher's command has no --save: nothing to resume from")
    return Path(values[0])


def record_launch(
    flags: list[str], runtime: dict[str, Any], data: str, miles_src: Path, *, resume: bool = False
) -> str:
    """Write the run's record as a launch that is not a dry run does (a new run's, or a
    resumed launch noted in it); its one line."""
    from swe_smith_tasks.run_record import check_save_dir, miles_commit, record

    env = runtime.get("env_vars", {})
    new = record(flags, env, data, commit=miles_commit(miles_src))
    return check_save_dir(save_dir(flags), new, resume=resume)


def checkpoint_step(folder: Path) -> int | None:
    """The step of Miles' latest checkpoint in the save directory (None: none yet)."""
    tracker = folder / "latest_checkpointed_iteration.txt"
    text = tracker.read_text().strip() if tracker.is_file() else ""
    return int(text) if text.isdigit() else None


def lines(path: Path) -> int:
    """The lines of a probe file (0 when there is none)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def due(folder: Path, save: Path, step: int) -> bool:
    """Whether the kill of the first life is due (module docstring)."""
    n = checkpoint_step(save)
    if n is None:
        return False
    probes = folder / "probes"
    converted = lines(probes / "train_data.jsonl")
    return converted >= step + 1 and lines(probes / "trainer_weights.jsonl") >= n + 2


def cut_torn_line(path: Path) -> None:
    """Cut a file to its last whole line (a write the kill cut short)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def kill(folder: Path, save: Path, step: int, life: int) -> dict[str, Any]:
    """SIGKILL every process of the run in ``folder`` (module docstring), keep where the
    probes of the next life begin and the checkpoint it resumes from (in ``save``); returns
    the kill's record."""
    killed = reap(folder)
    deadline = time.monotonic() + 60
    while survivors(folder) and time.monotonic() < deadline:
        reap(folder)
        time.sleep(1)
    left = survivors(folder)
    if left:
        raise RehearsalError(f"processes of the run outlived SIGKILL: {[p.pid for p in left]}")
    probes = folder / "probes"
    counts = {}
    for path in sorted(probes.glob("*.jsonl")):
        cut_torn_line(path)
        counts[path.name] = lines(path)
    old = folder / f"life{life}"
    old.mkdir(exist_ok=True)
    for name in LIFE_LOGS:
        if (folder / name).exists():
            shutil.move(str(folder / name), str(old / name))
    lives_file = folder / LIVES
    lives = json.loads(lives_file.read_text()) if lives_file.exists() else {"kills": []}
    entry = {"life": life, "time": time.time(), "processes": killed,
             "checkpoint": checkpoint_step(save), "probes": counts}  # fmt: skip
    lives["kill_at"] = step
    lives["kills"].append(entry)
    lives_file.write_text(json.dumps(lives, indent=1))
    return entry


def last_kill(folder: Path) -> dict[str, Any] | None:
    """The record of the run's last kill (None: never killed)."""
    path = folder / LIVES
    kills = json.loads(path.read_text()).get("kills") if path.exists() else None
    return kills[-1] if kills else None


def describe_kill(entry: dict[str, Any]) -> str:
    """One line: what the kill did and where the next life resumes."""
    return (
        f"life {entry['life']} killed (SIGKILL of its {entry['processes']} processes, "
        f"no clean-up) after the checkpoint of step {entry['checkpoint']}; resuming with "
        "RESUME=1"
    )


def resume_env() -> dict[str, str]:
    """The launcher settings of a life after a kill."""
    return {"RESUME": "1"}


def launch_record(
    run: Any, runtime: dict[str, Any], flags: list[str], notes: list[str], data: str,
    miles_src: Path,
) -> None:  # fmt: skip
    """The first life writes the run's record as a launch does; a later life's dry run
    (``RESUME=1``) must have compared itself with it and said it resumes."""
    run.save = save_dir(flags)
    if run.life == 1:
        line = record_launch(flags, runtime, data, miles_src)
        print(f"rehearsal: {run.name}: {line}", flush=True)
        return
    said = next((n for n in notes if n.startswith("resuming the run in")), None)
    if said is None:
        raise RehearsalError(
            f"life {run.life}: the launcher's RESUME=1 dry run did not say it resumes the "
            f"run in {run.save} (notes: {'; '.join(notes) or 'none'})"
        )
    record_launch(flags, runtime, data, miles_src, resume=True)  # the launch, in the record
    print(f"rehearsal: {run.name}: life {run.life}: the launcher: {said}", flush=True)


def kill_due(args: Any, run: Any) -> bool:
    """Whether ``--kill-at`` kills the first life of ``run`` now (``due``)."""
    if args.kill_at is None or run.life > 1 or run.save is None or run.job is None:
        return False
    if run.job.ended():
        raise RehearsalError(
            f"{run.name}: the job ended ({run.job.outcome()}) before step {args.kill_at} was "
            "in progress after a checkpoint: nothing to kill"
        )
    return due(run.folder, run.save, args.kill_at)


def engine_death_due(args: Any, run: Any) -> bool:
    """Whether ``--kill-engine-at`` kills the engine now: step STEP's rollout is being
    generated, its groups' trials in flight: for step 0, Miles' first weight update is
    on the engine and it has served ``ENGINE_TURNS`` turns since; for a later step, the
    rollout before it has just been handed to the trainer."""
    step = args.kill_engine_at
    if step is None or run.engine is None or run.engine.poll() is not None:
        return False
    probes = run.folder / "probes"
    if step == 0:
        return (
            lines(probes / "trainer_weights.jsonl") >= 1
            and lines(probes / "engine.jsonl") >= ENGINE_TURNS
        )
    return lines(probes / "train_data.jsonl") >= step


def kill_engine(args: Any, run: Any) -> None:
    """The engine dies as SGLang dies (``rescue.rehearsal.standins.engine``: SIGUSR1), for good."""
    os.kill(run.engine.pid, signal.SIGUSR1)
    run.engine.wait(30)
    run.mark("engine died")
    print(f"rehearsal: {run.name}: the engine died while step {args.kill_engine_at}'s rollout "
          f"was generated (exit {run.engine.returncode}: connections reset, no reply, not "
          "restarted); the watchdog must stop the run", flush=True)  # fmt: skip
