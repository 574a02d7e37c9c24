"""The ``rescue`` command. Each subcommand lives beside the code it runs.

A subcommand module provides ``configure(parser)`` (adds its arguments) and
``main(args) -> int``; heavy dependencies are imported inside ``main`` only, so
``rescue --help`` works on a bare install.

Bad input is one line on stderr and exit status 2: a flag argparse refuses (a wrong type,
a value outside the range its ``rescue.flags`` type states, a missing argument) and
``rescue.errors.InputError`` raised by a command. Any other exception keeps its traceback.
SIGINT and SIGTERM end the process tree the command started (``rescue.interrupts``), then
print one line naming the signal and the output folders left as they were
(``rescue.output``); the exit status is 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import typing
from collections.abc import Sequence

from rescue import interrupts, output
from rescue.errors import InputError


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line: ``PROG: error: MESSAGE (PROG --help
    lists ...)``, exit status 2 (argparse prints its usage block first)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists what is allowed)\n")


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
    "wandb": (
        "rescue.tracking.cli",
        "the census in wandb: save its workspace to a project, or draw it from offline runs",
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
        "rescue.sim.power_cli",
        "what n seeds per arm can decide: each prediction's chance of a verdict, by the judge",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a flag refused in one line (2)
        return e.code if isinstance(e.code, int) else 2
    output.forget()
    with interrupts.handled():
        try:
            return int(args._main(args) or 0)
        except InputError as e:  # bad input: one clear line, no traceback
            print(f"rescue {args.command}: error: {e}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # output piped into `head`: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except KeyboardInterrupt as e:  # SIGINT or SIGTERM: the tree is ended already
            interrupts.end_tree(interrupts.descendants())
            left = output.left_as_it_was()
            kept = f"; left as it was: {', '.join(map(str, left))}" if left else ""
            print(
                f"rescue {args.command}: interrupted by {interrupts.signal_name(e)}{kept}",
                file=sys.stderr,
                flush=True,
            )
            return interrupts.exit_status(e)


if __name__ == "__main__":
    raise SystemExit(main())
