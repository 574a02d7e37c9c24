"""slime's fully-async worker, with what it requeues and loses reported to the drain.

Specification
-------------
slime's ``AsyncRolloutWorker`` (``slime/rollout/fully_async_rollout.py``) pulls one prompt
group at a time from its data source (``get_samples(1)``), numbers it (``gid``, from 0 in
the order the source hands groups out, ``_loop``) and runs ``generate_and_rm_group`` on
it. Its done-callback (``_make_done_cb(gid)``) then does one of three things, none of
which the rollout function sees:

- the task raised (e.g. a remote reward model after its retries) or returned something
  other than a list: slime logs it and the group is gone;
- a sample of the group is ``ABORTED`` (slime pauses its engines with SGLang's ``abort``
  mode at every weight update): slime puts the group back with
  ``data_buffer.add_samples([group])`` and generates it again later;
- otherwise the group is queued for the drain.

``RescueSource`` stands between the worker and slime's data source (slime's own
``RolloutDataSourceWithBuffer``, whose requeue path is unchanged: every call is passed
on). It remembers each group it hands out under the worker's ``gid`` and reports
(``WorkerEvents``, a thread-safe queue the drain empties):

- ``requeued``: a group the worker put back, with its census records as they were then;
- ``lost``: a group whose task raised or returned no list, with the reason (the
  exception's class name, or ``not_a_list``); and, when a worker stops, every group it
  still had in flight (``worker_stopped``).

``rescue_worker_class()`` is slime's ``AsyncRolloutWorker`` with ``_make_done_cb``
wrapped (slime's callback still runs, unchanged, after the report). A finished group
that is not the one handed out under its ``gid`` means slime no longer numbers groups
that way; the drain then stops with an error instead of misreporting.

Under the pace arm the source also admits generations (``rescue.slime.pace``): while the
schedule's window is full it hands out nothing new (slime's worker then waits a poll and
asks again); a requeued group, still open in the schedule, is handed out again at once
under its first deadline.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rescue.census import RolloutRecord
from rescue.samples import group_id, group_records


@dataclass
class WorkerEvent:
    """A group the worker requeued or lost."""

    kind: str  # "requeued" | "lost"
    gid: Any  # rescue.samples.group_id of the group
    records: list[RolloutRecord] = field(default_factory=list)
    reason: str | None = None


class WorkerEvents:
    """Events from the worker's thread, emptied by the drain (thread-safe)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[WorkerEvent] = queue.SimpleQueue()
        self.error: str | None = None  # an accounting error the drain raises

    def put(self, event: WorkerEvent) -> None:
        self._queue.put(event)

    def drain(self) -> list[WorkerEvent]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out


class RescueSource:
    """slime's data source as the worker sees it, reporting what comes back to it.

    Args:
        source: slime's data source (``get_samples`` / ``add_samples``; the rest is
            passed through).
        events: where requeues and losses are reported.
        reward_key: ``--reward-key`` for the records of a requeued group.
        admission: under pace, ``rescue.slime.pace.SlimePace`` (default none).
    """

    def __init__(
        self,
        source: Any,
        events: WorkerEvents,
        *,
        reward_key: str | None = None,
        admission: Any = None,
    ) -> None:
        self.source = source
        self.events = events
        self.reward_key = reward_key
        self.admission = admission
        self._lock = threading.Lock()
        self._handed: dict[int, Any] = {}
        self._next_gid = 0

    def __getattr__(self, name: str) -> Any:  # save, load, __len__, ... of slime's source
        return getattr(self.source, name)

    def get_samples(self, num_samples: int) -> list:
        """Groups for the worker, each remembered under the ``gid`` the worker gives it."""
        if self.admission is not None:
            groups = self.admission.next_groups(self.source, num_samples)
        else:
            groups = self.source.get_samples(num_samples)
        with self._lock:
            for group in groups:
                self._handed[self._next_gid] = group
                self._next_gid += 1
        return groups

    def add_samples(self, samples: list) -> None:
        """slime's worker puts aborted groups back: reported, then passed on to slime's source."""
        for group in samples:
            self.events.put(
                WorkerEvent(
                    "requeued", group_id(group), group_records(group, reward_key=self.reward_key)
                )
            )
        self.source.add_samples(samples)

    def handed_out(self, gid: int) -> Any:
        """Forget and return the group handed out under ``gid`` (``None`` if unknown)."""
        with self._lock:
            return self._handed.pop(gid, None)

    def in_flight(self) -> list:
        """Groups handed out and not yet back (finished, requeued or lost)."""
        with self._lock:
            return list(self._handed.values())

    def lose_in_flight(self, reason: str) -> int:
        """Report every group still in flight as lost (its worker stopped); how many."""
        with self._lock:
            groups, self._handed = list(self._handed.values()), {}
        for group in groups:
            self.events.put(WorkerEvent("lost", group_id(group), reason=reason))
        return len(groups)


def report_done(source: RescueSource, gid: int, task: Any) -> None:
    """What the done-callback reports before slime's own runs (module docstring)."""
    group = source.handed_out(gid)
    if group is None:
        source.events.error = (
            f"slime's worker finished group #{gid}, which its data source never handed out"
        )
        return
    reason = None
    if task.cancelled():
        reason = "CancelledError"
    elif (exc := task.exception()) is not None:
        reason = type(exc).__name__
    elif not isinstance(task.result(), list):
        reason = "not_a_list"
    if reason is not None:
        source.events.put(WorkerEvent("lost", group_id(group), reason=reason))
        return
    result = task.result()
    if result and group and group_id(result) != group_id(group):
        source.events.error = (
            f"slime's worker finished group {group_id(result)!r} as #{gid}, but #{gid} was "
            f"group {group_id(group)!r}: its numbering no longer follows its data source, so "
            "rescue cannot tell which group a failed task lost (rescue.slime.worker)"
        )


_WORKER_CLASS: type | None = None


def rescue_worker_class() -> type:
    """slime's ``AsyncRolloutWorker`` reporting its requeues and losses (module docstring)."""
    global _WORKER_CLASS
    if _WORKER_CLASS is not None:
        return _WORKER_CLASS
    from slime.rollout.fully_async_rollout import AsyncRolloutWorker

    class RescueRolloutWorker(AsyncRolloutWorker):
        """slime's worker; its data source is a ``RescueSource``."""

        def _make_done_cb(self, gid: int) -> Callable[[Any], None]:
            slime_callback = super()._make_done_cb(gid)

            def callback(task: Any) -> None:
                report_done(self.data_buffer, gid, task)
                slime_callback(task)

            return callback

    RescueRolloutWorker.__module__ = __name__
    _WORKER_CLASS = RescueRolloutWorker
    return RescueRolloutWorker
