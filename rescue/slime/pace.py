"""The pace arm on slime: the schedule of ``rescue.pace`` on slime's fully-async worker.

Specification
-------------
``SlimePace`` holds one ``rescue.pace.PaceSchedule`` (``K`` = ``RESCUE_MAX_STALENESS``,
``B`` = ``--rollout-batch-size``, ``W`` = ``RESCUE_PACE_WINDOW``, default ``(K + 1)·B``)
shared by two threads under one lock: slime's worker thread admits generations through
the data source (``rescue.slime.worker.RescueSource``), and the drain takes groups.
Groups are keyed by ``rescue.samples.group_id`` (slime's ``group_index``), which a
requeued group keeps.

- Admission (``next_groups``, the worker's ``get_samples``): a group slime requeued
  (aborted at a weight update) is still open in the schedule and is handed out again at
  once, under its first deadline: its tokens so far are at least as new as its admission,
  so the bound holds for what it resumes (slime keeps the tokens; a fresh start would
  too). A new prompt group is handed out only while ``can_admit``; a group the source
  returns that can be neither (a requeued group of a past window) waits in ``held`` and
  goes first once admitted.
- Taking (the drain, ``rescue.slime.rollout.Drain``): each call of the rollout function
  begins the schedule's next step; every finished group is ``ready``, a group without a
  result or lost is ``reject``-ed (its place frees), and the batch takes what ``choose``
  names, waiting while every place left is owed to groups still in flight.

No group is dropped for staleness: one that arrives stale anyway (the engines moved more
than one version in a step) is kept with weight 1 (``trained_stale``), with a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

from rescue.pace import PaceSchedule, PaceSettings
from rescue.samples import group_id

logger = logging.getLogger(__name__)


class SlimePace:
    """``rescue.pace.PaceSchedule`` shared by slime's worker thread and the drain."""

    def __init__(self, settings: PaceSettings) -> None:
        self.settings = settings
        self.schedule = PaceSchedule(settings)
        self.lock = threading.Lock()
        self.held: list[Any] = []

    # ── the worker's side (its data source) ─────────────────────────────────

    def next_groups(self, source: Any, num_samples: int) -> list:
        """Up to ``num_samples`` groups the schedule lets the worker start now."""
        out: list = []
        with self.lock:
            while len(out) < num_samples:
                if self.held and self._admit(self.held[0]):
                    out.append(self.held.pop(0))
                    continue
                if self.held or not (self._requeued_waiting(source) or self.schedule.can_admit()):
                    break
                groups = source.get_samples(1)
                if not groups:
                    break
                for group in groups:
                    if self._admit(group):
                        out.append(group)
                    else:
                        self.held.append(group)
        return out

    def _admit(self, group: Any) -> bool:
        key = group_id(group)
        if self.schedule.is_open(key):
            return True  # requeued: resumes under its first deadline
        if not self.schedule.can_admit():
            return False
        self.schedule.admit(key)
        return True

    @staticmethod
    def _requeued_waiting(source: Any) -> bool:
        length = getattr(source, "get_buffer_length", None)
        return bool(length and length() > 0)

    # ── the drain's side ────────────────────────────────────────────────────

    def begin_step(self) -> None:
        with self.lock:
            self.schedule.begin_step()

    def ready(self, key: Hashable) -> None:
        with self.lock:
            self.schedule.ready(key)

    def reject(self, key: Hashable) -> None:
        with self.lock:
            if self.schedule.is_open(key):
                self.schedule.reject(key)

    def choose(self) -> tuple[Hashable | None, bool]:
        """The group to take next (``None``: wait) and whether the step waits for a
        straggler (another group is ready)."""
        with self.lock:
            key = self.schedule.choose()
            return key, key is None and self.schedule.waits_for_straggler()

    def take(self, key: Hashable) -> int:
        with self.lock:
            return self.schedule.take(key)

    @property
    def places(self) -> int:
        with self.lock:
            return self.schedule.places
