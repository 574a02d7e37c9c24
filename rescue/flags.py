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

The ``RESCUE_*`` settings a run's processes read from the environment (the launchers set
them in the Ray job's runtime environment) are declared here too, each once, where it is
used: ``setting`` and its kinds ``choice``, ``switch``, ``count``, ``amount``, ``text``
give a ``Setting`` whose ``read(env)`` returns the default when the variable is unset or
blank, else the value, or refuses it with one line naming the variable and what it allows
(``NAME='text'; allowed: ...``). ``SETTINGS`` holds every declaration; the docs' tables of
settings are checked against them (``tests/test_settings.py``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rescue.errors import InputError


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


# ── Settings from the environment ───────────────────────────────────────────────────────


@dataclass(frozen=True)
class Setting:
    """A ``RESCUE_*`` setting the processes of a run read from the environment.

    Declared once, with ``setting`` (or ``choice``, ``switch``, ``count``, ``amount``,
    ``text``), where it is used; ``SETTINGS`` holds every declaration and the docs' tables
    are checked against them (``tests/test_settings.py``).

    Attributes:
        name: the variable.
        default: the value when it is unset or empty (blank).
        convert: the value from the variable's text; a ``ValueError`` or ``TypeError`` is
            refused as ``NAME='text'; allowed: <allowed>``, an ``InputError`` passes as is.
        allowed: what the variable allows, as the refusal states it.
        shown: the default as the docs' table of settings writes it.
        lower: the text is read case-insensitively (lowered before ``convert``).
        strip: surrounding blanks are dropped (a path keeps them).
    """

    name: str
    default: Any
    convert: Callable[[str], Any]
    allowed: str
    shown: str
    lower: bool = False
    strip: bool = True

    def read(self, env: Mapping[str, str] | None = None) -> Any:
        """The setting's value in ``env`` (default ``os.environ``), checked."""
        env = os.environ if env is None else env
        text = env.get(self.name) or ""
        if self.strip:
            text = text.strip()
        if not text.strip():
            return self.default
        if self.lower:
            text = text.lower()
        try:
            return self.convert(text)
        except InputError:
            raise
        except (TypeError, ValueError):
            raise InputError(f"{self.name}={text!r}; allowed: {self.allowed}") from None


#: Every declared setting: name -> declaration (filled as the declaring modules load).
SETTINGS: dict[str, Setting] = {}


def setting(
    name: str,
    default: Any,
    convert: Callable[[str], Any],
    allowed: str,
    *,
    shown: str | None = None,
    lower: bool = False,
    strip: bool = True,
) -> Setting:
    """Declare a setting (``Setting``); ``shown`` defaults to the default as text."""
    declared = Setting(
        name, default, convert, allowed, _shown(default) if shown is None else shown, lower, strip
    )
    SETTINGS[name] = declared
    return declared


def _shown(default: Any) -> str:
    if isinstance(default, str):
        return f"`{default}`"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def choice(name: str, values: tuple[str, ...], *, shown: str | None = None) -> Setting:
    """One of ``values`` (case-insensitive); the first is the default."""

    def convert(text: str) -> str:
        if text not in values:
            raise ValueError(text)
        return text

    return setting(name, values[0], convert, ", ".join(values), shown=shown, lower=True)


def switch(name: str, default: bool) -> Setting:
    """``1`` (on) or ``0`` (off)."""
    on, off = ("1", "0") if default else ("0", "1")

    def convert(text: str) -> bool:
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"

    return setting(name, default, convert, f"{on} (default), {off}", shown=str(int(default)))


def count(
    name: str,
    default: int | None,
    low: int,
    *,
    allowed: str | None = None,
    shown: str | None = None,
) -> Setting:
    """An integer >= ``low``; ``allowed`` replaces ``an integer >= LOW (default D)``."""
    within = integer(low)

    def convert(text: str) -> int:
        value = int(text)
        if not within.contains(value):
            raise ValueError(text)
        return value

    said = allowed or f"{within.allowed()} (default {default})"
    return setting(name, default, convert, said, shown=shown)


def amount(
    name: str,
    default: float | None,
    low: float,
    *,
    low_open: bool = False,
    finite: bool = True,
    allowed: str | None = None,
    shown: str | None = None,
) -> Setting:
    """A number above ``low`` (``low_open``: strictly); ``finite=False`` also takes ``inf``;
    ``allowed`` replaces ``a number >= LOW (default D)``."""
    within = number(low, low_open=low_open)

    def convert(text: str) -> float:
        value = float(text)
        if not (within.contains(value) or (not finite and value == math.inf)):
            raise ValueError(text)
        return value

    said = allowed or f"{within.allowed()} (default {default:g})"
    return setting(name, default, convert, said, shown=shown)


def text(name: str, default: str | None, *, shown: str) -> Setting:
    """A text (a path): taken as it is, blanks included."""
    return setting(name, default, str, "any text", shown=shown, strip=False)
