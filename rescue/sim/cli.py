"""Run the arms on the embedded simulator of asynchronous multi-turn agent RL.

``rescue sim`` simulates each arm with each seed (``rescue.sim.engine``), writes the census
per step as JSONL, offline wandb runs, PNG plots and a markdown summary in which
``rescue.judge`` (the judge of ``rescue report``) judges the predictions on the runs, and
prints the summary. Every setting of the simulator is a flag
(``rescue.sim.config.SimConfig``); a scenario (``--scenario``, or your own file with
``--scenario-file``) sets many at once and names the arms it is about. Examples::

    rescue sim                                   # every arm, default (swe-like) settings
    rescue sim --scenario all                    # the four scenarios (make demo)
    rescue sim --scenario fast-thorough --seeds 5 --steps 300
    rescue sim --arms drop,never-drop,protect:0.5,pace --max-staleness 2 --out runs/mine
    rescue sim --scenario two-outcome --print-scenario > mine.toml   # copy, edit, then
    rescue sim --scenario-file mine.toml
    rescue sim map [--grid FILE]                 # P3 over a declared grid (make map)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rescue import flags
from rescue.errors import InputError
from rescue.sim import scenario as sc
from rescue.sim.arms import ARMS, DEFAULT_ARMS, parse_arms
from rescue.sim.config import SimConfig, settings

DEFAULT_SEEDS = 3
#: Where ``--scenario all`` (``make demo``) writes; every other run without ``--out`` writes
#: to ``runs/sim-<what ran>`` (``default_out``), so no run overwrites another's.
DEFAULT_OUT = "runs/sim"
GROUP_TITLES = {
    "trainer": "trainer and asynchrony",
    "environment": "environment",
    "strategy table (--episodes table)": "the strategy table (--episodes table)",
    "policy": "policy",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "arms: " + ", ".join(ARMS) + " (protect:A sets a per arm; protect:A:wnorm divides its "
        "loss by the sum of the weights)\nscenarios: "
        + ", ".join(sc.names())
        + " (list: --scenarios)"
    )
    what = parser.add_argument_group("what to run")
    which = what.add_mutually_exclusive_group()
    which.add_argument(
        "--scenario",
        metavar="NAME[,NAME]",
        help="preset scenario(s), comma-separated, or 'all'; each sets its settings and arms "
        "(default: none: the default settings and arms)",
    )
    which.add_argument(
        "--scenario-file",
        metavar="FILE",
        help="a scenario file of your own (TOML; format in rescue.sim.scenario) (default: none)",
    )
    what.add_argument("--scenarios", action="store_true", help="list the preset scenarios and exit")
    what.add_argument(
        "--print-scenario",
        action="store_true",
        help="print the scenario with every setting resolved (TOML, to copy and edit) and exit",
    )
    arms = what.add_mutually_exclusive_group()
    arms.add_argument("--arm", help="run one arm (e.g. protect); default: the --arms set")
    arms.add_argument(
        "--arms",
        help="comma-separated arms run side by side (default: the scenario's, else "
        + ",".join(DEFAULT_ARMS)
        + ")",
    )
    what.add_argument(
        "--a",
        type=flags.number(0, 1, low_open=True),
        default=0.5,
        help="keep probability a of protect arms given without :A (default: 0.5)",
    )
    what.add_argument(
        "--seeds",
        type=flags.COUNT,
        default=DEFAULT_SEEDS,
        help="seeds per arm (default: %(default)s)",
    )
    what.add_argument(
        "--first-seed",
        type=flags.NON_NEGATIVE,
        default=0,
        help="first seed; seeds are consecutive (default: 0)",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for s in settings():
        g = groups.get(s.group) or groups.setdefault(
            s.group, parser.add_argument_group("settings: " + GROUP_TITLES[s.group])
        )
        text = f"{s.help} (default: {s.kind.show(s.default)})".replace("%", "%%")
        if s.kind.base == "bool":
            g.add_argument(
                s.flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
            )
            continue

        def read(value: str, _s=s):
            try:
                return _s.kind.from_text(value, _s.name)
            except InputError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        g.add_argument(
            s.flag, type=read, metavar=s.kind.metavar, default=argparse.SUPPRESS, help=text
        )
    out = parser.add_argument_group("where and how")
    out.add_argument(
        "--out",
        default=None,
        help=f"output directory; what an earlier rescue sim run wrote there is replaced when "
        "this run has finished (a failed or interrupted run leaves it as it was), not mixed in; "
        f"other files there stay (default: {DEFAULT_OUT} for --scenario all, else "
        "runs/sim-NAME after the scenario(s), the scenario file's name, or 'default')",
    )
    out.add_argument(
        "--workers",
        type=flags.COUNT,
        default=None,
        help="worker processes (default: the number of CPUs); results do not depend on it",
    )
    out.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the arm-seed grid as Ray tasks on the cluster at ADDRESS ('auto': the one "
        "this machine belongs to); results are the same as a local run (default: local)",
    )
    out.add_argument(
        "--no-wandb",
        action="store_true",
        help="do not write offline wandb runs (default: write them when wandb is installed)",
    )
    out.add_argument(
        "--no-plots",
        action="store_true",
        help="do not write PNG plots (default: write them when matplotlib is installed)",
    )
    out.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )
    sub = parser.add_subparsers(dest="sim_command", metavar="map", required=False)
    from rescue.sim import drift_map

    drift_map.configure(
        sub.add_parser(
            "map",
            help="P3 over a grid of settings declared in a file, the subsidy beside it (make map)",
            description=(drift_map.__doc__ or "").split("\n\n")[0],
        )
    )


def overrides(args: argparse.Namespace) -> dict:
    """The settings given on the command line (the others come from the scenario)."""
    return {s.name: getattr(args, s.name) for s in settings() if hasattr(args, s.name)}


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` the flags describe, without a scenario (validated)."""
    return SimConfig(**overrides(args))


def scenarios_from_args(args: argparse.Namespace) -> list[sc.Scenario]:
    """The scenarios to run: presets, a file, or one unnamed scenario of the defaults."""
    if args.scenario_file:
        return [sc.load_file(args.scenario_file)]
    if args.scenario:
        wanted = [n.strip() for n in args.scenario.split(",") if n.strip()]
        if wanted == ["all"]:
            wanted = sc.names()
        if not wanted or len(set(wanted)) != len(wanted):
            raise InputError(
                f"--scenario {args.scenario!r}; allowed: distinct names of {', '.join(sc.names())}, or all"
            )
        return [sc.preset(n) for n in wanted]
    return [sc.Scenario(name="", title="default settings", arms=DEFAULT_ARMS)]


def default_out(args: argparse.Namespace) -> Path:
    """The folder of a run without ``--out`` (the ``--out`` flag's help)."""
    if args.scenario_file:
        return Path(f"runs/sim-{Path(args.scenario_file).stem}")
    if args.scenario:
        names = [n.strip() for n in args.scenario.split(",") if n.strip()]
        return Path(DEFAULT_OUT if names == ["all"] else f"runs/sim-{'+'.join(names)}")
    return Path("runs/sim-default")


def owned(entry: Path) -> bool:
    """What an earlier ``rescue sim`` run wrote in its output folder (``runner.OUTPUTS``,
    the plots, and its scenario folders: the subfolders holding a ``runs.json``): replaced
    by a new run's, so that no census, plot or summary of that run is read as part of this
    one. Every other entry stays (``rescue.output``)."""
    from rescue.sim.runner import OUTPUTS

    if entry.name in OUTPUTS or entry.suffix == ".png":
        return True
    return entry.is_dir() and (entry / "runs.json").is_file()


def main(args: argparse.Namespace) -> int:
    from rescue.output import check_out, staged
    from rescue.sim.engine import check_runnable
    from rescue.sim.runner import run_scenarios

    if getattr(args, "sim_command", None) == "map":
        from rescue.sim import drift_map

        return drift_map.main(args)
    if args.scenarios:
        print(sc.listing())
        return 0
    scenarios = scenarios_from_args(args)
    plans = []
    for s in scenarios:
        cfg = s.sim_config(**overrides(args))
        text = args.arm or args.arms or ",".join(s.arms or DEFAULT_ARMS)
        plans.append((s, cfg, parse_arms(text, default_a=args.a)))
    if args.print_scenario:
        for s, cfg, arms in plans:
            print(sc.render(s, cfg, arms))
        return 0
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
    out = Path(args.out) if args.out else default_out(args)
    for _, cfg, arms in plans:  # refused before anything is written or run
        for arm in arms:
            check_runnable(cfg, arm)
    check_out(out)
    if args.ray is not None:  # reach the cluster before the output folder is touched
        from rescue.sim.cluster import connect

        connect(args.ray)
    with staged(out, owned) as stage:
        where = [stage.path / s.name if len(plans) > 1 else stage.path for s, _, _ in plans]
        written = run_scenarios(
            [(s, cfg, arms, w) for (s, cfg, arms), w in zip(plans, where, strict=True)], seeds,
            workers=workers, ray=args.ray, progress=not args.no_progress,
            wandb=not args.no_wandb, plots=not args.no_plots,
        )  # fmt: skip
        index = None
        if len(plans) > 1:
            from rescue.sim.runner import family
            from rescue.sim.summary import index_markdown

            ran = [
                (s, Path(s.name), r) for (s, _, _), (_, r, _) in zip(plans, written, strict=True)
            ]
            index = index_markdown(ran, seeds, family[0] if family else None)
            (stage.path / "summary.md").write_text(index)
    for _, (summary, _, notes) in zip(plans, written, strict=True):
        if len(plans) == 1:
            print(summary)
        for line in notes:  # the notes name the temporary folder the run was written into
            print(line.replace(str(stage.path), str(out)))
    if index is not None:
        print(index)
        print(f"index of the scenarios: {out / 'summary.md'}")
    return 0
