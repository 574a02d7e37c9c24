"""SIGINT and SIGTERM end the whole process tree a command started, and say so in one line.

Specification
-------------
- ``handled()``: while the block runs (in the main thread), SIGINT and SIGTERM first end
  every process below this one (``end_tree(descendants())``: worker processes, a stage's
  command and its children, a local Ray driver's workers, stand-in servers), then raise
  ``Interrupted`` (a ``KeyboardInterrupt`` naming the signal) where the program was, so
  ``finally`` blocks run (a staged output folder is removed, ``rescue.output``) and the
  command prints one line instead of a traceback. Nested blocks are one block.
- ``descendants(pid)``: every process below ``pid``, children first, including those that
  started a session of their own; read from ``/proc`` on Linux, else from ``ps``.
- ``end_tree(pids, grace_s)``: SIGTERM to each, up to ``grace_s`` seconds for them to
  exit (their own handlers end their trees), then SIGKILL to what is left. An exited child
  of this process is seen exited without being reaped (``waitid`` with ``WNOWAIT``): its
  owner reaps it. Reaping a worker of a ``ProcessPoolExecutor`` here left multiprocessing
  unable to see it exit (its ``waitpid`` fails with "No child processes", so the worker
  reads alive for ever): the executor's manager thread then looped sending stop sentinels
  and the interpreter's exit joined it, so an interrupted ``make demo`` hung after its
  line, once in a few interrupts, whichever reaped first.
- ``worker_initializer()``: for a worker pool: the worker ignores SIGINT (the terminal
  sends it to the whole foreground group; the parent ends its workers itself, so no worker
  prints a traceback), and on Linux it is killed when its parent dies.
- ``exit_status(e)``: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

#: Seconds ``end_tree`` waits between SIGTERM and SIGKILL by default.
GRACE_S = 10.0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the program was when it arrived."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def signal_name(e: BaseException) -> str:
    """``SIGINT`` or ``SIGTERM``: which signal interrupted (a plain KeyboardInterrupt is SIGINT)."""
    return e.name if isinstance(e, Interrupted) else "SIGINT"


def exit_status(e: BaseException) -> int:
    """128 + the signal number of an interrupt."""
    return 128 + (e.signum if isinstance(e, Interrupted) else int(signal.SIGINT))


def _children_table() -> dict[int, list[int]]:
    """parent pid -> child pids of every process this user can see."""
    table: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir() and (proc / "self" / "stat").exists():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) >= 2:
                table.setdefault(int(fields[1]), []).append(int(entry.name))
        return table
    try:
        out = subprocess.run(
            ["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return table
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            table.setdefault(int(parts[1]), []).append(int(parts[0]))
    return table


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children first."""
    root = os.getpid() if pid is None else pid
    table = _children_table()
    out: list[int] = []
    frontier = [root]
    while frontier:
        nxt = []
        for p in frontier:
            for child in table.get(p, ()):
                if child not in out and child != root:
                    out.append(child)
                    nxt.append(child)
        frontier = nxt
    return out


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited; a child of this process is left to its owner to reap."""
    if hasattr(os, "waitid"):
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie of someone else's has exited
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def end_tree(pids: Iterable[int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace_s`` (module docstring); the pids that were alive."""
    alive = [p for p in pids if p != os.getpid()]
    for p in alive:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = list(alive)
    while left and time.monotonic() < deadline:
        left = [p for p in left if not _gone(p)]
        if left:
            time.sleep(0.05)
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    for p in left:
        for _ in range(40):
            if _gone(p):
                break
            time.sleep(0.05)
    return alive


_DEPTH = 0


def _on_signal(signum: int, frame) -> None:
    # The tree first: a worker or a stage's command must not outlive this process, and must
    # stop writing before a `finally` removes what it was writing into.
    end_tree(descendants())
    raise Interrupted(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` after ending the process tree (module
    docstring); outside the main thread the block runs as it is."""
    global _DEPTH
    if threading.current_thread() is not threading.main_thread() or _DEPTH:
        yield
        return
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def worker_initializer() -> None:
    """In a worker process: SIGINT ignored, SIGTERM the default, killed with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
