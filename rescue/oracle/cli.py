"""The gradient oracle: every arm's selection of one recorded cohort, and their gradients compared.

``rescue oracle build DUMP_DIR...``    per dumped step, the replay input of each arm (all
                                         groups, stale-excluded, the stale groups alone,
                                         protected with 1/a) and the manifest;
``rescue oracle compare ORACLE_DIR``   per step and in total, each arm's gradient against
                                         the all-groups gradient (JSON and a markdown table).

The dumps come from a never-drop run through rescue's buffer (the launchers' ``ARM=never-drop``
with dumps); the gradients from Miles' replay (``make oracle``) or from ``rescue replay
gradients ORACLE_DIR/rollout_data/*.pt --model M --trained ORACLE_DIR/gradients``.
"""

from __future__ import annotations

import argparse
import json
import os

from rescue.replay.cli import number_list


def _a_values(text: str) -> tuple[float, ...]:
    values = number_list(text)
    if not values or any(not 0.0 < a <= 1.0 for a in values):
        raise argparse.ArgumentTypeError(f"--a {text!r}: every a must be in (0, 1]")
    return values


def _arms(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="oracle_command", metavar="{build,compare}", required=True)
    p = sub.add_parser("build", help="each arm's replay input from a never-drop run's dumps")
    p.add_argument(
        "dumps",
        nargs="+",
        metavar="DUMP_DIR",
        help="dump directories (their *.pt, else rollout_data/*.pt), files or globs",
    )
    p.add_argument(
        "--out",
        default=None,
        help="oracle directory to write (default: DUMP_DIR/oracle for the first DUMP_DIR that "
        "is a directory, else oracle/ beside the first file)",
    )
    p.add_argument(
        "--arms",
        type=_arms,
        default=("all", "drop", "stale", "protect"),
        help="arms in replay order, all first (default all,drop,stale,protect)",
    )
    p.add_argument(
        "--a",
        type=_a_values,
        default=(0.5,),
        help="keep probabilities of the protect arm, one arm each (default 0.5)",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite an existing oracle.json (default off)"
    )
    p.add_argument(
        "--unsafe-load",
        action="store_true",
        help="torch.load(weights_only=False): runs code from the file; only for dumps you trust (default off)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    p = sub.add_parser("compare", help="each arm's gradient against the all-groups gradient")
    p.add_argument("oracle_dir", metavar="ORACLE_DIR", help="the directory `build` wrote")
    p.add_argument(
        "--gradients",
        default=None,
        help="read gradient files from this directory (<rollout_id>/*.pt) (default: "
        "ORACLE_DIR/stats when streamed statistics exist, else ORACLE_DIR/gradients)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the JSON report (default: the markdown table)"
    )


def _default_out(dumps: list[str]) -> str:
    for d in dumps:
        if os.path.isdir(d):
            return os.path.join(d, "oracle")
    return os.path.join(os.path.dirname(os.path.abspath(dumps[0])), "oracle")


def main(args: argparse.Namespace) -> int:
    if args.oracle_command == "build":
        from rescue.oracle.build import build

        out = args.out or _default_out(args.dumps)
        manifest = build(
            args.dumps,
            out,
            arms=args.arms,
            a_values=args.a,
            unsafe_load=args.unsafe_load,
            force=args.force,
            progress=not args.no_progress,
        )
        steps = manifest.steps()
        stale = sum(e.stale_groups for e in manifest if e.arm == "all")
        groups = sum(e.groups for e in manifest if e.arm == "all")
        print(
            f"{out}: {len(steps)} steps x {len(manifest.arms)} arms ({', '.join(manifest.arms)}) "
            f"= {len(manifest.entries)} replay rollouts; {stale} of {groups} groups stale"
        )
        print(
            f"replay: --load-debug-rollout-data {os.path.join(out, manifest.rollout_data)} "
            f"--start-rollout-id 0 --num-rollout {len(manifest.entries)}"
        )
        return 0
    from rescue.oracle.compare import compare, markdown, write

    report = compare(args.oracle_dir, args.gradients)
    write(report, args.oracle_dir)
    print(json.dumps(report, indent=1, default=float) if args.json else markdown(report))
    return 0
