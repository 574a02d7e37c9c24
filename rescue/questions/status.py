"""``rescue status RUN_DIR``: the stages of a question's run folder and the running one's bar;
or, given an arm's run (its ``SAVE_DIR``, the run folder above it, or a rehearsal's folder),
its lives: when it was launched and resumed, from which step, how many groups each restart
lost (the run's record and ledger, ``swe_smith_tasks.run_record``, ``rescue.restart``).

Reads only the run folder: ``stages.json`` (``rescue.stages``) and the stages' progress
files (``{"done", "total", "unit", "detail"}``, written by their commands through
``rescue.stages.write_progress``). One line per stage (status, job, start and end, the
log of a failed one, the signal that interrupted one); under the running stage a tqdm
progress bar (``tqdm.format_meter``: done / total units, the time since the stage
started, the rate and what is left) and the detail line (e.g. arms x seeds done, steps per
run); under an interrupted or failed stage how far it got. Without tqdm installed the bar is a plain ``done/total unit``. The
exit status is 0, or 1 when a stage failed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rescue import restart
from rescue.errors import InputError
from rescue.stages import STATE_FILE, read_state

#: An arm run's record beside its checkpoints (``swe_smith_tasks.run_record.RECORD``).
RECORD = "rescue-run.json"

MARK = {
    "done": "done       ",
    "running": "running    ",
    "failed": "FAILED     ",
    "pending": "pending    ",
    "interrupted": "INTERRUPTED",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder of make q1, q2 or q3")


def _elapsed(started: str | None) -> float:
    if not started:
        return 0.0
    try:
        t0 = time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S%z"))
    except ValueError:
        return 0.0
    return max(time.time() - t0, 0.0)


def progress_line(progress: dict[str, Any], started: str | None, width: int = 80) -> str:
    """The bar of a running stage from its progress record."""
    done, total = int(progress.get("done", 0)), int(progress.get("total", 0))
    unit = str(progress.get("unit", "it"))
    try:
        from tqdm import tqdm
    except ImportError:
        return f"{done}/{total} {unit}"
    return tqdm.format_meter(done, total or None, _elapsed(started), ncols=width, unit=unit)


def render(run_dir: str | Path) -> tuple[str, int]:
    """The status text of a run folder and its exit status (1 when a stage failed)."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        parent = run_dir.parent
        raise InputError(
            f"RUN_DIR {run_dir} is a file: give the run folder"
            + (f", {parent}" if run_dir.name in (STATE_FILE, RECORD) else "")
        )
    if not (run_dir / STATE_FILE).exists() and (save := arm_save_dir(run_dir)) is not None:
        return "\n".join(arm_status(save)), 0
    state = read_state(run_dir)
    lines = [f"{state.get('question') or 'run'} in {run_dir}"]
    settings = state.get("settings") or {}
    if settings:
        lines.append("  settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))
    failed = False
    n = len(state["stages"])
    for i, r in enumerate(state["stages"]):
        status = r.get("status", "pending")
        when = ""
        if r.get("started"):
            when = f"  {r['started']}" + (f" -> {r['ended']}" if r.get("ended") else "")
        lines.append(
            f"  [{i + 1}/{n}] {MARK.get(status, status)} {r['name']:<10} {r.get('job', '')}{when}"
        )
        if r.get("note"):
            lines.append(f"        note: {r['note']}")
        if status == "failed":
            failed = True
            lines.append(f"        exit {r.get('exit_code')}; log {r.get('log')}")
        if status == "interrupted":
            lines.append(
                f"        interrupted by {r.get('signal') or 'a signal'}; log {r.get('log')}"
            )
        progress = _read_progress(run_dir, r.get("progress", ""))
        if status == "running":
            if progress is None:
                lines.append(f"        (no progress reported yet; log {r.get('log')})")
            else:
                lines.append("        " + progress_line(progress, r.get("started")))
        elif progress is not None and status in ("interrupted", "failed"):
            lines.append(
                f"        stopped at {int(progress.get('done', 0))}/"
                f"{int(progress.get('total', 0))} {progress.get('unit', '')}".rstrip()
            )
        if progress and status in ("running", "interrupted", "failed") and progress.get("detail"):
            lines.append(f"        {progress['detail']}")
    return "\n".join(lines), int(failed)


def arm_save_dir(folder: Path) -> Path | None:
    """The save directory of an arm's run given it, the run folder above it
    (``OUTPUT_DIR/RUN_NAME``) or a rehearsal's folder (``runs/<name>/checkpoints``)."""
    for candidate in (folder, folder / "checkpoints", *sorted(folder.glob("runs/*/checkpoints"))):
        if (candidate / RECORD).is_file() or (candidate / restart.LEDGER).is_file():
            return candidate
    return None


def arm_status(save: Path) -> list[str]:
    """The lines of an arm run's status: its launches (the record) and lives (the ledger)."""
    try:
        record = json.loads((save / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        record = {}
    ledger = restart.read(save / restart.LEDGER)
    lines = [f"arm run in {save}" + (f" (wandb run {record['wandb_run_id']})"
                                      if record.get("wandb_run_id") else "")]  # fmt: skip
    launches = record.get("launches") or []
    if launches:
        said = ", ".join(f"{x.get('time')}{' (RESUME=1)' if x.get('resume') else ''}"
                         for x in launches)  # fmt: skip
        resumed = sum(bool(x.get("resume")) for x in launches)
        lines.append(f"  launched {said}: " + (f"resumed {resumed} times" if resumed else
                                                 "never resumed"))  # fmt: skip
    lines += [f"  {line}" for line in restart.lives_of(ledger)]
    rows = restart.joined(ledger)
    if rows:
        lines.append(f"  last census: step {rows[-1].rollout} (life {rows[-1].life}), "
                     f"{rows[-1].final} groups settled for good, {rows[-1].open} buffered")  # fmt: skip
    tracker = save / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        lines.append(f"  latest checkpoint: step {tracker.read_text().strip()}")
    if not ledger.lives:
        lines.append("  no ledger of its lives (rescue-ledger.jsonl): a run before it was kept")
    return lines


def _read_progress(run_dir: Path, path: str) -> dict[str, Any] | None:
    if not path:
        return None
    p = Path(path)
    for candidate in (p, Path.cwd() / p, run_dir / p.name):
        try:
            return json.loads(candidate.read_text())
        except (FileNotFoundError, json.JSONDecodeError, IsADirectoryError):
            continue
    return None


def main(args: argparse.Namespace) -> int:
    text, code = render(args.run_dir)
    print(text)
    return code
