"""Mask filters for capped trajectories: targets of ``--rollout-sample-filter-path``.

Specification
-------------
A *trajectory* is one item of a group: a ``Sample``, or a ``list[Sample]`` of turns that
share a ``rollout_id`` (Miles' agentic multi-sample output). A trajectory is *capped* when
``rescue.outcomes.is_capped(classify(...))`` holds for it: it hit the turn cap or a
length/context limit. No other rule decides it.

``mask_truncated_zero_reward`` (the *mask* arm)
    Every capped trajectory gets ``remove_sample = True`` on each of its samples. Its
    reward is left as the grader set it (0), so it still votes in the group baseline
    (Miles' ``remove_sample`` only zeroes the loss mask).
``mask_random_fraction``
    A capped trajectory is masked iff ``coin(seed, "mask/<key>") < rho``: a fraction
    ``rho`` of capped trajectories, decided by a hash coin (``rescue.gate.coin``) keyed on
    the trajectory, so the same trajectory gets the same answer in every process and after
    a restart. ``rho = 1`` is the mask arm, ``rho = 0`` masks nothing.

Both filters work in place (the signature Miles and slime call, ``fn(args, groups)``),
never clear a ``remove_sample`` that is already set, and never touch rewards, groups or
their order. The per-trajectory decision is ``mask_decision``, a plain function of a
classification and a key that the simulator calls without any ``Sample``.

Settings (environment variables, read at each call):

``RESCUE_MASK_RHO``
    Fraction of capped trajectories ``mask_random_fraction`` masks, ``0 <= rho <= 1``
    (default 0.5).
``RESCUE_SEED``
    Seed of the coin (default 0), shared with the stale-group gate. The key is prefixed
    with ``mask/``, so the mask coin of a trajectory is independent of the gate coin of a
    group with the same number.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rescue.gate import coin, seed_from_env
from rescue.miles.samples import field, rollout_key, rollout_record, trajectory_samples
from rescue.outcomes import Classification, is_capped

#: Environment variable holding rho, the masked fraction of capped trajectories.
ENV_MASK_RHO = "RESCUE_MASK_RHO"
#: rho when ``RESCUE_MASK_RHO`` is unset or empty.
DEFAULT_MASK_RHO = 0.5

_COIN_PREFIX = "mask/"


def mask_decision(classification: Classification, key: int | str, rho: float, seed: int) -> bool:
    """Whether one trajectory is masked: it is capped and its coin falls below ``rho``.

    Args:
        classification: the trajectory's ``rescue.outcomes.classify`` result.
        key: a stable id of the trajectory (Miles/slime: ``rollout_id``, else ``index``).
        rho: masked fraction of capped trajectories, ``0 <= rho <= 1`` (1 masks all).
        seed: seed of the coin (``RESCUE_SEED``).
    """
    if not is_capped(classification):
        return False
    if rho >= 1.0:
        return True
    return coin(seed, f"{_COIN_PREFIX}{key}") < rho


def parse_rho(value: object, *, setting: str = ENV_MASK_RHO) -> float:
    """``rho`` as a float in [0, 1]; anything else is a ``ValueError`` naming the setting."""
    try:
        rho = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{setting}={value!r} is not a number; allowed: 0 <= rho <= 1") from None
    if not math.isfinite(rho) or not 0.0 <= rho <= 1.0:
        raise ValueError(f"{setting}={value!r} is out of range; allowed: 0 <= rho <= 1")
    return rho


def rho_from_env(env: Mapping[str, str] | None = None) -> float:
    """``RESCUE_MASK_RHO`` (default ``DEFAULT_MASK_RHO`` = 0.5), validated."""
    env = os.environ if env is None else env
    text = env.get(ENV_MASK_RHO) or ""
    return DEFAULT_MASK_RHO if not text.strip() else parse_rho(text)


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
            raise ValueError(
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
    raise ValueError(
        f"sample filter: trajectory {position} of group {group_position} has no rollout_id, "
        "index or group_index to key its coin on"
    )
