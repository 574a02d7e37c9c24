"""The pace arm on Miles: the fully-async rollout waits for stragglers instead of dropping them.

Target of ``--rollout-function-path rescue.miles.pace.PaceRolloutFn`` (with Miles'
``train_async.py`` and without ``--fully-async``, which selects Miles' own rollout
function), together with ``--custom-async-data-buffer-path
rescue.miles.buffer.RescueDataBuffer``, ``--max-weight-staleness K`` and ``RESCUE_ARM=pace``.

Specification
-------------
``PaceRolloutFn`` is Miles' ``FullyAsyncRolloutFn`` (a subclass; Miles is not patched) with
the schedule of ``rescue.pace`` (read it for the rules and why they bound staleness):

- a step is one train call (one batch of ``--rollout-batch-size`` groups, ``B``); it
  starts the schedule's next step before Miles' drain runs;
- each group's generation starts only when the schedule admits it: in flight plus
  buffered plus taken this step stays below the window ``W`` (setting
  ``RESCUE_PACE_WINDOW``, groups; default ``(K + 1)·B``, allowed ``B..(K + 1)·B``). Miles'
  own in-flight budget (``--async-max-concurrent-samples``, default ``B`` groups) still
  applies; a submitted group waiting for admission holds its place in it;
- under ``RESCUE_ARM=pace`` ``RescueDataBuffer`` stores finished groups in a ``PaceQueue``
  instead of Miles' FIFO: every group that passes the buffer's abort check and dynamic
  filter is queued, and ``get`` returns the group the schedule chooses: the earliest
  deadline first, and, when every place left in the batch is owed to groups due within
  ``K`` steps that are still in flight, it blocks on them instead of taking another. A
  group the buffer rejects (without a result: to ``--async-unused-samples-handler``, as in
  every arm; filtered) frees its place. No group is ever dropped for staleness: a group that
  arrives stale anyway (the engines' version moved faster than one per step) is kept
  with weight 1 and counted ``trained_stale``, with a warning.

- a group in flight longer than the straggler deadline (``RESCUE_PACE_STRAGGLER_S``,
  ``rescue.pace``) is abandoned while the step waits: its place is freed, its generation
  cancelled (Miles' group task ends, the agent removes its sandbox), and the buffer counts
  it ``aborted`` with reason ``pace_straggler`` (and reports it to the watchdog); when its
  cancelled generation comes back it goes to the unused handler, not into the census a
  second time. While the step waits for the schedule's sake it logs which group(s) it
  waits for, at once and every 30 s.

Metrics (per step, with the census of ``RescueDataBuffer``), measured on the event loop's
clock (``loop.time()``):

- ``rollout/census/pace_wait_s``: every second the step waited because of the schedule:
  while a finished group was ready but owed elsewhere (``pace_wait_s/straggler``: the step
  blocks on an owed group in flight), or, with nothing it could take, while a generation
  Miles had submitted waited for admission (``pace_wait_s/window``: the window held back
  work a never-drop trainer would have started; always the case at ``K = 0`` or with the
  window at ``B``). Waiting with nothing ready and nothing held back is every arm's wait
  and is not counted;
- ``rollout/census/pace_wait_groups``: the takes that waited for the schedule's sake;
- ``rollout/census/pace_abandoned_groups``: groups abandoned at the straggler deadline;
- ``rollout/fully_async/queue_size``, ``avg_staleness``, ``max_staleness``: Miles' keys,
  computed as Miles does, so the arms share them.

Refused, each in one line naming the flag (they would drop groups, or never wait):
``--custom-async-data-buffer-path`` other than ``RescueDataBuffer`` (Miles' default
buffer drops groups staler than ``--max-weight-staleness``), ``RESCUE_ARM`` other than
``pace``, no ``--max-weight-staleness`` (the bound to keep), a window outside its range,
and what Miles' ``--fully-async`` refuses, since that flag is not given here:
``--colocate``, ``--partial-rollout``, ``--pause-generation-mode abort`` (it would abort
every group in flight at each weight update).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from rescue.errors import InputError
from rescue.gate import ARM, ENV_ARM, Arm
from rescue.miles.targets import BUFFER_PATH, PACE_ROLLOUT_FUNCTION, QUEUE_SIZE_KEY
from rescue.pace import (
    ABANDONED_KEY,
    WAIT_CAUSES,
    WAIT_GROUPS_KEY,
    WAIT_S_KEY,
    PaceSchedule,
    PaceSettings,
)
from rescue.samples import group_staleness

logger = logging.getLogger(__name__)

#: Seconds between the lines a waiting step logs.
LOG_EVERY_S = 30.0
_AVG_STALENESS_KEY = "rollout/fully_async/avg_staleness"
_MAX_STALENESS_KEY = "rollout/fully_async/max_staleness"

#: What Miles' ``--fully-async`` refuses and this rollout function must refuse itself:
#: (argument, refused when, the one line).
_MILES_REFUSALS = (
    ("colocate", bool, "--colocate: generation must go on while the trainer trains"),
    ("partial_rollout", bool, "--partial-rollout: Miles' fully-async rollout has none"),
    (
        "pause_generation_mode",
        lambda mode: mode == "abort",
        "--pause-generation-mode abort: every weight update would abort the groups in flight",
    ),
)


def pace_settings(args: Any, env: Mapping[str, str] | None = None) -> PaceSettings:
    """``K`` from ``--max-weight-staleness``, ``B`` from ``--rollout-batch-size``, ``W`` from
    ``RESCUE_PACE_WINDOW``; refused in one line when there is no ``K``."""
    k = getattr(args, "max_weight_staleness", None)
    if k is None:
        raise InputError(
            "RESCUE_ARM=pace needs --max-weight-staleness K: the staleness it keeps by waiting"
        )
    return PaceSettings.from_env(env, max_staleness=k, batch=args.rollout_batch_size)


def check_pace_run(args: Any, env: Mapping[str, str] | None = None) -> PaceSettings:
    """Every refusal of the module docstring, before anything starts; the settings."""
    prefix = f"--rollout-function-path {PACE_ROLLOUT_FUNCTION} cannot run with"
    buffer = getattr(args, "custom_async_data_buffer_path", None)
    if buffer != BUFFER_PATH:
        raise InputError(
            f"{prefix} --custom-async-data-buffer-path {buffer}; allowed: {BUFFER_PATH} "
            "(Miles' default buffer drops groups staler than --max-weight-staleness)"
        )
    arm = ARM.read(env)
    if arm is not Arm.PACE:
        raise InputError(f"{prefix} {ENV_ARM}={arm.value}; allowed: {ENV_ARM}=pace")
    for name, refused, line in _MILES_REFUSALS:
        if refused(getattr(args, name, None)):
            raise InputError(f"{prefix} {line}")
    return pace_settings(args, env)


class PaceQueue:
    """The schedule on asyncio: the admission gate and the store of finished groups.

    ``RescueDataBuffer`` builds it under ``RESCUE_ARM=pace`` and calls ``put`` / ``reject``
    / ``get`` / ``get_metrics``; ``PaceRolloutFn`` calls ``begin_step`` and ``admit``. A
    group is named by its prompt group (the object Miles submits and recycles), held
    here from admission until it is taken or rejected.

    Args:
        settings: ``K``, ``B`` and ``W`` (``pace_settings``).
    """

    def __init__(self, settings: PaceSettings) -> None:
        self.schedule = PaceSchedule(settings)
        self._admitted: dict[int, list[Any]] = {}
        self._since: dict[int, float] = {}  # admission time
        self._tasks: dict[int, asyncio.Task | None] = {}  # the generation's task
        self._abandoned: dict[int, list[Any]] = {}
        self._ready: dict[int, Any] = {}
        self._waiters: list[asyncio.Future] = []
        self._admission_waiters = 0
        #: Called with the prompt group of each abandoned group (the buffer counts it).
        self.on_abandon: Any = None
        self._reset_window()

    def _reset_window(self) -> None:
        self._wait_s = dict.fromkeys(WAIT_CAUSES, 0.0)
        self._wait_groups = 0
        self._abandoned_groups = 0
        self._staleness: list[int] = []

    # ── the rollout function's side ─────────────────────────────────────────

    def begin_step(self) -> None:
        """A train call starts: the schedule's next step, the window refills."""
        self.schedule.begin_step()
        self._changed()

    async def admit(self, prompt_group: list[Any]) -> None:
        """Wait until the schedule admits one more generation, then admit this one."""
        self._admission_waiters += 1
        if not self.schedule.can_admit():
            self._changed()  # a waiting step now waits because of the window
        try:
            while not self.schedule.can_admit():
                await self._change()
        finally:
            self._admission_waiters -= 1
        key = id(prompt_group)
        self.schedule.admit(key)
        self._admitted[key] = prompt_group
        self._since[key] = asyncio.get_running_loop().time()
        self._tasks[key] = asyncio.current_task()

    def abandoned(self, prompt_group: list[Any]) -> bool:
        """Whether this group was abandoned at the straggler deadline."""
        return id(prompt_group) in self._abandoned

    def forget(self, input: Any) -> None:
        """An abandoned group's generation came back: it is done with (not counted again)."""
        del self._abandoned[id(input.prompt_group)]

    # ── the buffer's side ───────────────────────────────────────────────────

    async def put(self, input: Any) -> None:
        """A finished group the buffer accepted: ready to be taken (never blocks)."""
        key = self._open_key(input)
        self.schedule.ready(key)
        self._ready[key] = input
        self._changed()

    def reject(self, input: Any) -> None:
        """A finished group the buffer rejected (no result, filtered): its place is free."""
        key = self._open_key(input)
        self.schedule.reject(key)
        self._close(key)
        self._changed()

    def _close(self, key: int) -> list[Any]:
        self._since.pop(key, None)
        self._tasks.pop(key, None)
        return self._admitted.pop(key)

    def _cause(self) -> str | None:
        """Why the step waits now, when it is the schedule's doing (module docstring)."""
        if self.schedule.held_back():
            return "straggler"
        if self._admission_waiters:
            return "window"
        return None

    async def get(self, current_version: int | None = None, **_: Any) -> Any:
        """The group the schedule chooses; blocks while it owes its places to stragglers."""
        loop = asyncio.get_running_loop()
        waited = False
        log_at = loop.time()
        while True:
            now = loop.time()
            self._abandon_overdue(now)
            if (key := self.schedule.choose()) is not None:
                break
            cause = self._cause()
            if cause is not None:
                waited = True
                if now >= log_at:
                    self._log_wait(now)
                    log_at = now + LOG_EVERY_S
            timeout = self._next_deadline(now)
            if cause is not None:
                timeout = min(timeout, log_at - now) if timeout is not None else log_at - now
            await self._change(timeout)
            if cause is not None:  # the state is constant until a change wakes the wait
                self._wait_s[cause] += loop.time() - now
        # No await from here on: a cancelled get() never loses a group.
        if waited:
            self._wait_groups += 1
        self.schedule.take(key)
        self._close(key)
        entry = self._ready.pop(key)
        if (staleness := group_staleness(entry.group, current_version)) is not None:
            self._staleness.append(staleness)
        return entry

    def get_metrics(self) -> dict[str, float]:
        """Queue size, the step's waits for stragglers, Miles' staleness keys; resets."""
        metrics: dict[str, float] = {
            QUEUE_SIZE_KEY: len(self._ready),
            WAIT_S_KEY: sum(self._wait_s.values()),
            WAIT_GROUPS_KEY: float(self._wait_groups),
            ABANDONED_KEY: float(self._abandoned_groups),
        }
        for cause, seconds in self._wait_s.items():
            metrics[f"{WAIT_S_KEY}/{cause}"] = seconds
        if self._staleness:
            metrics[_AVG_STALENESS_KEY] = sum(self._staleness) / len(self._staleness)
            metrics[_MAX_STALENESS_KEY] = max(self._staleness)
        self._reset_window()
        return metrics

    # ── stragglers ─────────────────────────────────────────────────────────

    def _next_deadline(self, now: float) -> float | None:
        """Seconds until the next group in flight reaches the straggler deadline."""
        limit = self.schedule.settings.straggler_s
        flying = self.schedule.in_flight_keys()
        if not limit or not flying:
            return None
        return max(0.0, min(self._since[k] for k in flying) + limit - now)

    def _abandon_overdue(self, now: float) -> None:
        limit = self.schedule.settings.straggler_s
        if not limit:
            return
        for key in self.schedule.in_flight_keys():
            if now - self._since[key] < limit:
                continue
            logger.warning(
                "pace: abandoning group %s: in flight %.0f s, past RESCUE_PACE_STRAGGLER_S=%g "
                "(no result, reason pace_straggler); the schedule goes on",
                _name(self._admitted[key]),
                now - self._since[key],
                limit,
            )
            task = self._tasks.get(key)
            self.schedule.reject(key)
            prompt_group = self._close(key)
            self._abandoned[key] = prompt_group
            self._abandoned_groups += 1
            if task is not None and not task.done():
                task.cancel()
            if self.on_abandon is not None:
                self.on_abandon(prompt_group)
            self._changed()

    def _log_wait(self, now: float) -> None:
        flying = self.schedule.in_flight_keys()
        limit = self.schedule.settings.straggler_s
        names = ", ".join(
            f"{_name(self._admitted[k])} ({now - self._since[k]:.0f} s"
            + (f" of {limit:g}" if limit else "")
            + ")"
            for k in flying[:8]
        )
        logger.warning(
            "pace: step %d waits for the schedule: group(s) in flight %s; %d finished group(s) "
            "held back, %d generation(s) waiting for admission",
            self.schedule.step,
            names or "none",
            self.schedule.held_back(),
            self._admission_waiters,
        )

    # ── waiting for a change of the schedule ─────────────────────────────────

    async def _change(self, timeout: float | None = None) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _open_key(self, input: Any) -> int:
        key = id(input.prompt_group)
        if key not in self._admitted:
            raise RuntimeError(
                "pace: a finished group reached the buffer without being admitted; the "
                f"rollout function must be {PACE_ROLLOUT_FUNCTION}"
            )
        return key


def _name(prompt_group: list[Any]) -> str:
    """A group's name in the log: its group id, with the task's instance id when known."""
    first = prompt_group[0] if prompt_group else None
    first = first[0] if isinstance(first, list) and first else first
    iid = (getattr(first, "metadata", None) or {}).get("instance_id")
    gid = getattr(first, "group_index", None)
    return f"{gid}" + (f" [{iid}]" if iid else "")


def _build_rollout_fn() -> type:
    try:
        from miles.rollout.fully_async_data_buffer import DataBufferInput
        from miles.rollout.fully_async_rollout import FullyAsyncRolloutFn
    except ImportError as e:
        raise ImportError(
            f"{PACE_ROLLOUT_FUNCTION} needs Miles importable (put the Miles sources on "
            f"PYTHONPATH, e.g. the Ray runtime env): {e}"
        ) from e

    class PaceRolloutFn(FullyAsyncRolloutFn):
        """Miles' ``FullyAsyncRolloutFn`` paced by ``rescue.pace`` (``rescue.miles.pace``)."""

        def __init__(self, input: Any) -> None:
            settings = check_pace_run(input.args)
            super().__init__(input)
            logger.info(
                "rescue pace: K=%d, batch %d groups, window %d groups",
                settings.max_staleness,
                settings.batch,
                settings.window,
            )

        def _pace(self) -> PaceQueue:
            pace = getattr(self._output, "pace", None)
            if not isinstance(pace, PaceQueue):
                raise InputError(
                    f"{PACE_ROLLOUT_FUNCTION} needs {BUFFER_PATH} with {ENV_ARM}=pace as the "
                    f"buffer; got {type(self._output).__name__}"
                )
            return pace

        async def _generate_group(self, prompt_group: list[Any]) -> Any:
            pace = self._pace()
            await pace.admit(prompt_group)
            try:
                return await super()._generate_group(prompt_group)
            except asyncio.CancelledError:
                if not pace.abandoned(prompt_group):
                    raise  # not pace's cancellation: the run's
                task = asyncio.current_task()
                if task is not None and hasattr(task, "uncancel"):
                    task.uncancel()
                # back to the buffer, which hands it to the unused handler (counted already)
                return DataBufferInput(prompt_group=prompt_group, group=prompt_group)

        async def _drain(self, input: Any) -> Any:
            # Miles built the buffer and the worker just before; the worker runs from the
            # drain's first await, so the step starts before any generation is admitted.
            self._pace().begin_step()
            return await super()._drain(input)

    PaceRolloutFn.__module__ = __name__
    PaceRolloutFn.__qualname__ = "PaceRolloutFn"
    return PaceRolloutFn


_ROLLOUT_FN: type | None = None


def __getattr__(name: str) -> Any:
    """``PaceRolloutFn``, built on first use: importing this module needs no Miles."""
    global _ROLLOUT_FN
    if name != "PaceRolloutFn":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _ROLLOUT_FN is None:
        _ROLLOUT_FN = _build_rollout_fn()
    return _ROLLOUT_FN
