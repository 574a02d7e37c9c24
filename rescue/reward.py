"""Reward post-process: group normalization over a chosen baseline population, then 1/a.

The reward hook Miles and slime share: Miles' ``--custom-reward-post-process-path
rescue.miles.reward.post_process_rewards`` and slime's ``--custom-reward-post-process-path
rescue.reward.post_process_rewards`` (both call ``f(args, samples) -> (raw_rewards,
rewards)`` on the flat list of samples, and both take ``rewards`` as the GRPO advantage of
each sample). Framework-free: it reads samples through ``rescue.samples``.

Specification
-------------
With ``RESCUE_BASELINE=all`` and every ``rescue_weight`` equal to 1 the output is Miles'
own normalization (``_post_process_rewards``):

- groups are the samples sharing a ``group_index`` (when some sample has none: blocks of
  ``--n-samples-per-prompt`` if the batch is exactly ``n_samples_per_prompt *
  rollout_batch_size`` samples, else the whole batch is one group);
- within a group, samples sharing a ``rollout_id`` (else an ``index``) are siblings of one
  rollout and must share one reward (``ValueError`` otherwise); each rollout counts once;
- estimators ``grpo``, ``gspo``, ``cispo`` (slime only) and
  ``reinforce_plus_plus_baseline`` subtract the group mean; ``grpo``, ``gspo`` and
  ``cispo`` then divide by (unbiased std + 1e-6) when the group has more than one rollout
  and std > 0, unless ``--disable-grpo-std-normalization``;
- ``--disable-rewards-normalization``, or any other estimator: rewards pass through.

The computation is ``rescue.advantages.group_advantages``, the normalizer the simulator
uses too, in float64; Miles computes in float32, so the two agree to float32 rounding
(a few units in the last place of float32), and Miles ships ``rewards`` to the trainer
as float32 either way.

What this hook adds:

1. ``RESCUE_BASELINE`` = ``all`` (default; every rollout of the group votes in the mean
   and std, masked ones included, as in Miles) or ``survivors`` (only rollouts with at
   least one sample without ``remove_sample``). It has no effect where Miles would not
   normalize.
2. Each sample's normalized reward is multiplied by ``metadata["rescue_weight"]``
   (default 1; the protect arm's ``1/a``), *after* normalization, so no normalization
   can undo it. For grpo/gspo the reward is the advantage and the policy-gradient loss
   is positively homogeneous in it, so this scales exactly that sample's
   policy-gradient term. The KL-loss, entropy and on-policy-distillation terms are not
   weighted.
3. While any weight differs from 1, ``--normalize-advantages`` (it re-centers and
   rescales advantages across the batch) and estimators other than grpo/gspo are refused
   with a ``ValueError``.
4. ``RESCUE_TRUNCATED_REWARD`` = ``keep`` (default) or ``zero``: under ``zero`` every
   rollout ``rescue.outcomes`` classifies as a budget failure is scored 0 before anything
   else, and ``raw_rewards`` returns the scores used (below: R = 0 for budget failures).
5. ``RESCUE_ESTIMATOR`` = ``group`` (default; everything above) or ``turn``: per-token
   advantages with the turn-reached baseline, delivered through the per-token channel,
   with every scalar reward 0 (``rescue.turn_reward``; settings ``RESCUE_KAPPA``,
   ``RESCUE_TURN_TOKENS``). It composes with 1 to 4.

R = 0 for budget failures (``RESCUE_TRUNCATED_REWARD``)
--------------------------------------------------------
Miles' and slime's graders score the text they get, and a response cut by the length limit
can still score 1 (``math`` grades the cut text). With ``RESCUE_TRUNCATED_REWARD=zero`` the
reward hook scores every rollout that ``rescue.outcomes`` classifies as a budget failure
(turn cap, length or context limit, repeated format errors) ``R = 0``, before any
normalization, so the R = 0 arm and the mask arm train on the same raw rewards and the
mask arm's masked rollouts vote 0 in the group baseline.

- A rollout is the samples sharing ``(group, rollout_id)`` (``rollout_id`` else ``index``,
  as Miles keys it); its outcome is that of ``rescue.samples.rollout_record`` over
  those samples in list order, the one classifier every part of rescue uses.
- ``keep`` (the default) leaves every reward as the grader set it.
- The count of rollouts whose reward this changed (a nonzero reward forced to 0) is the
  census key ``rollout/census/samples/truncated_reward_zeroed``, logged by
  ``rescue.miles.log`` through ``zeroed_rollouts`` on the batch about to be trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rescue import flags
from rescue.errors import InputError
from rescue.outcomes import Outcome
from rescue.samples import WEIGHT_KEY, rollout_key, rollout_record, views
from rescue.turn_reward import estimator_from_env, turn_advantages

#: Environment variable choosing the baseline population.
ENV_BASELINE = "RESCUE_BASELINE"
#: Allowed values of ``RESCUE_BASELINE``; the first is the default.
BASELINES = ("all", "survivors")

#: Estimators whose rewards Miles/slime center on the group mean.
MEAN_ESTIMATORS = frozenset({"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"})
#: Estimators whose centered rewards are also divided by the group std.
STD_ESTIMATORS = frozenset({"grpo", "gspo", "cispo"})
#: Estimators for which a scaled reward is a scaled policy-gradient loss.
WEIGHTED_ESTIMATORS = frozenset({"grpo", "gspo"})
#: The std guard Miles and slime add to the denominator.
STD_EPS = 1e-6


#: ``RESCUE_BASELINE`` (default ``all``).
BASELINE = flags.choice(ENV_BASELINE, BASELINES)
baseline_from_env = BASELINE.read


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """Miles' reward normalization over the ``RESCUE_BASELINE`` population, times the weights.

    Args:
        args: the framework's parsed arguments; reads ``advantage_estimator``,
            ``rewards_normalization``, ``grpo_std_normalization``, ``normalize_advantages``,
            ``reward_key`` (through ``Sample.get_reward_value``), ``n_samples_per_prompt``
            and ``rollout_batch_size``.
        samples: the flat list of samples of one training step.

    Returns:
        ``(raw_rewards, rewards)``: the samples' scalar rewards as Miles reads them, and
        the normalized rewards multiplied by each sample's ``metadata["rescue_weight"]``.
        Only the policy-gradient term sees the weight: the KL-loss, entropy and
        on-policy-distillation terms of a weighted sample are not weighted.
    """
    population = baseline_from_env()
    turn = estimator_from_env() == "turn"
    raw_rewards = [s.get_reward_value(args) for s in samples]
    read = views(samples)  # the one reading of the samples; everything below reads the views
    groups = group_ids(args, read)
    raw_rewards, _ = zero_budget_failures(
        groups, read, raw_rewards, reward_key=getattr(args, "reward_key", None)
    )
    weights = sample_weights(read)
    weighted = bool(np.any(weights != 1.0))
    if weighted:
        check_weighting_supported(args)
    estimator = args.advantage_estimator
    if turn:
        values = _finite_rewards(raw_rewards, read)
        return raw_rewards, turn_advantages(
            args,
            samples,
            values,
            rollouts(groups, read),
            weights,
            read=read,
            population=population,
            std_normalize=estimator in STD_ESTIMATORS
            and getattr(args, "grpo_std_normalization", True),
            eps=STD_EPS,
        )
    if estimator not in MEAN_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        if not weighted:
            return raw_rewards, raw_rewards
        values = _finite_rewards(raw_rewards, read)
        return raw_rewards, (values * weights).tolist()
    values = _finite_rewards(raw_rewards, read)
    normalized = normalize_rewards(
        args,
        read,
        values,
        population=population,
        std_normalize=estimator in STD_ESTIMATORS and getattr(args, "grpo_std_normalization", True),
        groups=groups,
    )
    return raw_rewards, (normalized * weights).tolist()


def normalize_rewards(
    args: Any,
    samples: Sequence[Any],
    rewards: np.ndarray,
    *,
    population: str = "all",
    std_normalize: bool = True,
    groups: Sequence[Any] | None = None,
) -> np.ndarray:
    """Group-normalized rewards, one shared value per rollout broadcast to its siblings.

    ``population`` is ``all`` (default) or ``survivors``; ``std_normalize`` (default True)
    divides by std + 1e-6; ``groups`` is each sample's group (default ``group_ids``). No
    weights are applied here.
    """
    from rescue.advantages import group_advantages

    if population not in BASELINES:
        raise InputError(f"{ENV_BASELINE}={population!r}; allowed: {', '.join(BASELINES)}")
    n = len(samples)
    if n == 0:
        return np.zeros(0)
    # One row per rollout: (group, rollout key) -> first sample position.
    rollout_of = np.empty(n, dtype=np.int64)
    rows: dict[tuple[Any, Any], int] = {}
    row_group: list[int] = []
    row_reward: list[float] = []
    row_kept: list[bool] = []
    groups = group_ids(args, samples) if groups is None else groups
    for i, (s, g) in enumerate(zip(samples, groups, strict=True)):
        rollout = rollout_key(s)
        key = (g, ("row", i) if rollout is None else rollout)
        r = rows.get(key)
        if r is None:
            r = rows[key] = len(row_group)
            row_group.append(g)
            row_reward.append(float(rewards[i]))
            row_kept.append(False)
        elif rewards[i] != row_reward[r]:
            siblings = [*np.flatnonzero(rollout_of[:i] == r).tolist(), i]
            raise InputError(
                f"all samples of rollout {key[1]!r} in group {g!r} must share one reward; "
                f"samples {siblings} have rewards {[float(rewards[j]) for j in siblings]}"
            )
        rollout_of[i] = r
        row_kept[r] = row_kept[r] or not bool(getattr(s, "remove_sample", False))
    advantages = group_advantages(
        np.asarray(row_reward, dtype=float),
        np.asarray(row_group),
        population=population,
        kept=np.asarray(row_kept, dtype=bool),
        std_normalize=std_normalize,
        eps=STD_EPS,
    )
    return np.asarray(advantages, dtype=float)[rollout_of]


def group_ids(args: Any, samples: Sequence[Any]) -> list[int]:
    """The reward group of each sample, as Miles assigns it (module docstring)."""
    indices = [getattr(s, "group_index", None) for s in samples]
    if all(g is not None for g in indices):
        return [int(g) for g in indices]
    n_per_prompt = getattr(args, "n_samples_per_prompt", None)
    batch = getattr(args, "rollout_batch_size", None)
    if n_per_prompt and batch and len(samples) == n_per_prompt * batch:
        return [i // n_per_prompt for i in range(len(samples))]
    return [0] * len(samples)


def sample_weights(samples: Sequence[Any]) -> np.ndarray:
    """``metadata["rescue_weight"]`` of each sample (default 1); must be finite and > 0."""
    weights = np.ones(len(samples))
    for i, s in enumerate(samples):
        metadata = getattr(s, "metadata", None) or {}
        if WEIGHT_KEY not in metadata:
            continue
        w = metadata[WEIGHT_KEY]
        try:
            w = float(w)
        except (TypeError, ValueError):
            w = math.nan
        if not (math.isfinite(w) and w > 0):
            raise InputError(
                f"sample {i}: metadata[{WEIGHT_KEY!r}]={metadata[WEIGHT_KEY]!r}; "
                "allowed: a finite number > 0"
            )
        weights[i] = w
    return weights


def check_weighting_supported(args: Any) -> None:
    """Refuse settings under which a scaled reward is not a scaled policy-gradient loss."""
    if getattr(args, "normalize_advantages", False):
        raise InputError(
            f"--normalize-advantages re-centers and rescales advantages across the batch and "
            f"would undo metadata[{WEIGHT_KEY!r}] != 1 (protected stale groups); remove the "
            "flag, or run an arm without weights (RESCUE_ARM=drop or never-drop)"
        )
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in WEIGHTED_ESTIMATORS:
        raise InputError(
            f"--advantage-estimator {estimator} with metadata[{WEIGHT_KEY!r}] != 1 (protected "
            f"stale groups); allowed: {', '.join(sorted(WEIGHTED_ESTIMATORS))}"
        )


def _finite_rewards(raw_rewards: Sequence[Any], samples: Sequence[Any]) -> np.ndarray:
    values = np.empty(len(raw_rewards))
    for i, r in enumerate(raw_rewards):
        try:
            values[i] = float(r)
        except (TypeError, ValueError):
            values[i] = math.nan
        if not math.isfinite(values[i]):
            g = getattr(samples[i], "group_index", None)
            raise InputError(
                f"sample {i} (group_index={g}): reward {r!r} is not a finite number "
                "(set --reward-key when the reward is a dict)"
            )
    return values


# ── R = 0 for budget failures ────────────────────────────────────────────────────────────

#: Environment variable: what a budget failure's reward becomes.
ENV_TRUNCATED_REWARD = "RESCUE_TRUNCATED_REWARD"
#: Allowed values of ``RESCUE_TRUNCATED_REWARD``; the first is the default.
TRUNCATED_REWARDS = ("keep", "zero")


#: ``RESCUE_TRUNCATED_REWARD`` (default ``keep``).
TRUNCATED_REWARD = flags.choice(ENV_TRUNCATED_REWARD, TRUNCATED_REWARDS)
truncated_reward_from_env = TRUNCATED_REWARD.read


def rollouts(group_of: Sequence[Any], samples: Sequence[Any]) -> dict[tuple[Any, Any], list[int]]:
    """Sample positions of each rollout, keyed ``(group, rollout key)``, in list order.

    A sample with neither ``rollout_id`` nor ``index`` is a rollout of its own.
    """
    out: dict[tuple[Any, Any], list[int]] = {}
    for i, (s, g) in enumerate(zip(samples, group_of, strict=True)):
        key = rollout_key(s)
        out.setdefault((g, ("row", i) if key is None else key), []).append(i)
    return out


def budget_failures(
    group_of: Sequence[Any], samples: Sequence[Any], *, reward_key: str | None = None
) -> list[list[int]]:
    """The sample positions of every rollout classified as a budget failure."""
    return [
        rows
        for rows in rollouts(group_of, samples).values()
        if rollout_record([samples[i] for i in rows], reward_key=reward_key).outcome
        is Outcome.BUDGET_FAILURE
    ]


def zero_budget_failures(
    group_of: Sequence[Any],
    samples: Sequence[Any],
    raw_rewards: Sequence[Any],
    *,
    reward_key: str | None = None,
    setting: str | None = None,
) -> tuple[list[Any], int]:
    """``raw_rewards`` with budget failures scored 0 under ``zero``; and how many changed.

    Args:
        group_of: the reward group of each sample (``group_ids``).
        samples: the flat list of samples.
        raw_rewards: each sample's scalar reward as the grader set it.
        reward_key: ``--reward-key`` for dict rewards.
        setting: ``keep`` or ``zero``; default ``RESCUE_TRUNCATED_REWARD``.

    Returns:
        ``(rewards, zeroed)``: a new list (the input is not modified) and the number of
        rollouts whose reward was nonzero and is now 0.
    """
    setting = truncated_reward_from_env() if setting is None else setting
    if setting not in TRUNCATED_REWARDS:
        raise InputError(
            f"{ENV_TRUNCATED_REWARD}={setting!r}; allowed: {', '.join(TRUNCATED_REWARDS)}"
        )
    rewards = list(raw_rewards)
    if setting == "keep":
        return rewards, 0
    zeroed = 0
    for rows in budget_failures(group_of, samples, reward_key=reward_key):
        if any(rewards[i] is None or rewards[i] != 0 for i in rows):
            zeroed += 1
        for i in rows:
            rewards[i] = 0.0
    return rewards, zeroed
