"""The processes of a rehearsal, found by the run folder in their environment.

Every process a rehearsal starts (the stand-in engine, Ray and every Ray worker, Miles' router
and session server, the agents' stand-in ``docker`` calls) inherits
``RESCUE_REHEARSAL_DIR=<run folder>``; nothing is ever found by name, so another run on the
same machine is never touched.

- ``survivors(out)``: the processes of run ``out`` (and of the run folders under it) still
  alive (this one excepted);
- ``reap(out)``: kill them (what ``stop`` and a test's clean-up use after a time-out);
- ``CpuMeter(out)``: CPU seconds per component of the run, its children's included (the
  agents' sandbox commands are the rollout manager's children), sampled while it runs, for
  the profile.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

#: (component, what its command line contains), first match wins.
COMPONENTS = (
    ("engine", "rescue.rehearsal.standins.engine"),
    ("trainer", "MegatronTrainRayActor"),
    ("rollout", "RolloutManager"),
    ("session server", "session-server"),
    ("router", "router"),
    ("driver", "train_async.py"),
    ("ray", "ray"),
)


def survivors(out: Path) -> list[Any]:
    """Every process (but this one) whose environment has ``RESCUE_REHEARSAL_DIR`` ``out``
    or a run folder under it (a rehearsal of several runs gives each its own)."""
    import psutil

    me, found = os.getpid(), []
    under = str(out).rstrip(os.sep) + os.sep
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            folder = p.environ().get("RESCUE_REHEARSAL_DIR")
            if folder is not None and (folder == str(out) or folder.startswith(under)):
                found.append(p)
    return found


def reap(out: Path) -> int:
    """Kill every process of the run folder ``out``; returns how many were killed."""
    import psutil

    killed = 0
    for _ in range(3):
        left = survivors(out)
        if not left:
            break
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed += 1
        psutil.wait_procs(left, timeout=10)
    return killed


def component(cmdline: str) -> str:
    """The component a command line belongs to (``COMPONENTS``; else ``other``)."""
    return next((name for name, mark in COMPONENTS if mark in cmdline), "other")


#: The stand-in docker's command line: a sandbox command and its children are short-lived.
SANDBOX = "rescue/rehearsal/standins/docker.py"


def _in_sandbox(p: Any) -> bool:
    """Whether ``p`` is a stand-in docker call or runs under one."""
    return any(SANDBOX in " ".join(q.cmdline()) for q in (p, *p.parents()))


class CpuMeter:
    """CPU seconds per component of run ``out``, sampled while it runs: a process's last
    sample counts, so one that exits (Ray's workers, at the job's end) is not lost."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._last: dict[int, tuple[str, float]] = {}

    def sample(self) -> None:
        import psutil

        for p in survivors(self.out):
            with contextlib.suppress(psutil.Error):
                if _in_sandbox(p):  # counted once, in its agent's process, when reaped
                    continue
                t = p.cpu_times()
                seconds = t.user + t.system + t.children_user + t.children_system
                self._last[p.pid] = (component(" ".join(p.cmdline())), seconds)

    def totals(self) -> dict[str, float]:
        """CPU seconds (user + system, with reaped children's) per component."""
        total: dict[str, float] = {}
        for name, seconds in self._last.values():
            total[name] = total.get(name, 0.0) + seconds
        return {k: round(v, 1) for k, v in sorted(total.items())}
