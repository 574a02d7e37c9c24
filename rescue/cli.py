"""The ``rescue`` command. Each subcommand lives beside the code it runs.

A subcommand module provides ``configure(parser)`` (adds its arguments) and
``main(args) -> int``; heavy dependencies are imported inside ``main`` only, so
``rescue --help`` works on a bare install.

Bad input (``rescue.errors.InputError``) is one line on stderr and exit status 2; any
other exception keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from rescue.errors import InputError

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "identity": ("rescue.identity", "exact enumeration of the masked-update identity"),
    "sim": ("rescue.sim.cli", "the arms side by side on the simulator of async agent RL"),
    "replay": ("rescue.replay.cli", "census, advantages and gradients of the arms on debug dumps"),
    "oracle": (
        "rescue.oracle.cli",
        "the gradient oracle: every arm's selection of one cohort, gradients compared",
    ),
    "report": (
        "rescue.judge.cli",
        "judge the pre-registered predictions on simulated or real runs",
    ),
    "swe": ("swe_smith_tasks.cli", "SWE-smith tasks: prepare data, pilot, reap containers"),
    "rlvr": ("rescue.rlvr.cli", "single-turn RLVR: prepare data, calibrate the cap, watch a sweep"),
    "agent": (
        "rescue.envs.cli",
        "text games (ALFWorld, TextWorld cooking): make games, write rows",
    ),
    "question": (
        "rescue.questions.cli",
        "a research question (q1, q2, q3) as resumable stages in a run folder",
    ),
    "status": ("rescue.questions.status", "the stages of a question's run folder, with progress"),
    "power": (
        "rescue.judge.power_cli",
        "what n seeds per arm can decide: each prediction's chance of a verdict, by the judge",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rescue",
        description="Unbiased replacements for outcome-dependent exclusion in async agentic RL.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name, help=help_text, description=(module.__doc__ or help_text).split("\n\n")[0]
        )
        module.configure(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except InputError as e:  # bad input: one clear line, no traceback
        print(f"rescue {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
