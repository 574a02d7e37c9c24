"""Run the arms on the embedded simulator of asynchronous multi-turn agent RL.

``rescue sim`` simulates each arm with each seed (``rescue.sim.engine``), writes the census
per step as JSONL, offline wandb runs, PNG plots and a markdown summary of what the runs
showed for the predictions P3, P5, P6 and P7, and prints the summary. Examples::

    rescue sim                                   # every arm, side by side (make demo)
    rescue sim --arm protect --a 0.5 --seeds 3 --steps 300
    rescue sim --arms drop,never-drop,protect:0.5,protect:0.1 --out runs/stale
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rescue.sim.config import ARMS, DEFAULT_ARMS, SimConfig, parse_arms

#: Steps per run when ``--steps`` is not given (``make demo``: about a minute on 2 cores).
DEFAULT_STEPS = SimConfig().steps
DEFAULT_SEEDS = 3
DEFAULT_OUT = "runs/sim"

_D = SimConfig()


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
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="trainer steps per run (default: %(default)s)",
    )
    parser.add_argument(
        "--groups-per-step",
        type=int,
        default=_D.groups_per_step,
        help="groups per batch (default: %(default)s)",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=_D.group_size,
        help="rollouts per group G (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=_D.concurrency,
        help="groups generated at once (default: %(default)s)",
    )
    parser.add_argument(
        "--buffer-capacity",
        type=int,
        default=_D.buffer_capacity,
        help="finished groups the buffer holds (default: %(default)s)",
    )
    parser.add_argument(
        "--train-time",
        type=float,
        default=_D.train_time,
        help="time of one update (default: %(default)s)",
    )
    parser.add_argument(
        "--max-turns", type=int, default=_D.max_turns, help="turn cap (default: %(default)s)"
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=_D.max_staleness,
        help="K: stale when staleness > K (default: %(default)s)",
    )
    parser.add_argument(
        "--lr", type=float, default=_D.lr, help="policy step size (default: %(default)s)"
    )
    parser.add_argument(
        "--kappa",
        type=float,
        default=_D.kappa,
        help="turn-reached baseline shrinkage κ (default: %(default)s)",
    )
    parser.add_argument(
        "--infra-rate",
        type=float,
        default=_D.infra_rate,
        help="share of rollouts lost to infrastructure (default: %(default)s)",
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
    return SimConfig(
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        group_size=args.group_size,
        concurrency=args.concurrency,
        buffer_capacity=args.buffer_capacity,
        train_time=args.train_time,
        max_turns=args.max_turns,
        max_staleness=args.max_staleness,
        lr=args.lr,
        kappa=args.kappa,
        infra_rate=args.infra_rate,
    )


def main(args: argparse.Namespace) -> int:
    from rescue.sim.runner import run_arms, wandb_available, write_jsonl
    from rescue.sim.summary import summary_markdown

    cfg = config_from_args(args)
    if not (0.0 < args.a <= 1.0):
        raise ValueError(f"--a={args.a!r}; allowed: 0 < a <= 1")
    arms = parse_arms(args.arm if args.arm else args.arms, default_a=args.a)
    if args.seeds < 1:
        raise ValueError(f"--seeds={args.seeds}; allowed: an integer >= 1")
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
