"""Judge the pre-registered predictions on simulated or real runs.

``rescue report RUNS... --out DIR`` reads the runs (the simulator's output directory or
census JSONL, wandb offline runs ``wandb/offline-run-*``, CSV/JSON history exports, and
``rescue replay ... --json`` reports), judges every prediction P1-P7 on each cohort of
runs (same family, cap and setting; arms and seeds from the wandb group name or tags
``<family>-<arm>[-a<A>][-k<K>][-cap<CAP>][-est-turn][-drgrpo]-seed<SEED>``), and writes ``report.md``,
``report.json`` and the plots to DIR. Examples::

    rescue report runs/sim/fast-thorough --out runs/report
    rescue report wandb/offline-run-* replay/*.json --out report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_OUT = "runs/report"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUNS",
        help="files, directories or globs: rescue sim output, *.jsonl, *.csv, *.json, wandb offline runs",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="do not write PNG plots (default: write them when matplotlib is installed)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )


def main(args: argparse.Namespace) -> int:
    from rescue.judge.inputs import read_inputs
    from rescue.judge.report import as_json, header, judge, markdown, summary_table

    inputs = read_inputs(args.runs, progress=not args.no_progress)
    j = judge(inputs.runs, inputs.replays, notes=inputs.notes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(j))
    (out / "report.json").write_text(json.dumps(as_json(j), indent=1) + "\n")
    lines = [f"read {len(inputs.runs)} runs and {len(inputs.replays)} replay reports", ""]
    lines += header(j)
    for c in j.cohorts:
        lines += ["", f"{c.title}:", *summary_table(c.results)]
    lines += ["", "offline replay:", *summary_table(j.offline), ""]
    lines += [f"report: {out / 'report.md'}, {out / 'report.json'}"]
    if not args.no_plots:
        try:
            from rescue.judge.plots import write_plots

            pngs = write_plots(j, out / "plots")
            lines.append(f"plots: {len(pngs)} PNG files in {out / 'plots'}")
        except ImportError:
            lines.append("plots: matplotlib not installed (pip install 'rescue[sim]'): skipped")
    print("\n".join(lines))
    return 0
