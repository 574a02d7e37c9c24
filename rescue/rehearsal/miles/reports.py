"""What a rehearsal prints and writes once its runs end: each run's checks and profile
(``rescue.rehearsal.verdict.report``, ``rescue.rehearsal.verdict.profile``) in its
``report.json``, and with several runs the ``summary.json`` that lists them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rescue.rehearsal.miles.checkpoint import check_and_export

if TYPE_CHECKING:
    from rescue.rehearsal.miles.run import RunSpec


def report_run(run: RunSpec, args: argparse.Namespace, progress: bool) -> None:
    """Check a run whose job ended, print its profile and report, write ``report.json``;
    ``run.ok`` is whether every check holds."""
    from rescue.rehearsal.verdict.profile import profile, render
    from rescue.rehearsal.verdict.report import check_run

    report = check_run(
        run.folder,
        launcher=args.launcher,
        arm=run.arm,
        a=float(run.a) if run.a else None,
        offpolicy=args.offpolicy,
        job_status=run.status,
        steps_checked=args.steps,
        model=run.inputs.get("model") if args.launcher != "swe" else None,
        checkpoint=lambda f: check_and_export(run.folder, run.inputs["model"], f.trainer_weights),
        progress=progress,
        reference=Path(args.reference) if getattr(args, "reference", None) else None,
    )
    report.facts["profile"] = profile(run.folder)
    run.ok = report.ok
    print(f"rehearsal: {run.name}")
    print(render(report.facts["profile"]))
    print(report.render(wall_s=run.wall), flush=True)
    (run.folder / "report.json").write_text(json.dumps(report.as_dict(wall_s=run.wall), indent=1))


def summarize(runs: list[RunSpec], out: Path, launcher: str, wall: float) -> None:
    """Write ``out/summary.json`` (every run's folder, status, verdict and wall time) and
    print one line per run and the rehearsal's verdict."""
    summary = {
        "launcher": launcher,
        "wall_s": round(wall),
        "runs": [
            {"run": r.name, "folder": str(r.folder), "status": r.status, "ok": r.ok,
             "wall_s": round(r.wall)}
            for r in runs
        ],
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for r in runs:
        print(f"  {'ok  ' if r.ok else 'FAIL'} {r.name}: {r.status}, {r.wall:.0f} s")
    print(f"rehearsal: {len(runs)} runs in {wall:.0f} s: "
          f"{'PASSED' if all(r.ok for r in runs) else 'FAILED'}")  # fmt: skip
