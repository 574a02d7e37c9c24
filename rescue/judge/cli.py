"""Judge the pre-registered predictions on simulated or real runs.

``rescue report RUNS... --out DIR`` reads the runs (the simulator's output directory or
census JSONL, wandb offline runs ``wandb/offline-run-*``, a wandb project's runs
``wandb:ENTITY/PROJECT[/GROUP]`` through wandb's API, CSV/JSON history exports, and
``rescue replay ... --json`` reports), judges every prediction P1-P7 on each cohort of
runs (same family, cap and setting; arms and seeds from the wandb group name or tags
``<family>-<arm>[-a<A>][-k<K>][-cap<CAP>][-est-turn][-drgrpo]-seed<SEED>``), and writes ``report.md``,
``report.json`` and the plots to DIR. Examples::

    rescue report runs/sim/fast-thorough --out runs/report
    rescue report wandb/offline-run-* replay/*.json --out report
    rescue report wandb:my-lab/rescue-swe --out report
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
        help="files, directories or globs: rescue sim output, *.jsonl, *.csv, *.json, wandb "
        "offline runs; or wandb:ENTITY/PROJECT[/GROUP], a wandb project's runs (of one group)",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help="output directory; an earlier report there (report.md, report.json, plots/) is "
        "replaced when this one is written, left as it was when it fails (default: %(default)s)",
    )
    parser.add_argument(
        "--wandb-cache",
        default=None,
        metavar="DIR",
        help="where the histories of runs read from a wandb project are kept, by run id and "
        "last step, so each is scanned once (default: $XDG_CACHE_HOME/rescue/wandb, else "
        "~/.cache/rescue/wandb)",
    )
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="do not write PNG plots (default: write them when matplotlib is installed)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )


#: What a report writes in its folder (replaced by the next report; the rest stays).
OUTPUTS = ("report.md", "report.json", "plots")


def owned(entry: Path) -> bool:
    """An earlier report's entry of the output folder (``rescue.output``)."""
    return entry.name in OUTPUTS


def main(args: argparse.Namespace) -> int:
    from rescue.judge.inputs import read_inputs
    from rescue.judge.report import as_json, header, judge, markdown, summary_table
    from rescue.output import check_out, staged

    out = check_out(Path(args.out))
    cache = Path(args.wandb_cache) if args.wandb_cache else None
    inputs = read_inputs(args.runs, progress=not args.no_progress, cache=cache)
    j = judge(inputs.runs, inputs.replays, notes=inputs.notes)
    lines = [f"read {len(inputs.runs)} runs and {len(inputs.replays)} replay reports", ""]
    lines += header(j)
    for c in j.cohorts:
        lines += ["", f"{c.title}:", *summary_table(c.results)]
    if inputs.replays:
        lines += ["", "offline replay:", *summary_table(j.offline)]
    lines += ["", f"report: {Path(args.out) / 'report.md'}, {Path(args.out) / 'report.json'}"]
    with staged(out, owned) as stage:
        (stage.path / "report.md").write_text(markdown(j))
        (stage.path / "report.json").write_text(json.dumps(as_json(j), indent=1) + "\n")
        if not args.no_plots:
            try:
                from rescue.judge.plots import write_plots

                pngs = write_plots(j, stage.path / "plots")
                lines.append(f"plots: {len(pngs)} PNG files in {Path(args.out) / 'plots'}")
            except ImportError:
                lines.append("plots: matplotlib not installed (pip install 'rescue[sim]'): skipped")
    print("\n".join(lines))
    return 0
