"""Which capped trajectories a mask arm excludes from the loss: one decision for all callers.

Specification
-------------
A trajectory is *capped* when ``rescue.outcomes.is_capped`` holds for its classification:
it hit the turn cap or a length/context limit. No other rule decides it.

``mask_decision(classification, key, rho, seed)`` masks a capped trajectory iff
``rho >= 1`` or ``coin(seed, "mask/<key>") < rho``: a fraction ``rho`` of capped
trajectories, decided by a hash coin (``rescue.gate.coin``) keyed on the trajectory, so
the same trajectory gets the same answer in every process and after a restart. ``rho = 1``
is the mask arm, ``rho = 0`` masks nothing. The ``mask/`` prefix makes the mask coin of a
trajectory independent of the gate coin of a group with the same number.

The sample filters (``filters``, targets of ``--rollout-sample-filter-path``), the
simulator and replay's ``d<rho>`` arms all call this function.

Settings (environment variables, read by ``rho_from_env`` / ``rescue.gate.seed_from_env``):

``RESCUE_MASK_RHO``
    Fraction of capped trajectories masked, ``0 <= rho <= 1`` (default 0.5).
``RESCUE_SEED``
    Seed of the coin (default 0), shared with the stale-group gate.
"""

from __future__ import annotations

import math

from rescue import flags
from rescue.errors import InputError
from rescue.gate import coin
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
    """``rho`` as a float in [0, 1]; anything else is an ``InputError`` naming the setting."""
    try:
        rho = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{setting}={value!r} is not a number; allowed: 0 <= rho <= 1") from None
    if not math.isfinite(rho) or not 0.0 <= rho <= 1.0:
        raise InputError(f"{setting}={value!r} is out of range; allowed: 0 <= rho <= 1")
    return rho


#: ``RESCUE_MASK_RHO`` (default ``DEFAULT_MASK_RHO`` = 0.5), validated by ``parse_rho``.
MASK_RHO = flags.setting(ENV_MASK_RHO, DEFAULT_MASK_RHO, parse_rho, "0 <= rho <= 1")
rho_from_env = MASK_RHO.read


def matched_scale(reference_norm: float, mask_norm: float) -> float:
    """The factor that brings one step to another's update norm: ``target / own``.

    The matched-update control scales the mask arm's step (``mask_norm``, its own) to the
    update norm the R = 0 arm takes on the same batch from the same state
    (``reference_norm``, the target); the step-size control calls it the other way round,
    ``matched_scale(mask norm, R = 0 norm)``, to scale R = 0's step to the mask's. When the
    scaled step is 0 the factor is 1 if the target is 0 too, else NaN (nothing can be scaled
    to it; the caller applies the zero step and logs the NaN). The trainer
    (``rescue.miles.matched``) and the simulator (``rescue.sim.update``) both take their
    factor from here.
    """
    if mask_norm > 0:
        return reference_norm / mask_norm
    return 1.0 if reference_norm == 0 else math.nan
