"""The value types of the ``rescue`` command's flags: each says what it allows.

Specification
-------------
``integer(low, high)`` and ``number(low, high, ...)`` are argparse ``type=`` callables: a
value that is not a number of that kind, or lies outside the range (NaN and infinities are
outside every range), is refused with ``argparse.ArgumentTypeError`` whose text states the
value and what is allowed, so the command prints one line naming the flag, e.g.
``rescue sim: error: argument --first-seed: '-1': allowed an integer >= 0``.
``existing(what)`` refuses a path that does not exist. Every integer and float flag of the
``rescue`` command has one of these types (``tests/test_cli_inputs.py`` checks it).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """An argparse type: an ``int`` or ``float`` between ``low`` and ``high`` (None: no
    bound); ``low_open`` / ``high_open`` exclude the bound itself."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.kind is int else "number"

    def allowed(self) -> str:
        """``an integer >= 0``, ``a number in (0, 1]`` and the like."""
        what = "an integer" if self.kind is int else "a number"
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return (
                f"{what} in {'(' if self.low_open else '['}{lo:g}, {hi:g}"
                f"{')' if self.high_open else ']'}"
            )
        if lo is not None:
            return f"{what} {'>' if self.low_open else '>='} {lo:g}"
        if hi is not None:
            return f"{what} {'<' if self.high_open else '<='} {hi:g}"
        return what

    def contains(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        if self.low is not None and (x < self.low or (self.low_open and x == self.low)):
            return False
        return not (
            self.high is not None and (x > self.high or (self.high_open and x == self.high))
        )

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text.strip())
        except (TypeError, ValueError):
            value = None
        if value is None or not self.contains(float(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: allowed {self.allowed()}")
        return value


def integer(low: int | None = None, high: int | None = None) -> Range:
    """An integer in ``[low, high]`` (None: unbounded)."""
    return Range(int, low, high)


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Range:
    """A finite float between ``low`` and ``high``; ``*_open`` excludes that bound."""
    return Range(float, low, high, low_open, high_open)


#: The usual ones.
COUNT = integer(1)  # a number of things: seeds, games, prompts, workers, trials
NON_NEGATIVE = integer(0)  # a seed, a limit where 0 means "none" or "default"
SECONDS = number(0, low_open=True)  # a timeout or a wait
PROBABILITY = number(0, 1)


@dataclass(frozen=True)
class Existing:
    """An argparse type: a path that exists (``what``: ``file``, ``folder`` or ``path``)."""

    what: str = "path"

    @property
    def __name__(self) -> str:
        return self.what

    def __call__(self, text: str) -> str:
        ok = {"file": os.path.isfile, "folder": os.path.isdir}.get(self.what, os.path.exists)
        if not ok(text):
            raise argparse.ArgumentTypeError(f"{text!r}: no such {self.what}")
        return text


def existing(what: str = "path") -> Existing:
    """A path that exists: ``file``, ``folder`` or any ``path``."""
    return Existing(what)
