"""Score centering with truncated importance weights: the per-token estimator, one place.

Specification
-------------
At a prefix the sampler drew token ``y`` from ``q``; the trainer's distribution is ``p``
(both at the rollout temperature). The sampler recorded ``log q_y`` and its top-``K`` head
``H`` (ids and ``log q_v``, ``v ∈ H``). With a weight function ``f`` the token's surrogate
objective (its loss is ``-A_t s_t``, ``A_t`` the token's advantage) is::

    s_t = sg(f(p_y / q_y)) log p_y  -  Σ_{v ∈ H} sg(c_v) log p_v
    c_v = q_v f(p_v / q_v) - α p_v,      α = ρ f(1 / ρ),
    ρ   = max(1 - Σ_H q, 1e-6) / max(1 - Σ_H p, 1e-6)

(``sg`` stops the gradient). Outside the head the sampler is modelled as ``q = ρ p``, which
makes ``Σ_H c_v ∇log p_v`` exactly the sampler-expected weighted score
``E_{y~q}[f(p_y/q_y) ∇log p_y]``: subtracting it leaves ``Cov_q(A, f ∇log p)`` and removes
the drift term ``E_q[A] E_q[f ∇log p]``, which does not vanish when ``p ≠ q`` (group
centring makes the group mean of ``A`` zero, not ``E[A | prefix]``). ``y`` keeps its
recorded ``q_y`` even when ``y ∉ H``.

Weights (``cap``): ``C`` > 0 gives TIS + SC, ``f(r) = min(r, C)``, so ``q_v f(p_v/q_v) =
min(p_v, C q_v)`` and ``α = min(1, C ρ)`` (no division by a zero ``q_v``); ``None`` gives
SC alone, ``f ≡ 1``, ``α = ρ``. Invariants the tests check: ``p = q`` gives ``c = 0`` (plain
REINFORCE, ``C ≥ 1``); a head covering the vocabulary gives ``E_q[s_t's gradient] = 0`` for
any ``p, q``; the estimator is linear in ``A_t``, so loss weights (the protect arm's
``1/a``), ``R = 0`` rewards, per-token (turn-reached) advantages and a constant loss
divisor (Dr. GRPO) all scale the score and its centering together.

Arrays: every function takes numpy arrays or torch tensors (torch is never imported
here) of shape ``[..., K]`` for the head and ``[...]`` per token; ``valid`` marks real head
entries (a padded head entry contributes nothing). The Miles loss
(``rescue.miles.sc_loss``) and the simulator (``rescue.sim.update``) call these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Floor of the head's tail mass under either distribution (paper, App. A).
TAIL_FLOOR = 1e-6
#: Truncation cap ``C`` of the plan's TIS + SC.
DEFAULT_CAP = 2.0


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _minimum(a: Any, b: Any) -> Any:
    if _is_torch(a) or _is_torch(b):
        import torch

        a = a if _is_torch(a) else torch.as_tensor(a, dtype=b.dtype, device=b.device)
        b = b if _is_torch(b) else torch.as_tensor(b, dtype=a.dtype, device=a.device)
        return torch.minimum(a, b)
    return np.minimum(a, b)


def _exp(x: Any) -> Any:
    return x.exp() if _is_torch(x) else np.exp(x)


def _floor(x: Any, lo: float) -> Any:
    return x.clamp(min=lo) if _is_torch(x) else np.maximum(x, lo)


def _where(cond: Any, a: Any, b: Any) -> Any:
    if _is_torch(cond):
        import torch

        return torch.where(cond, a, b)
    return np.where(cond, a, b)


def _sg(x: Any) -> Any:
    return x.detach() if _is_torch(x) else x


def weight(ratio: Any, cap: float | None) -> Any:
    """``f(r)``: ``min(r, cap)`` (TIS), or 1 when ``cap`` is None (SC alone)."""
    if cap is None:
        return ratio * 0 + 1
    return _minimum(ratio, cap)


@dataclass
class Head:
    """The head's terms at each position: ``coef`` ``[..., K]`` (``c_v``), and per position
    the head mass under the sampler (``mass_q``) and the trainer (``mass_p``), ``rho``,
    ``alpha``."""

    coef: Any
    mass_q: Any
    mass_p: Any
    rho: Any
    alpha: Any


def head_terms(logp_head: Any, logq_head: Any, cap: float | None, valid: Any = None) -> Head:
    """``c_v``, ``ρ``, ``α`` and the head masses (module docstring), from detached log-probs.

    ``logp_head``: the trainer's log-probs of the head ids; ``logq_head``: the sampler's;
    ``valid``: bool mask of real entries (default all).
    """
    p = _exp(_sg(logp_head))
    q = _exp(_sg(logq_head))
    if valid is not None:
        p = _where(valid, p, p * 0)
        q = _where(valid, q, q * 0)
    mass_p, mass_q = p.sum(-1), q.sum(-1)
    rho = _floor(1 - mass_q, TAIL_FLOOR) / _floor(1 - mass_p, TAIL_FLOOR)
    if cap is None:
        weighted_q, alpha = q, rho
    else:
        weighted_q, alpha = _minimum(p, cap * q), _minimum(rho * cap, 1.0)
    coef = weighted_q - alpha[..., None] * p
    if valid is not None:
        coef = _where(valid, coef, coef * 0)
    return Head(coef=coef, mass_q=mass_q, mass_p=mass_p, rho=rho, alpha=alpha)


@dataclass
class TokenTerms:
    """Per position: the surrogate ``s`` (carries the gradient of ``log p``), the sampled
    token's weight ``w = f(p_y/q_y)``, whether its ratio exceeded the cap, the centering's
    L1 size ``Σ_H |c_v|``, and the ``Head``."""

    surrogate: Any
    w: Any
    truncated: Any
    correction_l1: Any
    head: Head


def token_terms(
    logp_y: Any,
    logp_head: Any,
    logq_y: Any,
    logq_head: Any,
    cap: float | None = DEFAULT_CAP,
    valid: Any = None,
) -> TokenTerms:
    """``s_t = sg(w) log p_y - Σ_H sg(c_v) log p_v`` per position (module docstring).

    ``logp_y`` ``[...]`` and ``logp_head`` ``[..., K]`` are the trainer's log-probs (with
    their gradient, if any); ``logq_y`` ``[...]`` and ``logq_head`` ``[..., K]`` the
    sampler's recorded ones.
    """
    ratio = _exp(_sg(logp_y) - logq_y)
    w = weight(ratio, cap)
    truncated = ratio > cap if cap is not None else ratio < 0
    head = head_terms(logp_head, logq_head, cap, valid)
    surrogate = _sg(w) * logp_y - (_sg(head.coef) * logp_head).sum(-1)
    correction_l1 = abs(head.coef).sum(-1)
    return TokenTerms(surrogate, w, truncated, correction_l1, head)
