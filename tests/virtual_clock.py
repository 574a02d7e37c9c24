"""An asyncio event loop whose clock moves only when every task waits.

``run_virtual(coro)`` runs a coroutine on a real ``asyncio.SelectorEventLoop`` with one
change: ``loop.time()`` is virtual. When no callback is ready, the loop would block in its
selector until the next timer; here the clock jumps to that timer instead. So
``asyncio.sleep(d)`` takes exactly ``d`` on ``loop.time()``, and anything measured with
``loop.time()`` is the scripted delays, whatever the machine's load. The loop still fires
a timer up to its clock resolution (1e-9 s) early, which is the tolerance of a measured
delay. A run where every task waits with no timer set, or whose clock passes ``limit_s``,
is stuck: it raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any

#: How far a measured delay may be from the scripted one: the loop fires a timer up to
#: its clock resolution (1e-9 s) early; 1e-6 s leaves room for float rounding.
TOLERANCE_S = 1e-6


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("virtual clock: every task waits and no timer is set (stuck)")
        self._loop.now += timeout
        if self._loop.now > self._loop.limit_s:
            raise RuntimeError(f"virtual clock passed {self._loop.limit_s} s: the run is stuck")
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """``SelectorEventLoop`` with ``time()`` from a clock that jumps to the next timer."""

    def __init__(self, limit_s: float = 10_000.0) -> None:
        self.now = 0.0
        self.limit_s = limit_s
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, Any], limit_s: float = 10_000.0) -> Any:
    """Run ``coro`` on a ``VirtualClockLoop``; cancel what is left (a worker loop) after."""
    loop = VirtualClockLoop(limit_s)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()
