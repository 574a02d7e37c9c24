"""``RescueDataBuffer``: Miles' fully-async data buffer with the stale-group gate and the census.

Target of ``--custom-async-data-buffer-path rescue.miles.buffer.RescueDataBuffer``.

Specification
-------------
Fresh groups behave exactly as in Miles' ``DefaultDataBuffer``, which this class wraps
(built with staleness and the dynamic filter switched off, and used for what it does
unchanged: FIFO order, capacity ``int(--async-data-buffer-capacity-factor ×
--rollout-batch-size)`` with back-pressure on ``put``, the staleness metrics):

- ``put``: a group with an aborted sample goes to the unused handler
  (``--async-unused-samples-handler``); a group ``--dynamic-sampling-filter-path``
  rejects is dropped, not recycled; any other group is queued.
- ``get(current_version)``: groups leave in FIFO order. staleness = ``current_version``
  − the group's oldest weight version (unknown when either is unknown: such a group is
  fresh). A group is stale when staleness > ``--max-weight-staleness``.

Groups without a result: at ``put``, a group with any rollout classified
``infra_no_result`` (``rescue.census.no_result``: an aborted sample, as Miles has it, but
also a trial that timed out, lost its container or its grader after the first model
call, which Miles would train as a failure with reward 0) goes to the unused handler as
an aborted group does, in every arm, and settles ``aborted`` with the reason
(``rollout/fully_async/aborted_groups_filtered`` counts it).

The other change: a stale group goes through ``rescue.gate.Gate`` (settings ``RESCUE_ARM``
= drop | never-drop | protect | pace, default drop; ``RESCUE_A`` in (0, 1], required for
protect; ``RESCUE_SEED``, default 0; read when the buffer is built, and invalid values
fail there). ``drop`` is Miles' behaviour; ``never-drop`` trains every stale group with
weight 1; ``protect`` keeps a stale group when its coin ``u(seed, group id) < a`` and
writes ``metadata["rescue_weight"] = 1/a`` on every sample of it (list-of-samples
trajectories too), which ``rescue.miles.reward.post_process_rewards`` multiplies into
the advantage. A dropped stale group goes to the unused handler, as in Miles; with
``retry`` its regeneration meets the same coin if it is stale again. The protect arm is
unbiased with Miles' default handler (``drop``): under ``retry`` a prompt whose stale
group lost the coin is generated again, so it is trained 1 + (1 − a) times in
expectation (a warning says so at construction). A kept group that is not protected has
no ``rescue_weight`` (a leftover key is removed), so its weight is 1.

The watchdog (``rescue.watchdog``; settings ``RESCUE_WATCHDOG_WINDOW``,
``RESCUE_WATCHDOG_MAX_NO_RESULT``, ``RESCUE_WATCHDOG_IDLE_S``): every ``put`` reports the
group to it, with its no-result reason and the first error text of its samples
(``metadata["error"]``); ``get`` waits for the store with the idle check. When it trips (most
of the last groups without a result, or no group for the idle limit) the census so far is
logged first, through Miles' tracking at the step being drained (``rollout/step``,
``rollout/census/watchdog/stopped`` = 1) and the tracking is finished so wandb has it,
then ``WatchdogStop`` raises with its one line, which names the rollout engines that do not
answer their health check (``rescue.miles.engines``): from ``put`` it ends Miles' producer loop,
whose error the drain re-raises; from ``get`` it ends the drain. A systematic fault (the
Docker socket missing in the rollout process, a broken grader, engines down) stops the
run instead of leaving Miles to warn "No completed rollout groups" forever.

A ``get`` cancelled while it waits leaves its wait on the store running, and the next
``get`` takes it over: a group the store hands out is never lost (it is counted as queued
until then).

``pace`` bounds staleness by waiting rather than at the gate, and is refused unless
``--rollout-function-path`` is ``rescue.miles.pace.PaceRolloutFn`` (the rollout function
that waits). The store is then ``rescue.miles.pace.PaceQueue`` instead of Miles' FIFO:
``get`` returns the group the pace schedule chooses, and a group rejected at ``put``
(no result, filtered) frees its place in the schedule. A group that reaches the gate
stale anyway is kept with weight 1 (``trained_stale``) and logged as a warning.

Census: every ``put`` opens an entry in ``rescue.census.Census`` with the group's records
(counted in ``rollout/census/generated/*``, whatever becomes of the group); the entry settles as
``aborted`` or ``filtered`` at put, ``dropped_stale`` at get, or ``trained_fresh`` /
``trained_stale`` / ``trained_protected`` at the next ``get_metrics()``. Miles runs
``--rollout-sample-filter-path`` after the last ``get`` of a step and before
``get_metrics``, so the trained records carry the filter's ``remove_sample`` (the masked
fractions). ``get_metrics()`` returns Miles' own keys (``rollout/fully_async/*``,
``rollout/dynamic_filter/drop_<reason>``; ``stale_groups_filtered`` counts the stale
groups the gate dropped) plus ``Census.step_metrics()`` under ``rollout/census/*``, and
checks conservation against the queue: open entries = queued groups + blocked puts. The
census's baseline population (for ``rollout/census/b_paid/masked``, the baseline paid to
loss-masked rollouts) is ``RESCUE_BASELINE`` (``all``, default, or ``survivors``), the
setting the reward hook normalizes with (``rescue.reward.baseline_from_env``).

Restarts: the buffer keeps the run's ledger of lives in ``--save`` (``rescue.restart``).
Built in a run Miles resumed from its checkpoint of step N (``rescue.miles.restart``), it
settles the groups the restart lost as ``lost_at_restart`` in its first census, once, and
every census says which life logged it (``rollout/census/life``): the judge reads a step
the run trained twice from the later life.
"""

from __future__ import annotations

import asyncio
import logging
import time
from argparse import Namespace
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from rescue.census import Bucket, Census, no_result
from rescue.errors import InputError
from rescue.gate import Arm, Gate
from rescue.gating import GatedGroup, gate_group
from rescue.miles.engines import diagnosis
from rescue.miles.restart import resume_point
from rescue.miles.targets import PACE_ROLLOUT_FUNCTION, QUEUE_SIZE_KEY
from rescue.restart import LIFE_KEY, LifeLog
from rescue.reward import baseline_from_env
from rescue.samples import group_id, group_records
from rescue.watchdog import Watchdog, WatchdogSettings

logger = logging.getLogger(__name__)

_STALE_KEY = "rollout/fully_async/stale_groups_filtered"
_ABORTED_KEY = "rollout/fully_async/aborted_groups_filtered"
_FILTER_PREFIX = "rollout/dynamic_filter/drop_"
#: Logged (1.0) with the census the watchdog flushes before it stops the run.
WATCHDOG_KEY = "rollout/census/watchdog/stopped"


class RescueDataBuffer:
    """Miles ``DataBuffer`` with the stale-group gate and the outcome census.

    Args:
        input: Miles' ``DataBufferConstructorInput`` (``args``, ``unused_handler_fn``).
            Reads ``args.max_weight_staleness`` (default None: nothing is stale),
            ``args.dynamic_sampling_filter_path`` (default None), ``args.reward_key``
            (default None), ``args.rollout_function_path`` (checked under pace), and what
            Miles' ``DefaultDataBuffer`` reads.
        env: where ``RESCUE_ARM`` / ``RESCUE_A`` / ``RESCUE_SEED`` / ``RESCUE_BASELINE``
            are read (default ``os.environ``; the launchers set them in the Ray runtime env).
        store: the FIFO store of accepted groups (default: Miles' ``DefaultDataBuffer``
            with staleness and the dynamic filter off). Anything with Miles' ``put`` /
            ``get(current_version=...)`` / ``get_metrics()`` contract that reports
            ``QUEUE_SIZE_KEY``. Under ``RESCUE_ARM=pace``: a ``rescue.miles.pace.PaceQueue``
            (default: built from ``--max-weight-staleness``, ``--rollout-batch-size`` and
            ``RESCUE_PACE_WINDOW``; no Miles needed).
        load_function: loads ``--dynamic-sampling-filter-path`` from its dotted path
            (default: Miles' ``miles.utils.misc.load_function``, imported only when the
            path is set).
        tracking: where the watchdog's census goes before it stops the run, a callable of
            the metrics (default: Miles' tracking at the step being drained, then finished;
            imported only then).

    The defaults are what import Miles; a caller that passes ``store`` and
    ``load_function`` runs the buffer without Miles (the unit tests do).
    """

    def __init__(
        self,
        input: Any,
        *,
        env: Mapping[str, str] | None = None,
        store: Any = None,
        load_function: Callable[[str], Any] | None = None,
        tracking: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        args = input.args
        self._args = args
        self._max_staleness = getattr(args, "max_weight_staleness", None)
        self.gate = Gate.from_env(env, max_staleness=self._max_staleness)
        rollout_fn = getattr(args, "rollout_function_path", None)
        if self.gate.arm is Arm.PACE and rollout_fn != PACE_ROLLOUT_FUNCTION:
            raise InputError(
                f"RESCUE_ARM=pace needs --rollout-function-path {PACE_ROLLOUT_FUNCTION} "
                f"(the rollout function is {rollout_fn!r}, which never waits for stragglers)"
            )
        self.pace = None  # the PaceQueue under RESCUE_ARM=pace (rescue.miles.pace)
        if self.gate.arm is Arm.PACE:
            from rescue.miles.pace import PaceQueue, pace_settings

            self.pace = store if store is not None else PaceQueue(pace_settings(args, env))
            self.pace.on_abandon = self._abandoned
            store = self.pace
        elif self.gate.arm is not Arm.DROP and self._max_staleness is None:
            logger.warning(
                "RESCUE_ARM=%s has no effect: --max-weight-staleness is not set, "
                "so no group is ever stale",
                self.gate.arm.value,
            )
        if (
            self.gate.arm is Arm.PROTECT
            and getattr(args, "async_unused_samples_handler", "drop") == "retry"
        ):
            logger.warning(
                "RESCUE_ARM=protect with --async-unused-samples-handler retry: a stale group "
                "that loses its coin is regenerated, so its prompt is trained 1 + (1 - a) times "
                "in expectation instead of once; use the default handler (drop) for an "
                "unbiased protect arm"
            )
        self._reward_key = getattr(args, "reward_key", None)
        self._unused_handler_fn: Callable[[list[Any]], None] = input.unused_handler_fn
        filter_path = getattr(args, "dynamic_sampling_filter_path", None)
        self._dynamic_filter = None
        if filter_path:
            self._dynamic_filter = (load_function or _miles("load_function"))(filter_path)
        self._store = _miles_store(input) if store is None else store
        self.census = Census(population=baseline_from_env(env))
        checkpoint, drawn = resume_point(args)
        retry = getattr(args, "async_unused_samples_handler", "drop") == "retry"
        self.lives = LifeLog(
            getattr(args, "save", None), checkpoint=checkpoint, drawn=drawn, retry=retry
        )
        if self.lives.life.resumed:
            self.census.restart(self.lives.life.carried, self.lives.life.unseen)
        self._trained: deque[GatedGroup] = deque()  # settled at the next get_metrics()
        self._blocked_puts = 0
        self._metric_aborted = 0
        self._metric_stale_dropped = 0
        self._metric_filter_drops: Counter[str] = Counter()
        self._pending: asyncio.Future | None = None  # a store get a cancelled get left
        self._tracking = tracking
        self.watchdog = Watchdog(
            WatchdogSettings.from_env(env), flush=self._flush, clock=_loop_clock(),
            diagnose=lambda: diagnosis(args),
        )  # fmt: skip
        logger.info(
            "rescue buffer: gate %s; watchdog: %s; %s",
            self.gate.describe(),
            self.watchdog.settings.describe(),
            self.lives.describe(),
        )

    async def put(self, input: Any) -> None:
        """Accept a finished group: no-result check, dynamic filter, then the FIFO store."""
        if self.pace is not None and self.pace.abandoned(input.prompt_group):
            # counted when pace abandoned it; its cancelled generation is done with
            self.pace.forget(input)
            self._unused_handler_fn(input.prompt_group)
            return
        group = input.group
        gid = group_id(group)
        records = group_records(group, reward_key=self._reward_key)
        self.census.enter(gid, records)  # every group counts in the generated view
        if (reason := no_result(records)) is not None:
            error = first_error(group)
            # Settle before the handler: a retry handler resets the samples in place.
            self.census.settle(gid, Bucket.ABORTED, records, reason=reason)
            self._metric_aborted += 1
            if self.pace is not None:
                self.pace.reject(input)
            self._unused_handler_fn(input.prompt_group)
            self.watchdog.observe(reason, error)
            return
        self.watchdog.observe(None)
        if self._dynamic_filter is not None:
            output = self._dynamic_filter(self._args, group)
            keep = output.keep if hasattr(output, "keep") else bool(output)
            if not keep:
                # Dropped, not recycled: no usable gradient signal (as in Miles).
                self.census.settle(gid, Bucket.FILTERED)
                if self.pace is not None:
                    self.pace.reject(input)
                if reason := getattr(output, "reason", None):
                    self._metric_filter_drops[reason] += 1
                return
        self._blocked_puts += 1
        try:
            await self._store.put(input)
        finally:
            self._blocked_puts -= 1

    async def get(self, current_version: int | None = None, **context: Any) -> Any:
        """The next group to train on (FIFO); stale groups pass the gate first."""
        while True:
            entry = await self._next_entry(current_version, **context)
            # No await from here on: a cancelled get() never loses a popped group.
            gated = gate_group(self.gate, entry.group, current_version)
            if gated.kept:
                if self.pace is not None and gated.bucket is Bucket.TRAINED_STALE:
                    logger.warning(
                        "pace: group %s arrived stale (staleness=%s > K=%s), trained and "
                        "counted trained_stale: the engines' version moved faster than the steps",
                        gated.gid,
                        gated.staleness,
                        self._max_staleness,
                    )
                self._trained.append(gated)
                return entry
            logger.info(
                "Dropped stale group %s (staleness=%s > max=%s, gate %s)",
                gated.gid,
                gated.staleness,
                self._max_staleness,
                self.gate.describe(),
            )
            # Settle before the handler: a retry handler resets the samples in place.
            gated.settle(self.census, reward_key=self._reward_key)
            self._metric_stale_dropped += 1
            self._unused_handler_fn(entry.prompt_group)

    async def _next_entry(self, current_version: int | None, **context: Any) -> Any:
        """The store's next group, checking the watchdog's idle limit while waiting."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(
                self._store.get(current_version=current_version, **context)
            )
        while True:
            done, _ = await asyncio.wait({self._pending}, timeout=self.watchdog.seconds_to_idle())
            if done:
                task, self._pending = self._pending, None
                return task.result()
            self.watchdog.check_idle()

    def get_metrics(self) -> dict[str, float]:
        """Miles' buffer metrics and the census of the step (window counters reset here)."""
        while self._trained:
            self._trained.popleft().settle(self.census, reward_key=self._reward_key)
        metrics = dict(self._store.get_metrics())
        metrics[_ABORTED_KEY] = self._metric_aborted
        metrics[_STALE_KEY] = self._metric_stale_dropped
        for reason, count in self._metric_filter_drops.items():
            metrics[f"{_FILTER_PREFIX}{reason}"] = count
        handed_out = self._pending is not None and self._pending.done()
        queued = int(metrics[QUEUE_SIZE_KEY]) + self._blocked_puts + int(handed_out)
        metrics.update(self.census.step_metrics(queue_size=queued))
        metrics[LIFE_KEY] = float(self.lives.life.life)
        self.lives.flush(self.census.totals(), self.census.buffered)
        self._metric_aborted = self._metric_stale_dropped = 0
        self._metric_filter_drops = Counter()
        return metrics

    def _abandoned(self, prompt_group: Any) -> None:
        """Pace abandoned a straggler: a group without a result, counted now."""
        gid = group_id(prompt_group)
        self.census.enter(gid)
        self.census.settle(gid, Bucket.ABORTED, reason="pace_straggler")
        self._metric_aborted += 1
        self.watchdog.observe("pace_straggler", f"group {gid} in flight past its deadline")

    def _flush(self, line: str) -> None:
        """The watchdog's flush: the census so far to the dashboard, before the stop."""
        logger.error(line)
        metrics = self.get_metrics()
        metrics[WATCHDOG_KEY] = 1.0
        (self._tracking or _miles_tracking(self._args, self.lives.rollout - 1))(metrics)


def _loop_clock() -> Callable[[], float]:
    """The running event loop's clock (Miles builds the buffer on its loop), else monotonic."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        return time.monotonic


def first_error(group: Any) -> str | None:
    """The first ``metadata["error"]`` of a group's samples (list-of-samples trajectories too)."""
    for item in group:
        for sample in item if isinstance(item, list) else [item]:
            error = (getattr(sample, "metadata", None) or {}).get("error")
            if error:
                return str(error)
    return None


def _miles_tracking(args: Any, rollout_id: int) -> Callable[[dict[str, float]], None]:
    """Log metrics with Miles' tracking at the rollout being drained, then finish it (the
    rollout id from the life's ledger: a resumed run's rollout manager has no
    ``start_rollout_id``)."""

    def log(metrics: dict[str, float]) -> None:
        from miles.utils.metric_utils import compute_rollout_step
        from miles.utils.tracking_utils import tracking

        tracking.log(
            args,
            {**metrics, "rollout/step": compute_rollout_step(args, rollout_id)},
            step_key="rollout/step",
        )
        tracking.finish_tracking()

    return log


def _miles(name: str) -> Any:
    """``DataBuffer``, ``DataBufferConstructorInput``, ``DefaultDataBuffer`` or
    ``load_function`` from Miles, with a clear error when Miles is not importable."""
    try:
        from miles.rollout import fully_async_data_buffer
        from miles.utils import misc
    except ImportError as e:
        raise ImportError(
            "rescue.miles.buffer.RescueDataBuffer needs Miles importable (put the Miles "
            f"sources on PYTHONPATH, e.g. the Ray runtime env): {e}"
        ) from e
    return getattr(misc if name == "load_function" else fully_async_data_buffer, name)


def _miles_store(input: Any) -> Any:
    """Miles' ``DefaultDataBuffer`` with staleness and the dynamic filter off, as the store."""
    _miles("DataBuffer").register(RescueDataBuffer)  # it implements Miles' DataBuffer contract
    store_args = Namespace(**vars(input.args))
    store_args.max_weight_staleness = None  # the gate decides staleness
    store_args.dynamic_sampling_filter_path = None  # applied in put, before the store
    ctor = _miles("DataBufferConstructorInput")
    return _miles("DefaultDataBuffer")(
        ctor(args=store_args, unused_handler_fn=input.unused_handler_fn)
    )
