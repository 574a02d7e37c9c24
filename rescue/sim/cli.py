"""Run the arms on the embedded simulator of asynchronous multi-turn agent RL.

``rescue sim`` simulates each arm with each seed (``rescue.sim.engine``), writes the census
per step as JSONL, offline wandb runs, PNG plots and a markdown summary in which
``rescue.judge`` (the judge of ``rescue report``) judges the predictions P3-P7 on the runs,
and prints the summary. Examples::

    rescue sim                                   # every arm, side by side (make demo)
    rescue sim --arm protect --a 0.5 --seeds 3 --steps 300
    rescue sim --arms drop,never-drop,protect:0.5,protect:0.1 --out runs/stale
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rescue.errors import InputError
from rescue.sim.config import ARMS, DEFAULT_ARMS, SimConfig, parse_arms

DEFAULT_SEEDS = 3
DEFAULT_OUT = "runs/sim"

#: The ``SimConfig`` fields a flag sets (``groups_per_step`` by ``--groups-per-step``), with
#: the flag's help; type and default are the field's (``steps``: 300, ``make demo``: about a
#: minute on 2 cores).
CONFIG_FLAGS: dict[str, str] = {
    "steps": "trainer steps per run",
    "groups_per_step": "groups per batch",
    "group_size": "rollouts per group G",
    "concurrency": "groups generated at once",
    "buffer_capacity": "finished groups the buffer holds",
    "train_time": "time of one update",
    "max_turns": "turn cap",
    "max_staleness": "K: stale when staleness > K",
    "lr": "policy step size",
    "kappa": "turn-reached baseline shrinkage κ",
    "infra_rate": "share of rollouts lost to infrastructure",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "arms: " + ", ".join(ARMS) + " (protect:A sets a per arm)"
    arms = parser.add_mutually_exclusive_group()
    arms.add_argument("--arm", help="run one arm (e.g. protect); default: the --arms set")
    arms.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help="comma-separated arms run side by side (default: %(default)s)",
    )
    parser.add_argument(
        "--a",
        type=float,
        default=0.5,
        help="keep probability a of protect arms given without :A (default: 0.5)",
    )
    parser.add_argument(
        "--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per arm (default: %(default)s)"
    )
    parser.add_argument(
        "--first-seed", type=int, default=0, help="first seed; seeds are consecutive (default: 0)"
    )
    defaults = SimConfig()
    for name, text in CONFIG_FLAGS.items():
        default = getattr(defaults, name)
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{text} (default: %(default)s)",
        )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the number of CPUs); results do not depend on it",
    )
    parser.add_argument(
        "--no-wandb",
        action="store_true",
        help="do not write offline wandb runs (default: write them when wandb is installed)",
    )
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="do not write PNG plots (default: write them when matplotlib is installed)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` the flags describe (validated: bad values name their flag)."""
    return SimConfig(**{name: getattr(args, name) for name in CONFIG_FLAGS})


def main(args: argparse.Namespace) -> int:
    from rescue.sim.runner import run_arms, wandb_available, write_jsonl
    from rescue.sim.summary import summary_markdown

    cfg = config_from_args(args)
    if not (0.0 < args.a <= 1.0):
        raise InputError(f"--a={args.a!r}; allowed: 0 < a <= 1")
    arms = parse_arms(args.arm if args.arm else args.arms, default_a=args.a)
    if args.seeds < 1:
        raise InputError(f"--seeds={args.seeds}; allowed: an integer >= 1")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    notes = []
    wandb_dir = None
    if args.no_wandb:
        pass
    elif wandb_available():
        wandb_dir = out
        notes.append(
            f"wandb: offline runs in {out / 'wandb'} (upload with: wandb sync {out / 'wandb'}/offline-run-*)"
        )
    else:
        notes.append("wandb: not installed (pip install 'rescue[sim]'): skipped")
    results = run_arms(
        cfg, arms, seeds, workers=workers, progress=not args.no_progress, wandb_dir=wandb_dir
    )
    paths = write_jsonl(results, out)
    summary = summary_markdown(results, cfg, seeds)
    (out / "summary.md").write_text(summary)
    notes = [
        f"census: {len(paths)} JSONL files in {out / 'census'}",
        f"summary: {out / 'summary.md'}",
        *notes,
    ]
    if not args.no_plots:
        from rescue.sim.plots import write_plots

        try:
            pngs = write_plots(results, out)
            notes.append(f"plots: {', '.join(p.name for p in pngs)} in {out}")
        except ImportError:
            notes.append("plots: matplotlib not installed (pip install 'rescue[sim]'): skipped")
    print(summary)
    for line in notes:
        print(line)
    return 0
