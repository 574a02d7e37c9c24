"""slime fully-async rollout with the stale-group gate, the sample filter and the census.

Target of ``--rollout-function-path rescue.slime.rollout.generate_rollout`` (with slime's
``train_async.py``), in place of ``slime.rollout.fully_async_rollout.
generate_rollout_fully_async``.

Specification
-------------
One call of ``generate_rollout`` returns ``RolloutFnTrainOutput(groups, metrics)``: the
batch the drain (``rescue.slime.drain.Drain``, where the rules are) filled from slime's
``AsyncRolloutWorker`` queue, and the census step metrics (``rollout/census/*``), which
slime logs at ``rollout/step`` (``log_rollout_data``). Each call first declares, once per
run, the axes of rescue's keys on the process' wandb run (``rescue.tracking.metrics``;
nothing without one).

Settings (environment variables; ``launch/slime_arm.sh`` sets them in the Ray runtime
environment):

- ``RESCUE_ARM`` = drop (default) | never-drop | protect | pace, ``RESCUE_A``,
  ``RESCUE_SEED`` (``rescue.gate.Gate.from_env``);
- ``RESCUE_MAX_STALENESS`` = K (slime has no ``--max-weight-staleness``): a group is
  stale when its staleness exceeds K; unset, nothing is stale (slime's own behaviour,
  allowed only with never-drop); required by drop, protect and pace;
- ``RESCUE_PACE_WINDOW`` (pace only; ``rescue.pace``);
- ``RESCUE_BASELINE`` (``all`` or ``survivors``), the reward hook's setting, which the
  census's ``b_paid/masked`` follows;
- ``RESCUE_ESTIMATOR``, ``RESCUE_KAPPA``, ``RESCUE_TURN_TOKENS``, checked here at start;
- ``RESCUE_GENERATE_FUNCTION``: the function ``rescue.slime.generate.generate`` wraps;
- ``RESCUE_WATCHDOG_WINDOW``, ``RESCUE_WATCHDOG_MAX_NO_RESULT``, ``RESCUE_WATCHDOG_IDLE_S``
  (``rescue.watchdog``): when the drain stops the run because its groups stop having
  results, or none finishes. Before the stop, the census of the call so far is logged
  through slime's ``logging_utils.log`` at ``rollout/step`` (the dashboard shows why), and
  the stop line names the trigger, the dominant reason and the last errors.

What is refused at start, in one line each, is ``rescue.slime.checks``. The worker is
slime's, reporting what it requeues and loses (``rescue.slime.worker``); the current
version is the engines' (``rescue.slime.versions``, which says at start which source of
versions is in use). The drain (gate, census, worker) lives for the whole process; a
worker whose thread died is replaced, keeping the census, and the groups it had in flight
settle ``lost`` (reason ``worker_stopped``).

slime is imported only when the rollout function runs.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from rescue import flags
from rescue.census import Census
from rescue.errors import InputError
from rescue.gate import Arm, Gate
from rescue.reward import baseline_from_env
from rescue.slime.checks import ENV_MAX_STALENESS, check_slime_run, start_warnings
from rescue.slime.drain import Drain
from rescue.slime.versions import EngineVersions, engine_version
from rescue.slime.worker import RescueSource, WorkerEvents, rescue_worker_class
from rescue.tracking.metrics import declare_in_process
from rescue.watchdog import Watchdog, WatchdogSettings

__all__ = [
    "ENV_MAX_STALENESS",
    "Drain",
    "build_drain",
    "engine_version",
    "generate_rollout",
    "max_staleness_from_env",
]

logger = logging.getLogger(__name__)


#: ``RESCUE_MAX_STALENESS`` as a non-negative integer; unset or empty means no limit.
MAX_STALENESS = flags.count(
    ENV_MAX_STALENESS,
    None,
    0,
    allowed="a non-negative integer, or unset",
    shown="unset: nothing is stale, which only never-drop allows",
)
max_staleness_from_env = MAX_STALENESS.read


_DRAIN: Drain | None = None
_LOCK = threading.Lock()


def start_worker(args: Any, source: RescueSource) -> Any:
    """A started slime ``AsyncRolloutWorker`` (reporting to ``source``) with slime's
    concurrency (groups in flight)."""
    from slime.utils.http_utils import get_rollout_num_engines

    worker = rescue_worker_class()(
        args,
        source,
        concurrency=args.sglang_server_concurrency * get_rollout_num_engines(args),
    )
    worker.start()
    return worker


def build_drain(args: Any, data_buffer: Any) -> Drain:
    """The process's drain: the checked settings, slime's worker, the sample filter."""
    from slime.utils.misc import load_function

    from rescue.slime.pace import SlimePace

    gate = Gate.from_env(max_staleness=max_staleness_from_env())
    pace_settings = check_slime_run(args, gate)
    watchdog_settings = WatchdogSettings.from_env()
    for line in start_warnings(args):
        logger.warning("rescue: %s", line)
    pace = SlimePace(pace_settings) if pace_settings is not None else None
    path = getattr(args, "rollout_sample_filter_path", None)
    sample_filter = load_function(path) if path else None
    versions = EngineVersions(args)
    events = WorkerEvents()
    source = RescueSource(
        data_buffer, events, reward_key=getattr(args, "reward_key", None), admission=pace
    )
    logger.info(
        "rescue: slime fully-async rollout with gate %s; versions from %s; watchdog: %s",
        gate.describe() if gate.arm is not Arm.PACE else f"pace K={gate.max_staleness}",
        versions.probe(),
        watchdog_settings.describe(),
    )
    drain = Drain(
        start_worker(args, source),
        gate,
        census=Census(population=baseline_from_env()),
        current_version=versions,
        sample_filter=sample_filter,
        events=events,
        pace=pace,
    )
    drain.watchdog = Watchdog(watchdog_settings, flush=lambda line: _flush_census(drain, line))
    return drain


#: The rollout call the drain is filling (its id and slime's arguments), for the flush.
_CALL: dict[str, Any] = {}


def _flush_census(drain: Drain, line: str) -> None:
    """Before the watchdog stops the run: the census so far, logged as slime logs a step
    (groups the call had kept and not yet settled count as buffered)."""
    logger.error("%s", line)
    metrics = drain.census.step_metrics()
    args, rollout_id = _CALL.get("args"), _CALL.get("rollout_id")
    if args is None:
        return
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step

    metrics["rollout/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, metrics, step_key="rollout/step")


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> Any:
    """slime ``--rollout-function-path`` entry point: ``RolloutFnTrainOutput(groups, census)``."""
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
                old = _DRAIN.worker.data_buffer
                lost = old.lose_in_flight("worker_stopped")
                logger.warning(
                    "rescue: the slime rollout worker stopped with %d groups in flight; "
                    "starting a new one",
                    lost,
                )
                _DRAIN.worker = start_worker(
                    args,
                    RescueSource(
                        old.source, old.events, reward_key=old.reward_key, admission=old.admission
                    ),
                )
        drain = _DRAIN
    _CALL.update(args=args, rollout_id=rollout_id)
    declare_in_process()  # the census' axes on this process' wandb run, once per run
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
