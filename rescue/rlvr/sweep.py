"""Watch a sweep's Ray jobs until every run has ended: progress, failures with their logs.

Specification
-------------
The plan (``launch/rlvr_sweep.sh`` writes it) is a JSONL file, one line per run:
``{"run": name, "submission_id": id, "log": path, "submitted": bool, "error": text}``.
A run whose ``ray job submit`` failed has ``submitted: false`` and the submit command's
output in ``error`` (the launcher also wrote it to ``log``); it is *failed* from the start.

Every ``poll_s`` seconds each run that has not ended is asked ``ray job status --address A
ID``; the answer is read as the Ray CLI prints it (``ray.dashboard.modules.job.cli``):
``Status for job 'ID': PENDING|RUNNING``, ``Job 'ID' succeeded``, ``Job 'ID' failed`` (then
``Status message: ...``), ``Job 'ID' was stopped``. A run is

- *queued* while Ray holds it ``PENDING`` (waiting for a free run slot, i.e. GPU),
- *running* while ``RUNNING``,
- *done* once ``SUCCEEDED``,
- *failed* once ``FAILED`` or ``STOPPED`` (or its submission failed): its driver log is
  fetched with ``ray job logs`` into its ``log`` path and the failure is printed with
  that path and Ray's status message,
- *lost* when ``ray job status`` has failed ``lost_after`` polls in a row (Ray down, or a
  job Ray does not know): reported with the last error and how to look again.

A line of counts is printed whenever a run changes state, and one line per run as it
changes. No run is ever dropped from the counts. With ``progress`` (default; ``--no-progress``
turns it off), a progress bar on stderr (``rescue.progress``) counts the runs that have
ended, with the counts beside it; the lines above are printed above the bar. The return value is 0 when every run is
done, 1 otherwise (failed or lost runs are listed again at the end).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rescue.errors import InputError
from rescue.progress import advance_to, progress_bar
from rescue.stages import write_progress

QUEUED, RUNNING, DONE, FAILED, LOST = "queued", "running", "done", "failed", "lost"
STATES = (QUEUED, RUNNING, DONE, FAILED, LOST)
ENDED = frozenset({DONE, FAILED, LOST})

_STATUS = re.compile(r"Status for job '[^']*': (\w+)")
_MESSAGE = re.compile(r"Status message: (.*)")


@dataclass
class Run:
    """One (arm, seed) run of the sweep and what is known of it."""

    run: str
    submission_id: str
    log: str
    state: str = QUEUED
    message: str = ""
    silent: int = 0
    history: list[str] = field(default_factory=list)


def read_plan(path: str | Path) -> list[Run]:
    """The runs of a plan file (module docstring); a malformed line is an ``InputError``."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--plan {str(p)!r} does not exist")
    runs = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            run = Run(str(row["run"]), str(row["submission_id"]), str(row["log"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(
                f"--plan {p} line {lineno}: expected an object with run, submission_id, log "
                f"and submitted ({type(e).__name__}: {e})"
            ) from None
        if not row.get("submitted", False):
            run.state = FAILED
            run.message = f"ray job submit failed: {str(row.get('error', '')).strip()}"
        runs.append(run)
    if not runs:
        raise InputError(f"--plan {p}: no runs")
    return runs


def parse_status(output: str) -> tuple[str | None, str]:
    """``(state, status message)`` from what ``ray job status`` printed; state ``None``
    when the text says none of Ray's statuses."""
    m = _MESSAGE.search(output)
    message = m.group(1).strip() if m else ""
    if re.search(r"Job '[^']*' succeeded", output):
        return DONE, message
    if re.search(r"Job '[^']*' failed", output):
        return FAILED, message
    if re.search(r"Job '[^']*' was stopped", output):
        return FAILED, message or "stopped"
    m = _STATUS.search(output)
    if m:
        status = m.group(1).upper()
        if status == "PENDING":
            return QUEUED, message
        if status == "RUNNING":
            return RUNNING, message
        if status == "SUCCEEDED":
            return DONE, message
        if status in ("FAILED", "STOPPED"):
            return FAILED, message or status.lower()
    return None, message


Runner = Callable[[list[str]], tuple[int, str]]


def run_command(argv: list[str]) -> tuple[int, str]:
    """Run ``argv``; its exit status and stdout+stderr (a missing program is status 127)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except FileNotFoundError as e:
        return 127, str(e)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within 300 s"
    return p.returncode, (p.stdout or "") + (p.stderr or "")


def counts(runs: list[Run]) -> str:
    """``18 runs: 10 queued, 8 running, 0 done, 0 failed`` (and lost, when any)."""
    n = {s: sum(r.state == s for r in runs) for s in STATES}
    text = f"{len(runs)} runs: " + ", ".join(f"{n[s]} {s}" for s in STATES if s != LOST)
    return text + (f", {n[LOST]} lost" if n[LOST] else "")


class Watcher:
    """Polls Ray for every run of a plan (module docstring)."""

    def __init__(
        self,
        runs: list[Run],
        *,
        address: str,
        ray: str = "ray",
        poll_s: float = 60.0,
        lost_after: int = 10,
        runner: Runner = run_command,
        out: TextIO | None = None,
        sleep: Callable[[float], None] | None = None,
        prog: str = "rlvr-sweep",
        progress: bool = True,
    ) -> None:
        if poll_s < 0:
            raise InputError(f"--poll-s {poll_s}: allowed a number >= 0")
        if lost_after < 1:
            raise InputError(f"--lost-after {lost_after}: allowed an integer >= 1")
        self.runs = runs
        self.address = address
        self.ray = ray
        self.poll_s = poll_s
        self.lost_after = lost_after
        self.runner = runner
        self.out = out
        self.sleep = sleep if sleep is not None else lambda s: time.sleep(s)
        self.prog = prog
        self.progress = progress
        self.bar = None  # the progress bar while ``watch`` runs

    def say(self, text: str) -> None:
        from tqdm import tqdm

        # tqdm.write clears the bar, prints the line and redraws the bar below it.
        tqdm.write(f"{self.prog}: {text}", file=self.out or sys.stdout)
        (self.out or sys.stdout).flush()

    def _show(self) -> None:
        ended = sum(r.state in ENDED for r in self.runs)
        write_progress(ended, len(self.runs), "runs", counts(self.runs))  # `rescue status`
        if self.bar is not None:
            self.bar.set_postfix_str(counts(self.runs), refresh=False)
            advance_to(self.bar, sum(r.state in ENDED for r in self.runs))
            self.bar.refresh()

    def fetch_log(self, run: Run) -> None:
        """Write the driver log of a failed run to its log path (Ray's answer, whatever it is)."""
        code, text = self.runner(
            [self.ray, "job", "logs", "--address", self.address, run.submission_id]
        )
        path = Path(run.log)
        path.parent.mkdir(parents=True, exist_ok=True)
        if code != 0:
            text = f"(ray job logs exited {code})\n{text}"
        with path.open("a") as f:
            f.write(text)

    def poll(self, run: Run) -> bool:
        """Ask Ray about one run; True when its state changed."""
        code, text = self.runner(
            [self.ray, "job", "status", "--address", self.address, run.submission_id]
        )
        state, message = parse_status(text) if code == 0 else (None, "")
        if state is None:
            run.silent += 1
            last = text.strip().splitlines()[-1] if text.strip() else f"exit {code}"
            if run.silent < self.lost_after:
                return False
            state, message = LOST, f"ray job status failed {run.silent} times in a row: {last}"
        else:
            run.silent = 0
        if state == run.state:
            return False
        run.state, run.message = state, message
        run.history.append(state)
        if state == FAILED:
            self.fetch_log(run)
        self.report(run)
        return True

    def report(self, run: Run) -> None:
        if run.state == FAILED:
            why = f" ({run.message})" if run.message else ""
            self.say(f"FAILED {run.run}: log {run.log}{why}")
        elif run.state == LOST:
            self.say(
                f"LOST {run.run}: {run.message}; look again with: ray job status "
                f"--address {self.address} {run.submission_id}"
            )
        else:
            self.say(f"{run.state} {run.run}")

    def watch(self) -> int:
        """Poll until every run has ended; 0 when all are done, else 1."""
        self.bar = progress_bar(len(self.runs), unit="runs", desc="sweep", enabled=self.progress)
        try:
            self._watch()
        finally:
            self.bar.close()
            self.bar = None
        return self._verdict()

    def _watch(self) -> None:
        for run in self.runs:
            if run.state == FAILED:
                self.report(run)
        self.say(counts(self.runs))
        self._show()
        while True:
            changed = False
            for run in self.runs:
                if run.state not in ENDED:
                    changed |= self.poll(run)
            if changed:
                self.say(counts(self.runs))
                self._show()
            if all(r.state in ENDED for r in self.runs):
                break
            self.sleep(self.poll_s)

    def _verdict(self) -> int:
        bad = [r for r in self.runs if r.state != DONE]
        if bad:
            self.say(f"{len(bad)} of {len(self.runs)} runs did not succeed:")
            for r in bad:
                self.say(
                    f"  {r.state} {r.run}: log {r.log}" + (f" ({r.message})" if r.message else "")
                )
            return 1
        self.say(f"all {len(self.runs)} runs succeeded")
        return 0
