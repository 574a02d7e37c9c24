"""The gradient share by difficulty bucket: where a step's update puts its weight.

Specification
-------------
A prompt ``x``'s difficulty is its group's solved fraction ``J̄_x`` (the rollouts with a
result), binned as the replay bins it (``DIFFICULTY``: ``J=0``, ``0<J<0.5``, ``0.5<=J<1``,
``J=1``). Each rollout ``i`` trains with a scalar weight ``a_i`` (its advantage as the
trainer gets it: 0 when it is loss-masked). For two outcomes (solved or not) the expected
policy gradient of the prompt is, by the REINFORCE identity,

    E[Σ_i a_i ∇log π(τ_i)] = G · κ_x · ∇J_x,      κ_x = a(solved) − a(not solved),

so ``κ_x`` is the weight the update puts on the prompt's own success gradient. It is
measured per step as the mean ``a_i`` of the group's solved rollouts minus the mean of its
other rollouts (0 when the group has only one kind). Under GRPO with ``R = 0`` on the cap,
``κ_x = c_x`` (``1/σ_x``); the mask arm trains capped rollouts with ``a = 0``, so
``κ_x = c_x (1 − J̄_x)``: the per-prompt rescaling of the identity, which moves the share
toward hard prompts; the survivor baseline gives every survivor ``a = 0``: ``κ_x = 0``,
no signal at all.

Reported per step (``difficulty_share``), for each bucket ``B``:

- ``grad_share/<B>``: ``Σ_{x∈B} |κ_x| / Σ_x |κ_x|`` (absent when every ``κ_x`` is 0);
- ``grad_weight/<B>``: the mean ``κ_x`` over the bucket's prompts;
- ``prompts/<B>``: how many prompts the bucket holds;

and ``grad_weight_total`` (``Σ_x |κ_x|``). Bucket names in keys: ``j0``, ``j_low``
(``0<J<0.5``), ``j_high`` (``0.5<=J<1``), ``j1``. With more than two outcomes (a lost
game) ``κ_x`` still contrasts solved rollouts with the rest, but the expected gradient has
one term per outcome, so it is a summary there, exact only for two. The gradient itself,
per bucket, is ``rescue replay gradients`` on the run's dumps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The difficulty bins, as the replay's gradient table labels them.
DIFFICULTY = ("J=0", "0<J<0.5", "0.5<=J<1", "J=1")
#: Their names in metric keys.
BUCKET_KEYS = ("j0", "j_low", "j_high", "j1")


def difficulty_bin(J: np.ndarray) -> np.ndarray:
    """Index into ``DIFFICULTY`` of each solved fraction ``J``."""
    J = np.asarray(J, dtype=float)
    return np.select([J <= 0, J < 0.5, J < 1], [0, 1, 2], 3)


def difficulty_share(
    group: Sequence, solved: Sequence[bool], weight: Sequence[float], prefix: str = ""
) -> dict[str, float]:
    """The metrics of the module docstring from one row per rollout with a result.

    Args:
        group: each rollout's group (prompt) id.
        solved: whether it is solved.
        weight: ``a_i``, the scalar it trains with (0 when masked).
        prefix: put before every key.
    """
    group = np.asarray(group)
    solved = np.asarray(solved, dtype=bool)
    weight = np.asarray(weight, dtype=float)
    if not (group.shape == solved.shape == weight.shape and group.ndim == 1):
        raise ValueError("group, solved and weight must be 1-D and of one length")
    ids, inverse = np.unique(group, return_inverse=True)
    n = np.bincount(inverse, minlength=len(ids))
    n_solved = np.bincount(inverse, weights=solved, minlength=len(ids))
    sum_solved = np.bincount(inverse, weights=weight * solved, minlength=len(ids))
    sum_other = np.bincount(inverse, weights=weight * ~solved, minlength=len(ids))
    mixed = (n_solved > 0) & (n_solved < n)
    kappa = np.where(
        mixed,
        sum_solved / np.maximum(n_solved, 1) - sum_other / np.maximum(n - n_solved, 1),
        0.0,
    )
    buckets = difficulty_bin(n_solved / np.maximum(n, 1))
    total = float(np.abs(kappa).sum())
    out = {f"{prefix}grad_weight_total": total}
    for b, key in enumerate(BUCKET_KEYS):
        sel = buckets == b
        out[f"{prefix}prompts/{key}"] = float(sel.sum())
        if sel.any():
            out[f"{prefix}grad_weight/{key}"] = float(kappa[sel].mean())
        if total > 0:
            out[f"{prefix}grad_share/{key}"] = float(np.abs(kappa[sel]).sum()) / total
    return out
