"""Mask filters for capped trajectories: targets of ``--rollout-sample-filter-path``.

Specification
-------------
A *trajectory* is one item of a group: a ``Sample``, or a ``list[Sample]`` of turns that
share a ``rollout_id`` (Miles' agentic multi-sample output). Each trajectory's record comes
from ``rescue.samples.rollout_record``, and whether it is masked from
``rescue.mask.mask_decision`` (capped, and its coin below ``rho``): this module only
applies that decision to samples.

``mask_truncated_zero_reward`` (the *mask* arm)
    Every capped trajectory gets ``remove_sample = True`` on each of its samples. Its
    reward is left as the grader set it (0), so it still votes in the group baseline
    (Miles' ``remove_sample`` only zeroes the loss mask).
``mask_random_fraction``
    A fraction ``rho`` of capped trajectories, ``RESCUE_MASK_RHO`` (default 0.5), with
    the coin seeded by ``RESCUE_SEED`` (default 0) and keyed on the trajectory's
    ``rollout_id``, else ``index``, else ``<group_index>/<position>``.

Both filters work in place (the signature Miles and slime call, ``fn(args, groups)``),
never clear a ``remove_sample`` that is already set, and never touch rewards, groups or
their order. Settings are read at each call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rescue.errors import InputError
from rescue.gate import seed_from_env
from rescue.mask import mask_decision, rho_from_env
from rescue.outcomes import Classification, is_capped
from rescue.samples import field, rollout_key, rollout_record, trajectory_samples


def mask_truncated_zero_reward(args: Any, groups: list) -> None:
    """The mask arm: set ``remove_sample`` on every sample of every capped trajectory.

    Target of ``--rollout-sample-filter-path filters.mask_truncated_zero_reward``. In place;
    rewards are not changed (a capped trajectory keeps the reward its grader gave, 0).
    """
    _apply(args, groups, rho=1.0, seed=0)


def mask_random_fraction(args: Any, groups: list) -> None:
    """Mask a fraction ``rho`` of capped trajectories with a deterministic per-trajectory coin.

    Target of ``--rollout-sample-filter-path filters.mask_random_fraction``. ``rho`` comes
    from ``RESCUE_MASK_RHO`` (default 0.5) and the seed from ``RESCUE_SEED`` (default 0).
    In place; rewards are not changed.
    """
    _apply(args, groups, rho=rho_from_env(), seed=seed_from_env())


def _apply(args: Any, groups: Iterable, *, rho: float, seed: int) -> None:
    reward_key = getattr(args, "reward_key", None)
    for g, group in enumerate(groups):
        if not isinstance(group, list):
            raise InputError(
                f"sample filter: groups[{g}] is a {type(group).__name__}; expected a list of "
                "samples or of list[Sample] trajectories"
            )
        for t, trajectory in enumerate(group):
            samples = trajectory_samples(trajectory)
            if not samples:
                continue
            record = rollout_record(trajectory, reward_key=reward_key)
            c = Classification(record.outcome, record.reason)
            key = _key(samples, g, t) if rho < 1.0 and is_capped(c) else ""
            if mask_decision(c, key, rho, seed):
                for s in samples:
                    s.remove_sample = True


def _key(samples: Sequence[Any], group_position: int, position: int) -> int | str:
    """The coin key of a trajectory: ``rollout_id``, else ``index`` (as Miles keys rollouts)."""
    first = samples[0]
    key = rollout_key(first)
    if key is not None:
        return key
    group_index = field(first, "group_index")
    if group_index is not None:
        return f"{group_index}/{position}"
    raise InputError(
        f"sample filter: trajectory {position} of group {group_position} has no rollout_id, "
        "index or group_index to key its coin on"
    )
