"""The arms' full-batch policy gradients on dumped rollouts, at fixed parameters.

Specification
-------------
For a causal LM ``π_θ`` and the batch of ``rescue.replay.arms`` (statistics frozen from the
unmasked batch), arm ``k``'s gradient is ::

    g_k = Σ_i Σ_t  f_i · A^k_{i,t} · ∇ log π_θ(y_t | y_<t),      f_i = 1/N  (``sum``)
                                                                   or 1/(N·n_i) (``sample-mean``)

over every response token with turn index >= 1 (observations are never trained), with
``N`` the number of rollouts and ``n_i`` rollout ``i``'s loss tokens, both of the unmasked
batch. ``cap`` is REINFORCE on the cap indicator with a group-mean baseline,
``A_i = C_i - mean_x C``: its expectation is ``∇P(cap)`` times ``(G-1)/G`` (the mean counts
``C_i`` itself). The projection of ``g_b - g_a`` on ``g_cap`` is reported as
``β = <g_b - g_a, g_cap> / |g_cap|²``; in expectation ``g_b - g_a = Σ_x J_x ∇P_x(cap)``
times the same ``(G-1)/G`` (a capped rollout's own ``R0 = 0`` is in ``mean_x``), so the
factor cancels and ``β`` estimates the baseline that masking pays.

Every vector is flattened over all trainable parameters on one device, and also split by
the token's turn bucket and by the prompt's difficulty (its group's solved fraction).

The correctness check, run before anything else, relabels the rollouts as two-outcome data
(every uncapped rollout solved, ``R = 1``; every capped one ``R = 0``) so that ``J̄_x`` (the
group's solved fraction) is exact. With the empirical group-mean baseline, per prompt ``x``
and ``s_i = Σ_t f_i ∇log π`` the rollout's score::

    g_b^x = Σ_{i solved} c_x (1 - J̄_x) s_i = c_x (1 - J̄_x) ĝ_J^x,    ĝ_J^x = Σ_i R_i s_i
    g_c^x = Σ_{i solved} c_x (1 - 1) s_i  = 0
    g_a^x = c_x [(1 - J̄_x) ĝ_J^x - J̄_x ĝ_C^x],                       ĝ_C^x = Σ_i (1 - R_i) s_i

(``c_x = 1/(σ_x + eps)`` under std normalization, else 1). The first two are exact for the
empirical gradient; ``g_b^x = (1 - J̄_x) g_a^x`` holds up to ``c_x J̄_x (1 - J̄_x) Σ_i s_i``, a
zero-mean term, so it is exact in expectation only (its size is reported, not checked).
Each ``g`` is computed from the arm code's advantages by its own backward pass; any
violation beyond ``rtol`` raises ``IdentityCheckFailed``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rescue.advantages import group_advantages, group_baseline
from rescue.errors import InputError
from rescue.replay.arms import (
    DEFAULT_RHOS,
    ArmBatch,
    build_batch,
    frozen_scale,
    scalar_arms,
    turn_reached_token_advantages,
)
from rescue.replay.dumps import Dump
from rescue.replay.model import Scorer
from rescue.share import DIFFICULTY, difficulty_bin

REDUCTIONS = ("sum", "sample-mean")
DEFAULT_TURN_EDGES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


class IdentityCheckFailed(RuntimeError):
    """The two-outcome identity does not hold: the gradients below it cannot be trusted."""


def _samples_of(batch: ArmBatch, dumps: Sequence[Dump]):
    """Per rollout: [(sample dict, token turns, where)] for its samples, and the token offsets."""
    by_step = {d.step: d for d in dumps}
    for i, t in enumerate(batch.trajectories):
        d = by_step[t.step]
        yield (
            i,
            [
                (d.samples[p], tt, f"{d.path}: samples[{p}]")
                for p, tt in zip(t.samples, t.token_turns, strict=True)
            ],
        )


def token_factors(batch: ArmBatch, reduction: str = "sum") -> np.ndarray:
    """``[N]`` ``f_i``: ``1/N`` (``sum``) or ``1/(N n_i)`` (``sample-mean``), from the unmasked batch."""
    if reduction not in REDUCTIONS:
        raise InputError(f"--reduction={reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    N = max(batch.n, 1)
    if reduction == "sum":
        return np.full(batch.n, 1.0 / N)
    owner = np.repeat(np.arange(batch.n), batch.counts)
    n_i = np.bincount(owner, weights=batch.token_turns > 0, minlength=batch.n)
    return np.divide(1.0, N * n_i, out=np.zeros(batch.n), where=n_i > 0)


def two_outcome_check(
    scorer: Scorer,
    batch: ArmBatch,
    dumps: Sequence[Dump],
    *,
    std_normalize: bool = True,
    reduction: str = "sum",
    rtol: float | None = None,
    eps: float = 1e-6,
) -> dict[str, Any]:
    """Per prompt: ``g_b == (1 - J̄) c ĝ_J``, ``g_c == 0``, ``g_a == c[(1-J̄)ĝ_J - J̄ ĝ_C]``.

    Raises ``IdentityCheckFailed`` naming the prompt and the residual. ``rtol`` defaults to
    1e-4 for float32 parameters and 1e-6 for float64 ones (some models keep parts such as
    rotary embeddings in float32), relative to ``|ĝ_J| + |ĝ_C|`` of the prompt; an arm that
    is wrong misses by O(1).
    """
    import torch

    if rtol is None:
        rtol = 1e-6 if scorer.dtype == torch.float64 else 1e-4
    R = (~batch.capped).astype(np.float64)
    relabelled = ArmBatch(**{**batch.__dict__, "R0": R, "solved": ~batch.capped})
    arms = scalar_arms(relabelled, rhos=(), std_normalize=std_normalize, eps=eps)
    c = frozen_scale(R, batch.group, std_normalize=std_normalize, eps=eps)
    J = group_baseline(R, batch.group)  # the group's solved fraction J̄_x
    f = token_factors(batch, reduction)
    keys = ("a", "b", "c", "J", "C")
    coef = {"a": arms["a"], "b": arms["b"], "c": arms["c"], "J": R, "C": 1.0 - R}
    per_prompt: dict[int, dict[str, Any]] = {}
    for i, parts in _samples_of(batch, dumps):
        acc = per_prompt.setdefault(
            int(batch.group[i]),
            {
                k: torch.zeros(scorer.size, dtype=scorer.dtype, device=scorer.param_device)
                for k in keys
            },
        )
        for sample, turns, where in parts:
            if not (turns > 0).any():
                continue
            logp = scorer.logprobs(sample, where)
            base = f[i] * (turns > 0)
            for k in keys:
                acc[k] += scorer.grad(logp, coef[k][i] * base)
    worst, gap = 0.0, []
    for x, acc in per_prompt.items():
        i = int(np.flatnonzero(batch.group == x)[0])
        Jx, cx = J[i], c[i]
        scale = float(acc["J"].norm() + acc["C"].norm()) or 1.0
        residuals = {
            "b": float((acc["b"] - cx * (1 - Jx) * acc["J"]).norm()) / scale,
            "c": float(acc["c"].norm()) / scale,
            "a": float((acc["a"] - cx * ((1 - Jx) * acc["J"] - Jx * acc["C"])).norm()) / scale,
        }
        for arm, r in residuals.items():
            worst = max(worst, r)
            if not r <= rtol:
                t = batch.trajectories[i]
                raise IdentityCheckFailed(
                    f"two-outcome check failed for prompt group {t.group[1]!r} of step {t.step} "
                    f"(J̄={Jx:.4f}): arm ({arm}) residual {r:.3e} > rtol {rtol:.1e}"
                )
        nb = float(acc["b"].norm())
        if nb > 0:
            gap.append(float((acc["b"] - (1 - Jx) * acc["a"]).norm()) / nb)
    return {
        "prompts": len(per_prompt),
        "max_residual": worst,
        "rtol": rtol,
        "gap_b_vs_(1-J)a_mean": float(np.mean(gap)) if gap else 0.0,
    }


def turn_bucket(turns: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Bucket ``k`` holds turns in ``[edges[k], edges[k+1])``; the last is open; 0-turn -> -1."""
    return np.where(turns > 0, np.searchsorted(np.asarray(edges), turns, side="right") - 1, -1)


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Row labels of the gradient table: ``all``, one per turn bucket, one per difficulty."""
    labels = ["all"]
    labels += [
        f"turns {lo}-{hi - 1}" if hi - 1 > lo else f"turns {lo}"
        for lo, hi in itertools.pairwise(edges)
    ]
    return [*labels, f"turns {edges[-1]}+", *(f"prompts {d}" for d in DIFFICULTY)]


def arm_gradients(
    dumps: Sequence[Dump],
    model,
    *,
    device: str = "cpu",
    rhos: Sequence[float] = DEFAULT_RHOS,
    seed: int = 0,
    kappa: float = 2.0,
    std_normalize: bool = True,
    reduction: str = "sum",
    turn_edges: Sequence[int] = DEFAULT_TURN_EDGES,
    check: bool = True,
    eps: float = 1e-6,
) -> dict[str, Any]:
    """The check, then every arm's gradient in total and per bucket, compared with (a).

    Defaults: rhos (0.3, 0.6, 1.0), coin seed 0, κ 2, GRPO std normalization, ``sum``
    reduction, turn edges 1,2,4,8,16,32, check on.
    """
    edges = sorted({int(e) for e in turn_edges})
    if not edges or edges[0] != 1:
        raise InputError(f"--turn-edges={turn_edges!r} must start at 1 (increasing turn numbers)")
    scorer = Scorer(model, device)
    batch = build_batch([t for d in dumps for t in d.trajectories])
    result: dict[str, Any] = {
        "rollouts": batch.n,
        "excluded_no_reward": len(batch.excluded),
        "parameters": scorer.size,
    }
    if check:
        result["check"] = two_outcome_check(
            scorer, batch, dumps, std_normalize=std_normalize, reduction=reduction, eps=eps
        )
    arms = scalar_arms(batch, rhos=rhos, seed=seed, std_normalize=std_normalize, eps=eps)
    arms["cap"] = group_advantages(
        batch.capped.astype(np.float64), batch.group, std_normalize=False
    )
    e_tok = turn_reached_token_advantages(batch, kappa=kappa, std_normalize=std_normalize, eps=eps)
    labels = bucket_labels(edges)
    acc, used = _accumulate(
        scorer, batch, dumps, arms, e_tok, edges, token_factors(batch, reduction)
    )
    result["buckets"] = [
        _bucket_report(label, {k: g[r] for k, g in acc.items()})
        for r, label in enumerate(labels)
        if r in used
    ]
    scale = frozen_scale(batch.R0, batch.group, std_normalize=std_normalize, eps=eps)
    b = group_baseline(batch.R0, batch.group)
    result["baseline_paid"] = float(np.mean(scale * b)) if batch.n else float("nan")
    return result


def _accumulate(
    scorer: Scorer,
    batch: ArmBatch,
    dumps: Sequence[Dump],
    arms: dict[str, np.ndarray],
    e_tok: np.ndarray,
    edges: Sequence[int],
    f: np.ndarray,
) -> tuple[dict[str, Any], set[int]]:
    """Every arm's gradient per row of ``bucket_labels``, one backward pass per bucket.

    A sample's tokens in turn bucket ``b`` add to rows 0 (all), ``1 + b`` (the bucket) and
    ``1 + len(edges) + d`` (its prompt's difficulty ``d``). Returns ``{arm: [rows, P]}``
    and the rows that received a token.
    """
    import torch

    n_turn = len(edges)
    n_rows = 1 + n_turn + len(DIFFICULTY)
    diff = difficulty_bin(group_baseline(batch.solved.astype(np.float64), batch.group))
    names = [*arms, "e"]
    acc = {
        k: torch.zeros(n_rows, scorer.size, dtype=scorer.dtype, device=scorer.param_device)
        for k in names
    }
    used: set[int] = set()
    bounds = np.concatenate(([0], np.cumsum(batch.counts)))
    for i, parts in _samples_of(batch, dumps):
        e_i = e_tok[bounds[i] : bounds[i + 1]]
        offset = 0
        for sample, turns, where in parts:
            e_s, offset = e_i[offset : offset + len(turns)], offset + len(turns)
            tb = turn_bucket(turns, edges)
            if not (tb >= 0).any():
                continue
            logp = scorer.logprobs(sample, where)
            for b in np.unique(tb[tb >= 0]):
                sel = tb == b
                idx = [0, 1 + int(b), 1 + n_turn + int(diff[i])]
                used.update(idx)
                rows = torch.tensor(idx, device=scorer.param_device)
                v = scorer.grad(logp, f[i] * sel)
                for k in arms:
                    acc[k].index_add_(0, rows, (arms[k][i] * v).expand(3, -1))
                acc["e"].index_add_(0, rows, scorer.grad(logp, f[i] * e_s * sel).expand(3, -1))
    return acc, used


def _bucket_report(label: str, g: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: each arm's norm and its cosine and norm ratio to (a); (b) − (a)
    against the cap gradient, and its projection ``β`` on it."""
    ga, cap = g["a"], g["cap"]
    entry: dict[str, Any] = {"bucket": label, "arms": {}}
    for k, gk in g.items():
        entry["arms"][k] = {
            "norm": float(gk.norm()),
            "cos_a": _cos(gk, ga),
            "norm_ratio": _ratio(gk, ga),
        }
    diff_ba = g["b"] - ga
    cap2 = float(cap.dot(cap))
    entry["b_minus_a"] = {
        "norm": float(diff_ba.norm()),
        "cos_cap": _cos(diff_ba, cap),
        "beta": float(diff_ba.dot(cap)) / cap2 if cap2 > 0 else float("nan"),
    }
    return entry


def _cos(u, v) -> float:
    d = float(u.norm() * v.norm())
    return float(u.dot(v)) / d if d > 0 else float("nan")


def _ratio(u, v) -> float:
    d = float(v.norm())
    return float(u.norm()) / d if d > 0 else float("nan")


def format_gradients(result: dict[str, Any]) -> str:
    """The gradient report as text: the check, then one table per bucket."""
    lines = [
        f"rollouts {result['rollouts']} (no reward, left out: {result['excluded_no_reward']}), parameters {result['parameters']}"
    ]
    if "check" in result:
        c = result["check"]
        lines.append(
            f"two-outcome check passed on {c['prompts']} prompts: max residual {c['max_residual']:.2e} "
            f"(rtol {c['rtol']:.0e}); finite-sample gap |g_b-(1-J)g_a|/|g_b| mean {c['gap_b_vs_(1-J)a_mean']:.3f}"
        )
    for entry in result["buckets"]:
        lines.append("")
        lines.append(f"[{entry['bucket']}]  {'arm':>6} {'|g|':>11} {'cos to a':>9} {'|g|/|a|':>9}")
        for k, m in entry["arms"].items():
            lines.append(
                f"{'':>{len(entry['bucket']) + 2}}  {k:>6} {m['norm']:11.4e} {m['cos_a']:9.4f} {m['norm_ratio']:9.4f}"
            )
        d = entry["b_minus_a"]
        lines.append(
            f"  (b)-(a): |.| {d['norm']:.4e}, cos to grad P(cap) {d['cos_cap']:.4f}, beta {d['beta']:.4f}"
        )
    lines.append("")
    lines.append(
        f"baseline masking pays, c_x * mean_x R0 averaged over rollouts: {result['baseline_paid']:.4f} "
        "(beta estimates it when groups are alike)"
    )
    return "\n".join(lines)
