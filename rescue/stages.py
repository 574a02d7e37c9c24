"""A question as an ordered list of stages, resumable from its run folder (stdlib only).

A stage is a command (an argv list run as a subprocess from the repository root) with
declared inputs and outputs (paths). ``Runner.run`` runs the stages in order and records
each one in ``RUN_DIR/stages.json``: its command, its inputs with their fingerprints, its
outputs, its status (``pending``, ``running``, ``done``, ``failed``), start and end time,
exit code, and the path of its log (``RUN_DIR/logs/<stage>.log``, the command's stdout and
stderr).

Invariants:

- ``stages.json`` is written atomically (a temporary file renamed over it), so a run killed
  at any moment leaves the previous record or the new one, never half of one.
- A stage is skipped only when its record says ``done``, its command and the fingerprints
  of its inputs are the ones recorded, and every declared output exists. Anything else
  (a change of input or setting, a missing output, ``failed``, or ``running`` left by a
  run that was killed) runs it again; a later stage reruns when what it reads changed,
  so each stage declares as inputs the outputs of the stages it reads.
- A stage that exits non-zero, or exits 0 without writing a declared output, is
  ``failed``: the runner prints the stage, its job and the path of its log, with the log's
  last lines, and returns exit status 1; nothing after it runs, and a later stage done
  before is ``pending`` again (it is run again once the failed stage succeeds).
- A stage's ``progress`` (optional) names a file the stage's command updates (JSON
  ``{"done", "total", "unit", "detail"}``; the command finds its path in the environment
  variable ``RESCUE_STAGE_PROGRESS``); ``rescue status`` reads it for the running stage's
  bar, and for an interrupted stage how far it got.
- SIGINT or SIGTERM while a stage runs ends the stage's whole process tree
  (``rescue.interrupts``), records the stage ``interrupted`` (with its end time and the
  signal), prints one line, and returns 128 + the signal's number; the next run restarts
  the stage.
- A stage's ``stdout`` file is written beside it and renamed over it only when the command
  succeeded: a failed or interrupted stage leaves the previous file as it was. Each
  command a stage runs keeps its own output folder the same way (``rescue.output``).

Fingerprint of an input: for a file its size and SHA-256; for a folder the same of every
file under it (sorted relative paths); for a missing path ``missing``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rescue import interrupts
from rescue.errors import InputError
from rescue.output import remove_stale

STATE_FILE = "stages.json"
STATUSES = ("pending", "running", "done", "failed", "interrupted")
TAIL_LINES = 20


@dataclass(frozen=True)
class Stage:
    """One step of a question. ``job`` names what runs (e.g. ``make rlvr-sweep``) in
    messages; ``note`` is said when the stage starts and kept in its record (e.g. that the
    stage is simulated in a rehearsal); ``env`` is added to the command's environment;
    ``stdout``, when set, is the file the command's standard output goes to (e.g. a
    ``--json`` report), its standard error still to the log."""

    name: str
    command: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    job: str = ""
    note: str = ""
    progress: str = ""
    stdout: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise InputError(f"stage name {self.name!r}: allowed a plain file name")
        if not self.command:
            raise InputError(f"stage {self.name}: an empty command")


def fingerprint(path: str | os.PathLike[str]) -> str:
    """Size and SHA-256 of a file, of every file under a folder, or ``missing``."""
    p = Path(path)
    if not p.exists():
        return "missing"
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        h.update(str(f.relative_to(p) if f != p else "").encode() + b"\0")
        h.update(str(f.stat().st_size).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_state(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run folder's record, ``{"question", "stages": [...]}``; an error naming the file
    when it is missing or not a record of stages."""
    path = Path(run_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such file: RUN_DIR must be a run folder of make q1/q2/q3 (or an "
            "arm's SAVE_DIR, for its lives)"
        ) from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("stages"), list):
        raise InputError(f"{path}: not a record of stages (no 'stages' list)")
    return state


def write_state(run_dir: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``stages.json`` atomically (temporary file, fsync, rename)."""
    path = Path(run_dir) / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Runner:
    """Runs ``stages`` in order in ``run_dir`` (see the module docstring).

    ``cwd`` is where commands run (default: the current folder); ``out`` receives the
    runner's own lines (default stdout)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        stages: Sequence[Stage],
        *,
        question: str = "",
        settings: dict[str, Any] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        out: TextIO | None = None,
    ) -> None:
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise InputError(f"stage names must be unique: {names}")
        self.run_dir = Path(run_dir)
        self.stages = list(stages)
        self.question = question
        self.settings = dict(settings or {})
        self.cwd = Path(cwd) if cwd else Path.cwd()
        self.out = out or sys.stdout

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _initial_state(self) -> dict[str, Any]:
        old: dict[str, dict[str, Any]] = {}
        if (self.run_dir / STATE_FILE).exists():
            prior = read_state(self.run_dir)
            if prior.get("question") not in (None, "", self.question):
                raise InputError(
                    f"{self.run_dir}: a run folder of {prior['question']}, not {self.question}: "
                    "choose another RUN_DIR"
                )
            old = {r["name"]: r for r in prior["stages"]}
        records = []
        for s in self.stages:
            prev = old.get(s.name, {})
            records.append(
                {
                    "name": s.name,
                    "job": s.job,
                    "note": s.note,
                    "command": list(s.command),
                    "inputs": prev.get("inputs", {}),
                    "outputs": list(s.outputs),
                    "progress": s.progress,
                    "status": prev.get("status", "pending"),
                    "started": prev.get("started"),
                    "ended": prev.get("ended"),
                    "exit_code": prev.get("exit_code"),
                    "signal": prev.get("signal"),
                    "log": str(self.run_dir / "logs" / f"{s.name}.log"),
                    "recorded_command": prev.get("command"),
                }
            )
        return {"question": self.question, "settings": self.settings, "stages": records}

    def _is_current(self, stage: Stage, record: dict[str, Any]) -> bool:
        if record["status"] != "done" or record.get("recorded_command") != list(stage.command):
            return False
        if record["inputs"] != {p: fingerprint(self._path(p)) for p in stage.inputs}:
            return False
        return all(self._path(p).exists() for p in stage.outputs)

    def _path(self, p: str) -> Path:
        path = Path(p)
        return path if path.is_absolute() else self.cwd / path

    def run(self) -> int:
        """Run what is not done; 0 when every stage is done, 1 at the first failure."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        state = self._initial_state()
        for i, stage in enumerate(self.stages):
            record = state["stages"][i]
            tag = f"[{i + 1}/{len(self.stages)}] {stage.name}"
            if self._is_current(stage, record):
                self._say(f"{tag}: done, inputs unchanged: skipped")
                continue
            if record["status"] == "running":
                self._say(f"{tag}: the last run stopped during this stage: restarting it")
            elif record["status"] == "interrupted":
                self._say(f"{tag}: interrupted last time: restarting it")
            elif record["status"] == "failed":
                self._say(f"{tag}: failed last time: restarting it")
            try:
                with interrupts.handled():
                    code = self._run_stage(stage, record, state, tag)
            except KeyboardInterrupt as e:
                # the handler ended the stage's process tree before raising
                interrupts.end_tree(interrupts.descendants())
                name = interrupts.signal_name(e)
                record.update(status="interrupted", ended=_now(), exit_code=None, signal=name)
                write_state(self.run_dir, state)
                self._say(
                    f"{tag}: interrupted by {name}; recorded in {self.run_dir / STATE_FILE}; "
                    "the same command resumes here"
                )
                return interrupts.exit_status(e)
            if code != 0:
                # what came after was built on the failed stage's inputs: not done any more
                for later in state["stages"][i + 1 :]:
                    if later["status"] == "done":
                        later["status"] = "pending"
                write_state(self.run_dir, state)
                return code
        self._say(f"{self.question or 'run'}: every stage done ({self.run_dir})")
        return 0

    def _run_stage(
        self, stage: Stage, record: dict[str, Any], state: dict[str, Any], tag: str
    ) -> int:
        record.update(
            status="running",
            started=_now(),
            ended=None,
            exit_code=None,
            signal=None,
            inputs={p: fingerprint(self._path(p)) for p in stage.inputs},
            recorded_command=list(stage.command),
        )
        write_state(self.run_dir, state)
        if stage.note:
            self._say(f"{tag}: NOTE: {stage.note}")
        self._say(f"{tag}: {stage.job or stage.command[0]} (log: {record['log']})")
        env = {**os.environ, **stage.env}
        if stage.progress:
            env["RESCUE_STAGE_PROGRESS"] = str(self._path(stage.progress))
        stdout = self._path(stage.stdout) if stage.stdout else None
        partial = stdout.with_name(f".{stdout.name}.partial-{os.getpid()}") if stdout else None
        if stdout is not None:
            remove_stale(stdout)  # what a killed run left beside it
        with open(record["log"], "w") as log:
            log.write(f"$ {' '.join(stage.command)}\n")
            log.flush()
            target = None
            if partial is not None:
                partial.parent.mkdir(parents=True, exist_ok=True)
                target = open(partial, "w")  # noqa: SIM115
            code: int | None = None
            try:
                code = subprocess.call(
                    list(stage.command),
                    cwd=self.cwd,
                    stdout=target or log,
                    stderr=log if target else subprocess.STDOUT,
                    env=env,
                )
            except OSError as e:
                log.write(f"cannot start the command: {e}\n")
                code = 127
            finally:
                if target:
                    target.close()
                if partial is not None and stdout is not None:
                    if code == 0:
                        os.replace(partial, stdout)
                    else:
                        partial.unlink(missing_ok=True)
        # an output is missing only when the command said it succeeded
        missing = [p for p in stage.outputs if not self._path(p).exists()] if code == 0 else []
        if missing:
            with open(record["log"], "a") as log:
                log.write(f"the stage exited 0 without writing {', '.join(missing)}\n")
            code = 1
        record.update(status="done" if code == 0 else "failed", ended=_now(), exit_code=code)
        write_state(self.run_dir, state)
        if code == 0:
            self._say(f"{tag}: done")
            return 0
        why = f"exit {code}" + (f", missing {', '.join(missing)}" if missing else "")
        self._say(
            f"{tag}: FAILED ({why}): job {stage.job or stage.command[0]}; log {record['log']}"
        )
        tail = Path(record["log"]).read_text(errors="replace").splitlines()[-TAIL_LINES:]
        for line in tail:
            self._say(f"    {line}")
        return 1


def write_progress(done: int, total: int, unit: str, detail: str = "") -> None:
    """For a stage's command: write its progress where ``RESCUE_STAGE_PROGRESS`` says
    (atomically; nothing when the variable is unset, i.e. outside a runner)."""
    path = os.environ.get("RESCUE_STAGE_PROGRESS")
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"done": done, "total": total, "unit": unit, "detail": detail}))
    os.replace(tmp, target)
