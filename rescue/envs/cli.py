"""Text-game environments: make the games and write the prompt rows of a run.

``rescue agent prepare --env cooking --games-dir DIR --out ROWS.jsonl [--games 32]
[--seed 0] [--cap 15] [--levels 1,2,3,4,5]``
    tw-make's cooking games of graded difficulty from one seed (``rescue.envs.prepare``).
``rescue agent prepare --env alfworld --data-dir $ALFWORLD_DATA --out ROWS.jsonl
[--split train] [--limit 0]``
    the ALFWorld games its training environment loads, from the downloaded data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rescue import flags


def _levels(text: str) -> tuple[int, ...]:
    from rescue.envs.prepare import LEVELS
    from rescue.replay.cli import number_list

    levels = number_list(text, int)
    if not levels or any(x not in LEVELS for x in levels):
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed comma-separated levels of {','.join(map(str, sorted(LEVELS)))}"
        )
    return levels


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="agent_command", metavar="{prepare}", required=True)
    p = sub.add_parser("prepare", help="make the games and write the prompt rows")
    p.add_argument("--env", required=True, choices=("cooking", "alfworld"), help="the game")
    p.add_argument("--out", required=True, type=Path, help="the prompt JSONL to write")
    p.add_argument(
        "--games-dir", type=Path, help="cooking: where tw-make writes the games (required)"
    )
    p.add_argument(
        "--games",
        type=flags.COUNT,
        default=32,
        help="cooking: games per difficulty level (default 32)",
    )
    p.add_argument(
        "--seed", type=flags.NON_NEGATIVE, default=0, help="cooking: the set's seed (default 0)"
    )
    p.add_argument(
        "--cap",
        type=flags.COUNT,
        default=15,
        help="cooking: the step cap; a game whose walkthrough is longer is left out (default 15)",
    )
    p.add_argument(
        "--levels",
        type=_levels,
        default=(1, 2, 3, 4, 5),
        help="cooking: difficulty levels, comma-separated, from 0 (the ingredient in hand) "
        "to 5 (default 1,2,3,4,5)",
    )
    p.add_argument(
        "--data-dir", default="$ALFWORLD_DATA", help="alfworld: the data (default $ALFWORLD_DATA)"
    )
    p.add_argument(
        "--split",
        default="train",
        help="alfworld: train, valid_seen or valid_unseen (default train)",
    )
    p.add_argument(
        "--limit",
        type=flags.NON_NEGATIVE,
        default=0,
        help="alfworld: at most N games (default 0: all)",
    )


def main(args: argparse.Namespace) -> int:
    from rescue.envs.prepare import alfworld_rows, cooking_rows, write_rows
    from rescue.errors import InputError

    skipped = 0
    if args.env == "cooking":
        if args.games_dir is None:
            raise InputError("--env cooking needs --games-dir (where tw-make writes the games)")
        rows, skipped = cooking_rows(
            args.games_dir, games=args.games, seed=args.seed, cap=args.cap, levels=args.levels
        )
    else:
        rows = alfworld_rows(args.data_dir, split=args.split, limit=args.limit)
    n = write_rows(rows, args.out)
    extra = f", {skipped} left out (walkthrough longer than the cap {args.cap})" if skipped else ""
    print(f"{n} {args.env} games written to {args.out}{extra}")
    return 0
