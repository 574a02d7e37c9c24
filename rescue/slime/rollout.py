"""slime fully-async rollout with the stale-group gate, the sample filter and the census.

Target of ``--rollout-function-path rescue.slime.rollout.generate_rollout`` (with slime's
``train_async.py``), in place of ``slime.rollout.fully_async_rollout.
generate_rollout_fully_async``.

Specification
-------------
slime's ``AsyncRolloutWorker`` keeps generating groups in the background and queues the
finished ones; aborted groups go back to the data source before they reach the queue.
One call of ``generate_rollout`` drains that queue FIFO until it holds
``--rollout-batch-size`` kept groups:

1. each popped group *enters* the census with its records (counted in
   ``rollout/census/generated/*`` whatever becomes of it); a group without a result
   (``rescue.census.no_result``: a rollout classified ``infra_no_result``, e.g. a trial
   that timed out after its first model call, which slime would train as reward 0)
   settles ``aborted`` with the reason and is discarded, as slime discards what it cannot
   regenerate;
2. otherwise its staleness is ``current version - oldest weight version`` of its samples (``None``,
   never stale, when no sample carries a numeric version or the current version is
   unknown), and the gate (``rescue.gate.Gate.from_env``: ``RESCUE_ARM``, ``RESCUE_A``,
   ``RESCUE_SEED``) decides on its group id (``group_index``,
   ``rescue.samples.group_id``). A group is stale when staleness >
   ``RESCUE_MAX_STALENESS`` (slime has no ``--max-weight-staleness``; unset = nothing is
   stale, which is slime's own behaviour). A dropped group settles as ``dropped_stale``
   and is discarded, as Miles' default ``--async-unused-samples-handler drop`` does
   (slime cannot regenerate a finished group); the next queued group takes its place.
   Every sample of a protected group gets ``metadata["rescue_weight"] = 1/a``; any
   other kept group carries no weight (1);
3. the kept groups are sorted by ``index`` (slime's order), ``--rollout-sample-filter-path``
   runs on them (slime's own fully-async path skips it), and each settles as
   ``trained_fresh`` / ``trained_stale`` / ``trained_protected`` with its rollouts as they
   are after the filter (so masking is counted);
4. the census step metrics (``rollout/census/*``) are returned as the rollout metrics,
   which slime logs at ``rollout/step``; ``rollout/census/worker_queue`` is the number of
   finished groups left queued and ``rollout/census/current_version`` the version used.
   The census pays masked rollouts their group's baseline under ``RESCUE_BASELINE``
   (``all`` or ``survivors``), the setting of the reward hook.

Every popped group is settled within the call, so no entry stays buffered between calls.

The current version is the highest weight version the SGLang engines report
(``/get_weight_version`` on each worker listed by the router), and never less than the
highest version seen on a sample. When the engines cannot be asked, the highest version
seen is used: a lower bound, so staleness is then under-estimated, never over-estimated.

The drain (``Drain``) is framework-free; ``generate_rollout`` builds it around slime's
worker, importing slime only then.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rescue.census import PREFIX, Bucket, Census, no_result
from rescue.errors import InputError
from rescue.gate import Arm, Gate
from rescue.miles.reward import baseline_from_env
from rescue.samples import (
    GatedGroup,
    gate_group,
    group_id,
    group_newest_weight_version,
    group_records,
    iter_samples,
)

logger = logging.getLogger(__name__)

#: Environment variable holding the staleness limit K (slime has no flag for it).
ENV_MAX_STALENESS = "RESCUE_MAX_STALENESS"


class CompletedGroups(Protocol):
    """What the drain needs from slime's ``AsyncRolloutWorker``."""

    def get_completed_groups(self, limit: int | None = None) -> list[tuple[int, list]]: ...

    def queue_size(self) -> int: ...


def max_staleness_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """``RESCUE_MAX_STALENESS`` as a non-negative integer; unset or empty means no limit."""
    env = os.environ if env is None else env
    text = (env.get(ENV_MAX_STALENESS) or "").strip()
    if not text:
        return None
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 0:
        raise InputError(f"{ENV_MAX_STALENESS}={text!r}; allowed: a non-negative integer, or unset")
    return k


class Drain:
    """The framework-free drain: pop, gate, filter, count.

    Args:
        worker: slime's ``AsyncRolloutWorker`` or anything with its
            ``get_completed_groups(limit)`` and ``queue_size()``.
        gate: the stale-group gate (any arm but ``pace``, which is Miles-only: refused).
        census: the census the metrics come from (default a new one).
        current_version: callable returning the engines' weight version or ``None``
            (default: always ``None``, i.e. the highest version seen on a sample).
        sample_filter: ``fn(args, groups)`` run in place on the kept groups (default none).
        poll_s: sleep between empty polls of the worker (default 0.05 s, as slime).
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
    ) -> None:
        if gate.arm is Arm.PACE:
            raise InputError(
                "RESCUE_ARM=pace: slime's rollout has no pace schedule (pace is Miles' "
                "rescue.miles.pace.PaceRolloutFn); allowed here: drop, never-drop, protect"
            )
        self.worker = worker
        self.gate = gate
        self.census = census if census is not None else Census()
        self._engine_version = current_version or (lambda: None)
        self.sample_filter = sample_filter
        self.poll_s = poll_s
        self.max_seen_version: int | None = None

    def current_version(self, groups: Sequence[Sequence[Any]] = ()) -> int | None:
        """max(engine version, highest version seen on any sample so far)."""
        for group in groups:
            v = group_newest_weight_version(group)
            if v is not None and (self.max_seen_version is None or v > self.max_seen_version):
                self.max_seen_version = v
        engine = self._engine_version()
        candidates = [v for v in (engine, self.max_seen_version) if v is not None]
        return max(candidates) if candidates else None

    def decide(
        self, args: Any, group: Sequence[Any], current_version: int | None
    ) -> GatedGroup | None:
        """Enter a popped group in the census; settle it if it has no result, else gate it.

        A group without a result (``None`` returned) and a dropped group are settled here;
        a kept group carries its weight and settles in ``collect``.
        """
        gid = group_id(group)
        records = group_records(group, reward_key=getattr(args, "reward_key", None))
        self.census.enter(gid, records)  # every group counts in the generated view
        if (reason := no_result(records)) is not None:
            self.census.settle(gid, Bucket.ABORTED, records, reason=reason)
            return None
        gated = gate_group(self.gate, group, current_version)
        if not gated.kept:
            gated.settle(self.census, reward_key=getattr(args, "reward_key", None))
        return gated

    def collect(self, args: Any, target: int) -> tuple[list[list], dict[str, float]]:
        """``target`` kept groups, sorted by ``index`` and filtered, and the step metrics."""
        kept: list[GatedGroup] = []
        current: int | None = None
        while len(kept) < target:
            popped = self.worker.get_completed_groups(limit=target - len(kept))
            if not popped:
                time.sleep(self.poll_s)
                continue
            current = self.current_version([group for _, group in popped])
            for _, group in popped:
                if (gated := self.decide(args, group, current)) is not None and gated.kept:
                    kept.append(gated)
        kept.sort(key=lambda gated: _first_index(gated.group))
        groups = [gated.group for gated in kept]
        if self.sample_filter is not None:
            self.sample_filter(args, groups)
        reward_key = getattr(args, "reward_key", None)
        for gated in kept:  # after the filter, so the records carry its masks
            gated.settle(self.census, reward_key=reward_key)
        metrics = self.census.step_metrics(PREFIX)
        metrics[f"{PREFIX}worker_queue"] = float(self.worker.queue_size())
        if current is not None:
            metrics[f"{PREFIX}current_version"] = float(current)
        return groups, metrics


def engine_version(args: Any, timeout_s: float = 2.0) -> int | None:
    """The highest numeric weight version reported by the engines behind slime's router.

    ``None`` when the router or an engine cannot be asked (warned once per process) or
    reports no numeric version.
    """
    global _WARNED
    ip = getattr(args, "sglang_router_ip", None)
    port = getattr(args, "sglang_router_port", None)
    if not ip or not port:
        return None
    try:
        workers = _get_json(f"http://{ip}:{port}/workers", timeout_s)["workers"]
        reported = [
            str(
                _get_json(f"{w['url'].rstrip('/')}/get_weight_version", timeout_s)["weight_version"]
            )
            for w in workers
        ]
    except Exception as e:  # any failure: fall back to the versions seen on samples
        if not _WARNED:
            logger.warning(
                "rescue: cannot read the engines' weight version (%r); using the highest "
                "version seen on a sample",
                e,
            )
            _WARNED = True
        return None
    numeric = [int(v) for v in reported if v.strip().isdigit()]
    return max(numeric) if numeric else None


_WARNED = False


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


_DRAIN: Drain | None = None
_LOCK = threading.Lock()


def start_worker(args: Any, data_buffer: Any) -> Any:
    """A started slime ``AsyncRolloutWorker`` with slime's concurrency (groups in flight)."""
    from slime.rollout.fully_async_rollout import AsyncRolloutWorker
    from slime.utils.http_utils import get_rollout_num_engines

    worker = AsyncRolloutWorker(
        args,
        data_buffer,
        concurrency=args.sglang_server_concurrency * get_rollout_num_engines(args),
    )
    worker.start()
    return worker


def build_drain(args: Any, data_buffer: Any) -> Drain:
    """The process's drain: the gate from the settings, slime's worker, the sample filter."""
    from slime.utils.misc import load_function

    gate = Gate.from_env(max_staleness=max_staleness_from_env())
    if gate.arm is not Arm.DROP and gate.max_staleness is None:
        logger.warning(
            "RESCUE_ARM=%s has no effect: %s is not set, so no group is ever stale",
            gate.arm.value,
            ENV_MAX_STALENESS,
        )
    path = getattr(args, "rollout_sample_filter_path", None)
    sample_filter = load_function(path) if path else None
    logger.info("rescue: slime fully-async rollout with gate %s", gate.describe())
    return Drain(
        start_worker(args, data_buffer),
        gate,
        census=Census(population=baseline_from_env()),
        current_version=lambda: engine_version(args),
        sample_filter=sample_filter,
    )


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> Any:
    """slime ``--rollout-function-path`` entry point: ``RolloutFnTrainOutput(groups, census)``.

    The drain (gate, census, worker) lives for the whole process; a worker whose thread
    died is replaced, keeping the census.
    """
    if evaluation:
        raise InputError(
            "rescue.slime.rollout.generate_rollout does not evaluate (as slime's fully-async "
            "rollout); set --eval-function-path slime.rollout.sglang_rollout.generate_rollout"
        )
    if not getattr(args, "rollout_global_dataset", True):
        raise InputError(
            "rescue.slime.rollout.generate_rollout pulls prompts from slime's global dataset; "
            "remove --disable-rollout-global-dataset"
        )
    from slime.rollout.base_types import RolloutFnTrainOutput

    global _DRAIN
    with _LOCK:
        if _DRAIN is None:
            _DRAIN = build_drain(args, data_buffer)
        else:
            thread = getattr(_DRAIN.worker, "worker_thread", None)
            if thread is None or not thread.is_alive():
                logger.warning("rescue: the slime rollout worker stopped; starting a new one")
                _DRAIN.worker = start_worker(args, data_buffer)
        drain = _DRAIN
    groups, metrics = drain.collect(args, target=args.rollout_batch_size)
    logger.info(
        "rescue: rollout %d kept %d groups, queue %d",
        rollout_id,
        len(groups),
        drain.worker.queue_size(),
    )
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def _stop() -> None:
    global _DRAIN
    with _LOCK:
        if _DRAIN is not None and hasattr(_DRAIN.worker, "stop"):
            _DRAIN.worker.stop()
        _DRAIN = None


atexit.register(_stop)


def _first_index(group: Sequence[Any]) -> int:
    for s in iter_samples(group):
        idx = getattr(s, "index", None)
        if idx is not None:
            return int(idx)
    return 0
