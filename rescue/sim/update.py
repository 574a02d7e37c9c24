"""The trainer's learning step: a batch's loss coefficients under an arm's rule, the step, P7.

Specification
-------------
A batch is B groups of G rollouts (``Batch``). Rollout ``i`` of group ``g`` made decisions
``d`` (column 0 the strategy, column ℓ the action at turn ℓ). The step is gradient ascent::

    θ ← θ + lr · (1/N) Σ_{g,i} Σ_d c_gid ∇ log π_θ(a_d | row_d)
    c_gid = m_gi · w_g · A_gi(d) · ρ_gid

- ``A``: the advantage of ``rescue.advantages``, with R = 0 on cap: ``group_advantages``
  over the arm's baseline population (all members, or the survivors), or
  ``per_token_advantages`` with the turn-reached baseline (``turn``). The baseline
  is over each group, or over the whole batch as one group (``baseline_scope = batch``);
  divided by the population's std when ``std_normalize``.
- ``w_g``: the gate's loss weight of the group (1, or 1/a when protected), applied after
  normalization, so no normalization can undo it.
- ``m_gi``: 0 for a loss-masked rollout (the mask arms' capped rollouts), else 1.
- ``ρ``: with ``tis``, the truncated importance ratio ``min(π_θ(a_d) / π_launch(a_d), C)``
  of the decision (Miles' ``--use-tis``, lower clip 0, ``C = tis_clip``), else 1.
- ``score_centering``: each decision also gets ``- m_gi w_g A_gi(d) Σ_v c_dv ∇log π_θ(v |
  row_d)`` (divided by ``N``), ``c`` the centering coefficients of
  ``rescue.score_centering.head_terms`` with the launching policy's whole row as the head
  (``f(r) = min(r, C)`` with ``tis``, ``f ≡ 1`` without): the decision's score minus its
  launching-policy expectation, so the staleness drift ``E[A] E_launch[ρ ∇log π]`` is gone.
  The sampler/trainer mismatch here is staleness alone (the launching weights against
  the current ones); the simulator has no numerical mismatch.
- ``matched`` (the matched-update control): the step is the mask arm's gradient times
  ``rescue.mask.matched_scale(‖g_0‖, ‖g_mask‖)``, ``g_0`` the gradient of the same batch with
  nothing masked (the R = 0 arm's) at the same θ, so the update keeps the mask's direction
  with the R = 0 arm's norm (exact: the step is plain gradient ascent).
- ``step-control`` (the step-size control): the step is the R = 0 arm's gradient ``g_0`` of
  the batch with nothing masked, times ``matched_scale(‖g_mask‖, ‖g_0‖)``, ``g_mask`` the
  gradient of the same batch masked as the mask arm masks it: R = 0's direction at the
  mask arm's norm. Its batch is masked as the mask arm's (the census reports those masks,
  as Miles' does under the filter that measures the mask's step); only the applied step
  trains the capped rollouts.
- ``N``: the batch's number of rollouts B·G (masked ones count, as in Miles' loss
  normalizer), or, for an arm with ``loss_norm = weights``, the sum of the rollouts' weights
  ``G · Σ_g w_g``.

A rollout's decisions are summed, not averaged: a trajectory's score is the sum of its
decisions' scores, which keeps the estimator exact.

The P7 statistic (``p7_moments``): per-decision advantages ``R − b`` with R = 0 on cap and
no std, under three baselines (``P7_BASELINES``: the group mean with the rollout's own
reward, the leave-one-out mean, the turn-reached baseline), over the decisions of the
rollouts the arm trains on: a loss-masked rollout is left out (dropped groups never reach
a batch). Baselines are computed over the same scope as the update's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rescue.advantages import group_advantages, per_token_advantages
from rescue.errors import InputError
from rescue.mask import matched_scale
from rescue.sim import policy as P
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig

#: Baselines of the P7 statistic, in the order of ``p7_moments``' rows.
P7_BASELINES: tuple[str, ...] = ("group_mean", "leave_one_out", "turn_reached")


@dataclass
class Batch:
    """The arrays of B groups × G rollouts the trainer updates on.

    ``rows``, ``choices``, ``prob``: ``[B, G, T + 1]`` decisions (padding rows −1) and the
    probability the launching policy gave each; ``reward``, ``lengths``, ``masked``:
    ``[B, G]``; ``weight``: ``[B]`` the gate's loss weight of each group; ``behaviour``:
    ``[B, G, T + 1, CHOICES]`` the launching policy's row of each decision (score centering).
    """

    rows: np.ndarray
    choices: np.ndarray
    prob: np.ndarray
    reward: np.ndarray
    lengths: np.ndarray
    masked: np.ndarray
    weight: np.ndarray
    behaviour: np.ndarray | None = None

    @classmethod
    def of(cls, episodes: Sequence, masked: Sequence, weights: Sequence[float]) -> Batch:
        """A batch from each group's ``env.Episodes``, masked flags and gate weight."""
        return cls(
            rows=np.stack([e.rows for e in episodes]).astype(np.int64),
            choices=np.stack([e.choices for e in episodes]).astype(np.int64),
            prob=np.stack([e.prob for e in episodes]),
            reward=np.stack([e.reward for e in episodes]),
            lengths=np.stack([e.turns for e in episodes]),
            masked=np.asarray(masked, dtype=bool).reshape(len(episodes), -1),
            weight=np.asarray(weights, dtype=np.float64),
            behaviour=np.stack([e.behaviour for e in episodes]),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.reward.shape

    def turn_index(self) -> np.ndarray:
        """Turn of each decision (the strategy, column 0, is taken with turn 1); 0 on padding."""
        T1 = self.rows.shape[-1]
        return np.where(self.rows >= 0, np.maximum(np.arange(T1), 1), 0)


def _scoped(batch: Batch, scope: str) -> tuple[np.ndarray, int, int]:
    """Group id per rollout, and the (groups, members) shape the baseline is computed over."""
    B, G = batch.shape
    if scope == "batch":
        return np.zeros(B * G, dtype=np.int64), 1, B * G
    return np.repeat(np.arange(B), G), B, G


def advantages(batch: Batch, arm: ArmSpec, cfg: SimConfig) -> np.ndarray:
    """``A [B, G, T + 1]`` per decision (0 on padding), the gate weights applied."""
    B, G = batch.shape
    gids, nb, ng = _scoped(batch, cfg.baseline_scope)
    w = np.repeat(batch.weight[:, None], G, axis=1)
    ti = batch.turn_index()
    if arm.turn_baseline:
        A = per_token_advantages(
            batch.reward.reshape(nb, ng), batch.lengths.reshape(nb, ng),
            ti.reshape(nb, ng, -1), kappa=cfg.kappa, std_normalize=cfg.std_normalize,
            weights=w.reshape(nb, ng), dtype=np.float64,
        )  # fmt: skip
        return A.reshape(ti.shape)
    A = group_advantages(
        batch.reward.ravel(), gids, population=arm.population, kept=~batch.masked.ravel(),
        std_normalize=cfg.std_normalize, weights=w.ravel(),
    ).reshape(B, G)  # fmt: skip
    return np.where(ti > 0, A[:, :, None], 0.0)


def importance_ratio(batch: Batch, probs: np.ndarray, clip: float) -> np.ndarray:
    """``min(π_θ(a) / π_launch(a), clip)`` per decision (1 on padding)."""
    real = batch.rows >= 0
    now = probs[np.where(real, batch.rows, 0), np.where(real, batch.choices, 0)]
    return np.where(real, np.minimum(now / batch.prob, clip), 1.0)


def normalizer(batch: Batch, arm: ArmSpec) -> float:
    """``N``: B·G rollouts, or the sum of the rollouts' weights (``loss_norm = weights``)."""
    B, G = batch.shape
    return float(G * batch.weight.sum()) if arm.loss_norm == "weights" else float(B * G)


def coefficients(
    batch: Batch, arm: ArmSpec, cfg: SimConfig, probs: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """``c / N [B, G, T + 1]`` of the module docstring, and the step's TIS figures."""
    return _weighted(batch, cfg, probs, _scaled_advantages(batch, arm, cfg))


def _scaled_advantages(batch: Batch, arm: ArmSpec, cfg: SimConfig) -> np.ndarray:
    """``m w A / N`` per decision (the coefficient without the ratio)."""
    coef = np.where(batch.masked[:, :, None], 0.0, advantages(batch, arm, cfg))
    return coef / normalizer(batch, arm)


def _weighted(
    batch: Batch, cfg: SimConfig, probs: np.ndarray, coef: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """``coef`` times the truncated ratio (with ``tis``), and the step's TIS figures."""
    info: dict[str, float] = {}
    if cfg.tis:
        real = batch.rows >= 0
        raw = importance_ratio(batch, probs, np.inf)
        rho = np.minimum(raw, cfg.tis_clip)
        coef = coef * rho
        info = {
            "tis_mean": float(raw[real].mean()),
            "tis_clipfrac": float((raw[real] > cfg.tis_clip).mean()),
        }
    return coef, info


def centering(
    batch: Batch, coef: np.ndarray, cfg: SimConfig, probs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """Score centering's decisions ``(rows, choices, coefficients)`` ``[B, G, T + 1, CHOICES]``
    for ``Policy.gradient``, from the per-decision ``coef`` (``A`` over ``N``, masked and
    weighted, without the ratio), and the step's mean ``Σ_v |c_dv|`` over the decisions."""
    from rescue.score_centering import head_terms

    if batch.behaviour is None:
        raise InputError("score centering needs each decision's launching row (Batch.behaviour)")
    real = batch.rows >= 0
    rows = np.where(real, batch.rows, 0)
    valid = P.available()[rows] & real[..., None]
    p, q = probs[rows], batch.behaviour
    with np.errstate(divide="ignore"):
        logp = np.log(np.where(valid, p, 1.0))
        logq = np.log(np.where(valid, q, 1.0))
    head = head_terms(logp, logq, cfg.tis_clip if cfg.tis else None, valid)
    choices = np.broadcast_to(np.arange(P.CHOICES), head.coef.shape)
    rows_v = np.where(valid, rows[..., None], -1)
    info = {"sc_correction_l1": float(np.abs(head.coef).sum(-1)[real].mean())} if real.any() else {}
    return rows_v, choices, -coef[..., None] * head.coef, info


def gradient(
    policy: P.Policy, batch: Batch, arm: ArmSpec, cfg: SimConfig, probs: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """The batch's gradient under the arm's rule (module docstring), and the step's figures."""
    scaled = _scaled_advantages(batch, arm, cfg)
    coef, info = _weighted(batch, cfg, probs, scaled)
    grad = policy.gradient(batch.rows, batch.choices, coef)
    if cfg.score_centering:
        rows, choices, c, sc_info = centering(batch, scaled, cfg, probs)
        grad = grad + policy.gradient(rows, choices, c)
        info = {**info, **sc_info}
    return grad, info


def step(policy: P.Policy, batch: Batch, arm: ArmSpec, cfg: SimConfig) -> dict[str, float]:
    """Apply one update to ``policy``; returns what the step did.

    ``grad_thorough``: the gradient's component on the thorough logit (the strategy row),
    ``∂/∂θ_thorough`` of the batch loss; ``update_norm``: ``lr · ‖gradient‖``;
    ``loss_normalizer``: ``N``. The matched arm also returns ``update_norm_ref`` (the R = 0
    step's), ``update_norm_mask`` (its own, unscaled) and ``update_scale``; the step-size
    control the same three (``update_norm_ref`` the R = 0 step it applies, unscaled).
    """
    probs = policy.probs()
    grad, info = gradient(policy, batch, arm, cfg, probs)
    if arm.step_control:
        unmasked = dataclasses.replace(batch, masked=np.zeros_like(batch.masked))
        mask_norm = cfg.lr * float(np.linalg.norm(grad))
        grad = gradient(policy, unmasked, arm, cfg, probs)[0]
        ref = cfg.lr * float(np.linalg.norm(grad))
        scale = matched_scale(mask_norm, ref)
        grad = grad * (scale if math.isfinite(scale) else 1.0)
        info = {
            **info,
            "update_norm_ref": ref,
            "update_norm_mask": mask_norm,
            "update_scale": scale,
        }
    if arm.matched:
        unmasked = dataclasses.replace(batch, masked=np.zeros_like(batch.masked))
        ref = cfg.lr * float(np.linalg.norm(gradient(policy, unmasked, arm, cfg, probs)[0]))
        own = cfg.lr * float(np.linalg.norm(grad))
        scale = matched_scale(ref, own)
        grad = grad * (scale if math.isfinite(scale) else 1.0)
        info = {**info, "update_norm_ref": ref, "update_norm_mask": own, "update_scale": scale}
    policy.step(grad, cfg.lr)
    return {
        "grad_thorough": float(grad[P.STRATEGY_ROW, P.THOROUGH]),
        "update_norm": float(cfg.lr * np.linalg.norm(grad)),
        "loss_normalizer": normalizer(batch, arm),
        **info,
    }


def p7_moments(batch: Batch, cfg: SimConfig) -> np.ndarray:
    """``[3, 3]``: per baseline of ``P7_BASELINES``, (n, ΣA, ΣA²) over the trained decisions."""
    B, G = batch.shape
    gids, nb, ng = _scoped(batch, cfg.baseline_scope)
    ti = batch.turn_index()
    trained = (ti > 0) & ~batch.masked[:, :, None]
    R = batch.reward

    def per_decision(population: str) -> np.ndarray:
        A = group_advantages(R.ravel(), gids, population=population, std_normalize=False)
        return np.broadcast_to(A.reshape(B, G)[:, :, None], ti.shape)

    a_turn = per_token_advantages(
        R.reshape(nb, ng), batch.lengths.reshape(nb, ng), ti.reshape(nb, ng, -1),
        kappa=cfg.kappa, std_normalize=False, dtype=np.float64,
    ).reshape(ti.shape)  # fmt: skip
    out = np.zeros((3, 3))
    for j, a in enumerate((per_decision("all"), per_decision("loo"), a_turn)):
        a = a[trained]
        out[j] = (a.size, a.sum(), (a * a).sum())
    return out


def p7_variances(moments: np.ndarray) -> dict[str, float]:
    """Per-decision advantage variance under each of ``P7_BASELINES`` from summed moments."""
    out = {}
    for j, name in enumerate(P7_BASELINES):
        n, s, s2 = moments[j]
        out[name] = float(s2 / n - (s / n) ** 2) if n else float("nan")
    return out
