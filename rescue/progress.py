"""Progress bars of the long commands: tqdm, the library Miles itself draws its bars with.

Specification
-------------
``progress_bar(total, unit=..., desc=..., enabled=...)`` is a ``tqdm`` bar on stderr, so
stdout stays the command's output (a report, a table) and can be piped. A disabled bar
(``--no-progress``) is tqdm's own disabled bar: every method is a no-op and nothing is
written, so callers never branch on it. When stderr is not a terminal (a log file, CI),
the bar is redrawn at most every ``LOG_INTERVAL_S`` seconds instead of many times a
second, so a log gets a few lines rather than thousands.

``advance_to(bar, done)`` moves a bar to an absolute count (work counted elsewhere: in
worker processes, in Ray tasks), never backwards.

tqdm is imported inside the function (a dependency of rescue, but the core imports only the
standard library and numpy at module level).
"""

from __future__ import annotations

import sys
from typing import IO, Any

#: Seconds between two redraws when stderr is not a terminal.
LOG_INTERVAL_S = 10.0


def progress_bar(
    total: int | None,
    *,
    unit: str,
    desc: str,
    enabled: bool = True,
    file: IO[str] | None = None,
    initial: int = 0,
) -> Any:
    """A tqdm bar of ``total`` ``unit`` on ``file`` (default stderr); disabled: no output."""
    from tqdm import tqdm

    stream = sys.stderr if file is None else file
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return tqdm(
        total=total,
        initial=initial,
        unit=unit,
        desc=desc,
        file=stream,
        disable=not enabled,
        dynamic_ncols=tty,
        mininterval=0.1 if tty else LOG_INTERVAL_S,
        leave=True,
    )


def advance_to(bar: Any, done: int) -> None:
    """Move ``bar`` forward to ``done`` (a count kept elsewhere); never backwards."""
    if done > bar.n:
        bar.update(done - bar.n)
