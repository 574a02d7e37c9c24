"""The sample-level census, logged beside Miles' own rollout metrics.

Target of ``--custom-rollout-log-function-path rescue.miles.log.log_rollout``.

Specification
-------------
Miles calls ``log_rollout(rollout_id, args, samples, rollout_extra_metrics,
rollout_time)`` once per step with the flat, trimmed list of samples about to be trained
(after ``--rollout-sample-filter-path``, so ``remove_sample`` is set; the loss masks are
not zeroed yet). This function:

1. splits the samples into trajectories (consecutive samples sharing ``group_index`` and
   ``rollout_id``) and computes ``rescue.census.outcome_metrics`` over them under
   ``rollout/census/samples/``: count and rate per outcome, turn mean/p50/p90 per
   outcome, cap-hit rate, masked fraction (overall and per outcome), realized baseline
   ``b_realized`` (mean reward of unmasked trajectories), ran-tests rate of solved ones;
   ``b_all`` (the all-members baseline, budget failures scored 0) and ``b_prior`` (``b_all``
   pooled over the ``rescue.census.PRIOR_STEPS`` steps this process logged before:
   ``rescue.census.PriorB``, the x axis of the trends against b);
2. adds ``rollout/census/samples/weighted_samples`` (samples whose ``rescue_weight`` is
   not 1) and ``rollout/census/samples/weight_mean`` (mean weight over samples);
3. adds ``rollout/census/samples/b_paid/masked`` (and ``.../b_paid/masked_rollouts``): the
   mean over the loss-masked trajectories of their own group's baseline under
   ``RESCUE_BASELINE``, the groups as the reward hook forms them; computed by
   ``rescue.census.Census``, the group census' own code, on this batch;
4. under ``RESCUE_TRUNCATED_REWARD=zero``, adds ``rollout/census/samples/truncated_reward_zeroed``:
   the rollouts whose nonzero reward the reward hook scores 0 because they are budget
   failures (``rescue.reward.zero_budget_failures``, the function the hook calls);
5. adds the gradient share by difficulty bucket (``rescue.share``) under
   ``rollout/census/samples/``: each trajectory's scalar weight is what the reward hook
   gives it (``rescue.miles.reward.post_process_rewards``, the same call; 0 when it is
   loss-masked); under ``RESCUE_ESTIMATOR=turn`` it is the group-normalized reward the
   turn-reached baseline refines without changing its expectation (the baseline is
   prefix-measurable), so the expected weight on each prompt is the same. Left out when a
   rollout has no result (such a group never trains) and when ``args`` has no
   ``advantage_estimator`` (not a training run's arguments);
6. under score centering (``rescue.miles.sc_flags.sc_enabled``: the run's loss is
   ``rescue.miles.sc_loss.policy_loss``), publishes every trained sample's recorded top-K
   heads for the trainer (``rescue.miles.topk_store.publish``; a trained sample without
   them stops the run; under the matched control, the samples of its reference copy, which
   trains the capped trajectories the mask removed) and logs ``rollout/rescue/sc/published`` (entries) and
   ``rollout/rescue/sc/head_positions`` (positions with a head);
7. logs them with Miles' tracking at ``rollout/step`` (``compute_rollout_step``, so the
   step matches Miles' own rollout metrics, with ``--wandb-always-use-train-step`` too),
   after declaring, once per run, the axes of rescue's keys on this process' wandb run
   (``rescue.tracking.metrics``: the census against ``rollout/step``, ``train/rescue/*``
   against ``train/step``; nothing without a wandb run);
8. returns ``False``, so Miles' default logging, including the buffer's ``get_metrics()``
   (``rollout/fully_async/*`` and the group census ``rollout/census/*``), still runs.

Keys never collide with the buffer's: the buffer's census uses ``rollout/census/groups/*``,
``rollout/census/outcome/*`` and the like; everything here is under
``rollout/census/samples/``. The difference between the two: the buffer's census covers
the groups it settled this step; this one covers exactly the batch Miles trains, and it
also runs when the batch is replayed with ``--load-debug-rollout-data`` (no buffer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rescue.census import PriorB, outcome_metrics
from rescue.samples import reward_value, rollout_record, trajectories_of, weight_of
from rescue.tracking.metrics import declare_in_process

#: Prefix of every key this function logs.
PREFIX = "rollout/census/samples/"
#: Miles' step key for rollout metrics.
STEP_KEY = "rollout/step"
#: ``b_prior`` of the batches this process logged (one trainer per process).
_PRIOR = PriorB()


def sample_census(samples: Sequence[Any], *, reward_key: str | None = None) -> dict[str, float]:
    """The metrics of steps 1-2 above for a flat list of samples (no Miles needed)."""
    records = [rollout_record(t, reward_key=reward_key) for t in trajectories_of(samples)]
    metrics = outcome_metrics(records, PREFIX)
    weights = [weight_of(s) for s in samples]
    metrics[f"{PREFIX}weighted_samples"] = float(sum(w != 1.0 for w in weights))
    if weights:
        metrics[f"{PREFIX}weight_mean"] = sum(weights) / len(weights)
    return metrics


def paid_baseline(args: Any, samples: Sequence[Any]) -> dict[str, float]:
    """Step 3 above: the census' ``b_paid/masked`` of this batch, under ``PREFIX``."""
    from rescue.census import Bucket, Census
    from rescue.reward import baseline_from_env, group_ids, rollouts

    reward_key = getattr(args, "reward_key", None)
    groups: dict[Any, list] = {}
    for (g, _), rows in rollouts(group_ids(args, samples), samples).items():
        groups.setdefault(g, []).append(
            rollout_record([samples[i] for i in rows], reward_key=reward_key)
        )
    census = Census(population=baseline_from_env())
    for g, records in groups.items():
        census.enter(g)
        census.settle(g, Bucket.TRAINED_FRESH, records)
    metrics = census.step_metrics(PREFIX)
    keys = (f"{PREFIX}b_paid/masked", f"{PREFIX}b_paid/masked_rollouts")
    return {k: metrics[k] for k in keys if k in metrics}


def truncated_reward_census(args: Any, samples: Sequence[Any]) -> dict[str, float]:
    """Step 4 above: ``{}`` unless ``RESCUE_TRUNCATED_REWARD=zero``."""
    from rescue.reward import group_ids, truncated_reward_from_env, zero_budget_failures

    if truncated_reward_from_env() != "zero":
        return {}
    reward_key = getattr(args, "reward_key", None)
    raw = [reward_value(s, reward_key) for s in samples]
    _, zeroed = zero_budget_failures(
        group_ids(args, samples), samples, raw, reward_key=reward_key, setting="zero"
    )
    return {f"{PREFIX}truncated_reward_zeroed": float(zeroed)}


def gradient_share(args: Any, samples: Sequence[Any]) -> dict[str, float]:
    """Step 5 above: ``rescue.share.difficulty_share`` of this batch, under ``PREFIX``."""
    from rescue.outcomes import Outcome
    from rescue.reward import (
        STD_ESTIMATORS,
        baseline_from_env,
        group_ids,
        normalize_rewards,
        post_process_rewards,
        rollouts,
        sample_weights,
    )
    from rescue.share import difficulty_share
    from rescue.turn_reward import estimator_from_env

    reward_key = getattr(args, "reward_key", None)
    groups = group_ids(args, samples)
    rows = rollouts(groups, samples)
    records = {
        k: rollout_record([samples[i] for i in r], reward_key=reward_key) for k, r in rows.items()
    }
    if (
        not samples
        or getattr(args, "advantage_estimator", None) is None
        or any(r.outcome is Outcome.INFRA_NO_RESULT for r in records.values())
    ):
        return {}
    if estimator_from_env() == "turn":
        from rescue.reward import zero_budget_failures

        raw = [reward_value(s, reward_key) for s in samples]
        raw, _ = zero_budget_failures(groups, samples, raw, reward_key=reward_key)
        std = args.advantage_estimator in STD_ESTIMATORS and getattr(
            args, "grpo_std_normalization", True
        )
        values = normalize_rewards(
            args,
            samples,
            [float(r) for r in raw],
            population=baseline_from_env(),
            std_normalize=std,
            groups=groups,
        )
        weights = list(values * sample_weights(samples))
    else:
        _, weights = post_process_rewards(args, samples)
    keys = list(rows)
    trained = [not all(getattr(samples[i], "remove_sample", False) for i in rows[k]) for k in keys]
    return difficulty_share(
        [k[0] for k in keys],
        [records[k].outcome is Outcome.SOLVED for k in keys],
        [float(weights[rows[k][0]]) * t for k, t in zip(keys, trained, strict=True)],
        prefix=PREFIX,
    )


def publish_heads(rollout_id: int, args: Any, samples: Sequence[Any]) -> dict[str, float]:
    """Step 6 above: ``{}`` unless the run trains with score centering. Under the matched
    control the heads of its reference copy are published: that copy trains every position
    the mask arm's copy trains and, unmasked, the capped trajectories the mask removed."""
    from rescue.miles.sc_flags import check_sc_flags, sc_enabled

    if not sc_enabled(args):
        return {}
    from rescue.miles.matched import matched_enabled, reference_copy
    from rescue.miles.topk_store import publish

    check_sc_flags(args)
    if matched_enabled(args):
        samples = reference_copy(samples, reward_key=getattr(args, "reward_key", None))
    published, positions = publish(rollout_id, samples)
    return {
        "rollout/rescue/sc/published": float(published),
        "rollout/rescue/sc/head_positions": float(positions),
    }


def log_rollout(
    rollout_id: int,
    args: Any,
    samples: Sequence[Any],
    rollout_extra_metrics: dict[str, float] | None,
    rollout_time: float,
) -> bool:
    """Log the sample-level census at ``rollout/step``; returns False (Miles logs too).

    ``rollout_extra_metrics`` (the buffer's metrics, ``None`` on replay) and
    ``rollout_time`` are left to Miles' default logging.
    """
    from miles.utils.metric_utils import compute_rollout_step
    from miles.utils.tracking_utils import tracking

    reward_key = getattr(args, "reward_key", None)
    metrics: dict[str, float] = sample_census(samples, reward_key=reward_key)
    _PRIOR.observe(metrics, PREFIX)
    metrics.update(paid_baseline(args, samples))
    metrics.update(truncated_reward_census(args, samples))
    metrics.update(gradient_share(args, samples))
    metrics.update(publish_heads(rollout_id, args, samples))
    metrics[STEP_KEY] = compute_rollout_step(args, rollout_id)
    declare_in_process()
    tracking.log(args, metrics, step_key=STEP_KEY)
    return False
