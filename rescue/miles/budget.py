"""R = 0 for budget failures: the same raw reward in every arm (``RESCUE_TRUNCATED_REWARD``).

Specification
-------------
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

from collections.abc import Sequence
from typing import Any

from rescue import flags
from rescue.errors import InputError
from rescue.outcomes import Outcome
from rescue.samples import rollout_key, rollout_record

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
        group_of: the reward group of each sample (``rescue.miles.reward.group_ids``).
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
