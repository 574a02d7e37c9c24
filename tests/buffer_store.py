"""What ``RescueDataBuffer`` takes from Miles, for tests and benchmarks that run without it.

``FifoStore`` keeps the contract of Miles' ``DefaultDataBuffer`` with staleness and the
dynamic filter off (``put`` waits while ``capacity`` groups are queued; ``get`` returns
the oldest group; ``get_metrics`` reports the queue length under ``QUEUE_SIZE_KEY``).
``load_function`` resolves a dotted ``pkg.mod.fn`` path as Miles' ``load_function`` does.
The Miles tests run the buffer on Miles' own classes instead.
"""

from __future__ import annotations

import asyncio
import importlib
from collections import deque
from typing import Any

from rescue.miles.buffer import QUEUE_SIZE_KEY


class FifoStore:
    """FIFO with capacity and back-pressure, and its queue metric.

    Args:
        capacity: most groups queued at once (>= 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity!r}; allowed: an integer >= 1")
        self._capacity = capacity
        self._queue: deque[Any] = deque()
        self._cond = asyncio.Condition()

    async def put(self, input: Any) -> None:
        async with self._cond:
            while len(self._queue) >= self._capacity:
                await self._cond.wait()
            self._queue.append(input)
            self._cond.notify_all()

    async def get(self, current_version: int | None = None, **_: Any) -> Any:
        async with self._cond:
            while not self._queue:
                await self._cond.wait()
            entry = self._queue.popleft()
            self._cond.notify_all()
            return entry

    def get_metrics(self) -> dict[str, float]:
        return {QUEUE_SIZE_KEY: len(self._queue)}


def load_function(path: str) -> Any:
    """``pkg.mod.attr`` -> the attribute."""
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)
