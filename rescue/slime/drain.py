"""The drain of slime's fully-async rollout: pop, gate, filter, count; framework-free.

Specification
-------------
slime's ``AsyncRolloutWorker`` keeps generating groups in the background and queues the
finished ones. One ``Drain.collect`` fills one batch of ``target`` groups from that queue:

1. each popped group *enters* the census with its records (counted in
   ``rollout/census/generated/*`` whatever becomes of it); a group without a result
   (``rescue.census.no_result``) settles ``aborted`` with the reason and is discarded, as
   slime discards what it cannot regenerate;
2. otherwise the gate (``rescue.gate.Gate``) decides on its group id and staleness
   (``current version - oldest counted version``, ``rescue.samples``; ``None``, never
   stale, when either is unknown). A dropped group settles ``dropped_stale`` and the next
   queued group takes its place. A protected group's samples get
   ``metadata["rescue_weight"] = 1/a``;
3. the kept groups are sorted by ``index`` (slime's order), the sample filter runs on them
   (slime's own fully-async path skips it), and each settles as ``trained_fresh`` /
   ``trained_stale`` / ``trained_protected`` with its rollouts as they are after the filter.

What the worker requeued or lost (``rescue.slime.worker.WorkerEvents``) is counted as it
is reported: a requeued group enters and settles ``aborted`` (the reason its records
give, ``aborted`` for a weight-update abort) with ``requeued``, as Miles' buffer counts an
aborted group its ``retry`` handler recycles; a lost group enters and settles ``lost``
with the exception's name. So ``groups/aborted`` means the same on slime as on Miles, and
every group the worker took from the data source is accounted for once it comes back.

Under the pace arm (``pace``, a ``rescue.slime.pace.SlimePace``) every finished group is
popped at once and waits, *buffered* in the census, until the schedule takes it; the batch
is what the schedule chooses (earliest deadline first), waiting for stragglers when it
owes its places to groups in flight; a group without a result or lost frees its place. A
group stale anyway is kept with weight 1 (``trained_stale``) and warned about.
``rollout/census/pace_wait_s`` and ``pace_wait_groups`` are the time and the groups the
step waited for stragglers (the keys Miles' pace logs).

Step metrics: the census (``rollout/census/*``), plus ``worker_queue`` (finished groups
left in slime's queue), ``current_version`` (the version used), ``version_fallback`` (1
when no engine reported a version and the highest version seen on a sample was used).

Progress: every ``log_every_s`` (default 30 s, slime's own interval) while a batch is
not full, one log line says what the call has seen so far (kept, popped, without a
result, dropped, requeued, lost, queue, seconds), so a drain that keeps discarding groups
is visible.

Watchdog (``rescue.watchdog.Watchdog``, the one the Miles buffer uses): every popped group
is observed with its no-result reason (``None`` when it has a result) and the first error
text its samples carry (``metadata["error"]`` or ``["abort_reason"]``); a lost group is
observed as ``lost:<exception>``; a requeued group is not observed (it will finish later).
While the batch waits, ``check_idle`` runs at every poll. A trip raises ``WatchdogStop``
from ``collect`` after the watchdog's flush (``rescue.slime.rollout`` logs the census
there).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rescue.census import PREFIX, Bucket, Census, no_result
from rescue.errors import InputError
from rescue.gate import Arm, Gate
from rescue.gating import GatedGroup, gate_group
from rescue.pace import WAIT_GROUPS_KEY, WAIT_S_KEY
from rescue.samples import (
    group_id,
    group_newest_weight_version,
    group_records,
    iter_samples,
)
from rescue.watchdog import Watchdog

logger = logging.getLogger(__name__)

#: Seconds between progress lines while a batch fills (slime's own LOG_EVERY).
LOG_EVERY_S = 30.0


class CompletedGroups(Protocol):
    """What the drain needs from slime's ``AsyncRolloutWorker``."""

    def get_completed_groups(self, limit: int | None = None) -> list[tuple[int, list]]: ...

    def queue_size(self) -> int: ...


class Drain:
    """The framework-free drain (module docstring).

    Args:
        worker: slime's ``AsyncRolloutWorker`` or anything with its
            ``get_completed_groups(limit)`` and ``queue_size()``.
        gate: the stale-group gate (``pace`` only together with ``pace``).
        census: the census the metrics come from (default a new one).
        current_version: callable returning the engines' weight version or ``None``
            (default: always ``None``, i.e. the highest version seen on a sample).
        sample_filter: ``fn(args, groups)`` run in place on the kept groups (default none).
        poll_s: sleep between empty polls of the worker (default 0.05 s, as slime).
        events: the worker's requeues and losses (``rescue.slime.worker.WorkerEvents``).
        pace: the pace schedule (``rescue.slime.pace.SlimePace``), required by ``pace``.
        watchdog: the run's ``rescue.watchdog.Watchdog`` (default none).
        log_every_s: seconds between progress lines (default 30).
        clock: the clock of the progress log and the waits (default ``time.monotonic``).
    """

    def __init__(
        self,
        worker: CompletedGroups,
        gate: Gate,
        *,
        census: Census | None = None,
        current_version: Callable[[], int | None] | None = None,
        sample_filter: Callable[[Any, list], None] | None = None,
        poll_s: float = 0.05,
        events: Any = None,
        pace: Any = None,
        watchdog: Watchdog | None = None,
        log_every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if gate.arm is Arm.PACE and pace is None:
            raise InputError(
                "RESCUE_ARM=pace: the drain needs the pace schedule (RESCUE_MAX_STALENESS=K "
                "and rescue.slime.rollout.generate_rollout build it)"
            )
        if pace is not None and gate.arm is not Arm.PACE:
            raise InputError(f"a pace schedule with RESCUE_ARM={gate.arm.value}; allowed: pace")
        self.worker = worker
        self.gate = gate
        self.census = census if census is not None else Census()
        self._engine_version = current_version or (lambda: None)
        self.sample_filter = sample_filter
        self.poll_s = poll_s
        self.events = events
        self.pace = pace
        self.watchdog = watchdog
        self.log_every_s = log_every_s
        self.clock = clock
        self.max_seen_version: int | None = None
        self.version_fallback = False
        self.seen: Counter[str] = Counter()  # this call: popped, no_result, dropped, ...
        self._ready: dict[Any, Any] = {}  # pace: finished groups not yet taken
        self._pace_wait_s = 0.0
        self._pace_wait_groups = 0

    # ── versions ─────────────────────────────────────────────────────────────

    def current_version(self, groups: Sequence[Sequence[Any]] = ()) -> int | None:
        """max(engine version, highest version seen on any sample so far)."""
        for group in groups:
            v = group_newest_weight_version(group)
            if v is not None and (self.max_seen_version is None or v > self.max_seen_version):
                self.max_seen_version = v
        engine = self._engine_version()
        self.version_fallback = engine is None
        candidates = [v for v in (engine, self.max_seen_version) if v is not None]
        return max(candidates) if candidates else None

    # ── one group ────────────────────────────────────────────────────────────

    def decide(
        self, args: Any, group: Sequence[Any], current_version: int | None
    ) -> GatedGroup | None:
        """Enter a popped group in the census; settle it if it has no result, else gate it.

        A group without a result (``None`` returned) and a dropped group are settled here;
        a kept group carries its weight and settles in ``collect``.
        """
        gid = self._enter(args, group)
        if gid is None:
            return None
        gated = gate_group(self.gate, group, current_version)
        if not gated.kept:
            self.seen["dropped"] += 1
            gated.settle(self.census, reward_key=getattr(args, "reward_key", None))
        return gated

    def _enter(self, args: Any, group: Sequence[Any]) -> Any:
        """Enter a popped group; settle it ``aborted`` when it has no result (``None``)."""
        gid = group_id(group)
        records = group_records(group, reward_key=getattr(args, "reward_key", None))
        self.census.enter(gid, records)  # every popped group counts in the generated view
        self.seen["popped"] += 1
        reason = no_result(records)
        if reason is not None:
            self.census.settle(gid, Bucket.ABORTED, records, reason=reason)
            self.seen["no_result"] += 1
            if self.pace is not None:
                self.pace.reject(gid)
        if self.watchdog is not None:  # after the census, which its flush logs
            self.watchdog.observe(reason, _first_error(group) if reason is not None else None)
        return None if reason is not None else gid

    def absorb_events(self) -> None:
        """Count what the worker requeued or lost since the last call."""
        if self.events is None:
            return
        if self.events.error is not None:
            raise RuntimeError(f"rescue: {self.events.error}")
        for event in self.events.drain():
            # not in the generated view: a requeued group is generated again and counted
            # when it comes back; a lost group has no records
            self.census.enter(event.gid)
            if event.kind == "requeued":
                reason = no_result(event.records) or "aborted"
                self.census.settle(
                    event.gid, Bucket.ABORTED, event.records, reason=reason, requeued=True
                )
                self.seen["requeued"] += 1
            else:
                self.census.settle(event.gid, Bucket.LOST, reason=event.reason)
                self.seen["lost"] += 1
                logger.warning("rescue: group %r lost (%s)", event.gid, event.reason)
                if self.pace is not None:
                    self.pace.reject(event.gid)
                if self.watchdog is not None:
                    self.watchdog.observe(f"lost:{event.reason}")

    # ── one batch ────────────────────────────────────────────────────────────

    def collect(self, args: Any, target: int) -> tuple[list[list], dict[str, float]]:
        """``target`` kept groups, sorted by ``index`` and filtered, and the step metrics."""
        self.seen.clear()
        started = self.clock()
        self._last_log = started
        if self.pace is not None:
            kept, current = self._collect_paced(args, target, started)
        else:
            kept, current = self._collect(args, target, started)
        self.absorb_events()
        kept.sort(key=lambda gated: _first_index(gated.group))
        groups = [gated.group for gated in kept]
        if self.sample_filter is not None:
            self.sample_filter(args, groups)
        reward_key = getattr(args, "reward_key", None)
        for gated in kept:  # after the filter, so the records carry its masks
            gated.settle(self.census, reward_key=reward_key)
        metrics = self.census.step_metrics(PREFIX, queue_size=len(self._ready))
        metrics[f"{PREFIX}worker_queue"] = float(self.worker.queue_size())
        metrics[f"{PREFIX}version_fallback"] = float(self.version_fallback)
        if current is not None:
            metrics[f"{PREFIX}current_version"] = float(current)
        if self.pace is not None:
            metrics[WAIT_S_KEY] = self._pace_wait_s
            metrics[WAIT_GROUPS_KEY] = float(self._pace_wait_groups)
            self._pace_wait_s, self._pace_wait_groups = 0.0, 0
        return groups, metrics

    def _collect(
        self, args: Any, target: int, started: float
    ) -> tuple[list[GatedGroup], int | None]:
        kept: list[GatedGroup] = []
        current: int | None = None
        while len(kept) < target:
            self.absorb_events()
            popped = self.worker.get_completed_groups(limit=target - len(kept))
            if not popped:
                self._idle(len(kept), target, started)
                continue
            current = self.current_version([group for _, group in popped])
            for _, group in popped:
                if (gated := self.decide(args, group, current)) is not None and gated.kept:
                    kept.append(gated)
        return kept, current

    def _collect_paced(
        self, args: Any, target: int, started: float
    ) -> tuple[list[GatedGroup], int | None]:
        self.pace.begin_step()
        kept: list[GatedGroup] = []
        current = self.current_version()
        waiting_since: float | None = None
        while len(kept) < target:
            self.absorb_events()
            popped = self.worker.get_completed_groups(limit=None)
            if popped:
                current = self.current_version([group for _, group in popped])
                for _, group in popped:
                    if (gid := self._enter(args, group)) is not None:
                        self.pace.ready(gid)
                        self._ready[gid] = group
            key, straggler = self.pace.choose()
            if key is None:
                if straggler and waiting_since is None:
                    waiting_since = self.clock()
                self._idle(len(kept), target, started)
                continue
            if waiting_since is not None:
                self._pace_wait_s += self.clock() - waiting_since
                self._pace_wait_groups += 1
                waiting_since = None
            self.pace.take(key)
            gated = gate_group(self.gate, self._ready.pop(key), current)
            if gated.bucket is Bucket.TRAINED_STALE:
                logger.warning(
                    "rescue pace: group %r arrived %s versions stale (K=%s); kept with weight 1",
                    key,
                    gated.staleness,
                    self.gate.max_staleness,
                )
            kept.append(gated)
        return kept, current

    # ── waiting, progress and the watchdog ──────────────────────────────────

    def _idle(self, kept: int, target: int, started: float) -> None:
        if self.watchdog is not None:
            self.watchdog.check_idle()
        now = self.clock()
        if now - self._last_log >= self.log_every_s:
            self._last_log = now
            s = self.seen
            logger.info(
                "rescue: batch %d/%d after %.0f s: popped %d (without a result %d, dropped "
                "stale %d), requeued %d, lost %d, worker queue %d%s",
                kept,
                target,
                now - started,
                s["popped"],
                s["no_result"],
                s["dropped"],
                s["requeued"],
                s["lost"],
                self.worker.queue_size(),
                f", ready {len(self._ready)}" if self.pace is not None else "",
            )
        time.sleep(self.poll_s)


def _first_error(group: Sequence[Any]) -> str | None:
    """The first error text a sample of the group carries, for the watchdog's line."""
    for s in iter_samples(group):
        metadata = getattr(s, "metadata", None) or {}
        for key in ("error", "abort_reason"):
            if metadata.get(key):
                return str(metadata[key])
    return None


def _first_index(group: Sequence[Any]) -> int:
    for s in iter_samples(group):
        idx = getattr(s, "index", None)
        if idx is not None:
            return int(idx)
    return 0
