"""The arms' advantages on one step of dumped rollouts, with frozen statistics.

Specification
-------------
Every statistic is computed once, from the unmasked batch, and frozen: the reward used by
every arm is ``R0`` (the rollout's reward, 0 when it is capped), the group std ``σ_x`` is
that of ``R0`` over all G members, and the loss denominators are those of the unmasked
batch. The arms then differ only in their mask or their baseline. Their letters are the
``replay`` column of ``rescue.arms``: (a) is ``zero``, (b) ``mask``, (c) ``survivor``, (e)
``turn``; (d) masks a fraction of the capped rollouts, an arm of the replay only:

``a``        no mask, ``A_i = (R0_i - mean_x R0) / σ_x`` (the reference);
``b``        capped rollouts masked (``A = 0``), baseline over all G: ``A_b = A_a · 1{kept}``;
``c``        capped rollouts masked, baseline over the survivors:
             ``A_c = (R0_i - mean_{kept} R0) / σ_x · 1{kept}`` (0 in a group without survivor);
``d<rho>``   a fraction ``rho`` of capped rollouts masked (``rescue.mask.mask_decision``, the
             filter's own per-trajectory coin), baseline over all G;
``e``        no mask, the turn-reached baseline: ``A_t = (R0_i - b_{i,ℓ_t}) / σ_x``.

``/ σ_x`` applies when ``std_normalize`` (GRPO: ``σ + eps`` when the group has more than one
member and ``σ > 0``, as ``rescue.advantages.group_advantages``); a per-token advantage is
the rollout's advantage on its loss tokens (turn index >= 1) and 0 on observation tokens.

Rollouts without a finite reward (``infra_no_result`` with no score) have no advantage under
any arm: they are left out of the batch and counted in ``ArmBatch.excluded``.

The P7 verdict compares per-token advantage variance under (e) and the leave-one-out
group baseline (``(e)`` with κ = ∞, ``= G/(G-1) · (a)`` per group): the reduction
``reduction_vs_loo = 1 - Var_e / Var_loo`` of one batch goes through the judge's rule for
P7 offline (``rescue.judge.offline.p7_verdict``: at or above ``P7_SUPPORTS`` as predicted,
below ``P7_FALSIFIES`` opposite, the turn-reached baseline has no lever; in between
inconclusive), the scale ``rescue report`` decides on with an interval over steps.

Reported beside it: the reduction against (a), ``1 - Var_e / Var_a`` (``reduction``,
``verdict``). (a)'s baseline includes ``R_i`` itself, which scales its expected gradient
by ``(G-1)/G`` and its variance by that squared, while (e) is built on leave-one-out means
(unbiased, scale 1), so against (a) the turn information must first make up that factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rescue.advantages import group_advantages, group_baseline, per_token_advantages, std_scale
from rescue.judge.offline import P7_FALSIFIES, P7_SUPPORTS, p7_verdict
from rescue.mask import mask_decision
from rescue.outcomes import Classification, Outcome
from rescue.replay.dumps import Trajectory

#: Default fractions of capped rollouts masked by the (d) arms.
DEFAULT_RHOS: tuple[float, ...] = (0.3, 0.6, 1.0)


@dataclass
class ArmBatch:
    """The unmasked batch of one step (or of several steps, groups stay per step)."""

    trajectories: list[Trajectory]  # with a finite reward, in dump order
    excluded: list[Trajectory]  # without one
    R0: np.ndarray  # [N] reward, 0 on cap
    group: np.ndarray  # [N] group code 0..B-1
    capped: np.ndarray  # [N] bool
    solved: np.ndarray  # [N] bool
    lengths: np.ndarray  # [N] turns reached
    counts: np.ndarray  # [N] response tokens per rollout (all siblings)
    token_turns: np.ndarray  # [T] turn index of every response token, rollouts in order

    @property
    def n(self) -> int:
        return len(self.trajectories)


def build_batch(trajectories: Sequence[Trajectory]) -> ArmBatch:
    """The batch of rollouts that carry a finite reward; the rest go to ``excluded``."""
    kept = [t for t in trajectories if t.reward is not None and np.isfinite(t.reward)]
    excluded = [t for t in trajectories if not (t.reward is not None and np.isfinite(t.reward))]
    codes: dict = {}
    group = np.array([codes.setdefault(t.group, len(codes)) for t in kept], dtype=np.int64)
    capped = np.array([t.capped for t in kept], dtype=bool)
    R = np.array([t.reward for t in kept], dtype=np.float64)
    turns = [
        np.concatenate(t.token_turns) if t.token_turns else np.zeros(0, np.int32) for t in kept
    ]
    return ArmBatch(
        trajectories=list(kept),
        excluded=excluded,
        R0=np.where(capped, 0.0, R),
        group=group,
        capped=capped,
        solved=np.array([t.record.outcome is Outcome.SOLVED for t in kept], dtype=bool),
        lengths=np.array([t.turns for t in kept], dtype=np.int64),
        counts=np.array([len(x) for x in turns], dtype=np.int64),
        token_turns=np.concatenate(turns) if turns else np.zeros(0, np.int32),
    )


def frozen_scale(
    R0: np.ndarray, group: np.ndarray, *, std_normalize: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``[N]`` factor ``1/(σ_x + eps)`` of each rollout's group, 1 where GRPO does not divide.

    ``σ_x`` is the unbiased std of ``R0`` over all members (``rescue.advantages.std_scale``,
    the rule of ``group_advantages``); 1 everywhere when ``std_normalize`` is False.
    """
    if not std_normalize or R0.size == 0:
        return np.ones(R0.shape)
    return std_scale(R0, group, eps=eps)


def mask_coins(batch: ArmBatch, rho: float, seed: int) -> np.ndarray:
    """``[N]`` bool: rollouts the ``d<rho>`` arm masks (the filter's own decision rule)."""
    out = np.zeros(batch.n, dtype=bool)
    for i, t in enumerate(batch.trajectories):
        c = Classification(t.record.outcome, t.record.reason)
        out[i] = mask_decision(c, t.key, rho, seed)
    return out


def scalar_arms(
    batch: ArmBatch,
    *,
    rhos: Sequence[float] = DEFAULT_RHOS,
    seed: int = 0,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> dict[str, np.ndarray]:
    """Per-rollout advantages ``[N]`` of the arms whose advantage is one number per rollout.

    Keys ``a``, ``b``, ``c``, ``d<rho>``; arm ``e`` is per token (``token_advantages``).
    Defaults: ``rhos`` (0.3, 0.6, 1.0), ``seed`` 0, GRPO std normalization on, eps 1e-6.
    """
    R0, g = batch.R0, batch.group
    kept = ~batch.capped
    scale = frozen_scale(R0, g, std_normalize=std_normalize, eps=eps)
    a = group_advantages(R0, g, population="all", std_normalize=False) * scale
    survivors = group_advantages(R0, g, population="survivors", kept=kept, std_normalize=False)
    arms = {"a": a, "b": np.where(kept, a, 0.0), "c": np.where(kept, survivors * scale, 0.0)}
    for rho in rhos:
        arms[f"d{rho:g}"] = np.where(mask_coins(batch, rho, seed), 0.0, a)
    return arms


def turn_reached_token_advantages(
    batch: ArmBatch, *, kappa: float = 2.0, std_normalize: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``[T]`` per-token advantages of arm (e), rollouts in batch order."""
    if batch.n == 0:
        return np.zeros(0, np.float32)
    g = batch.group
    B = int(g.max()) + 1
    rank = np.zeros(batch.n, dtype=np.int64)
    seen = np.zeros(B, dtype=np.int64)
    for i, gi in enumerate(g):
        rank[i] = seen[gi]
        seen[gi] += 1
    G = int(seen.max())
    R = np.zeros((B, G))
    L = np.zeros((B, G), dtype=np.int64)
    present = np.zeros((B, G), dtype=bool)
    R[g, rank], L[g, rank], present[g, rank] = batch.R0, batch.lengths, True
    bounds = np.concatenate(([0], np.cumsum(batch.counts)))
    rows: list[np.ndarray] = [np.zeros(0, np.int32)] * (B * G)
    for i in range(batch.n):
        rows[g[i] * G + rank[i]] = batch.token_turns[bounds[i] : bounds[i + 1]]
    out = per_token_advantages(
        R, L, rows, kappa=kappa, std_normalize=std_normalize, eps=eps, present=present
    )
    return np.concatenate([out[g[i] * G + rank[i]] for i in range(batch.n)])


def broadcast(batch: ArmBatch, per_rollout: np.ndarray) -> np.ndarray:
    """``[T]`` float32: each rollout's advantage on its loss tokens, 0 on observation tokens."""
    A = np.repeat(per_rollout.astype(np.float32), batch.counts)
    return np.where(batch.token_turns > 0, A, np.float32(0.0))


def token_advantages(
    batch: ArmBatch,
    *,
    rhos: Sequence[float] = DEFAULT_RHOS,
    seed: int = 0,
    kappa: float = 2.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> dict[str, np.ndarray]:
    """``[T]`` per-token advantages of every arm (see the module docstring)."""
    arms = {
        k: broadcast(batch, v)
        for k, v in scalar_arms(
            batch, rhos=rhos, seed=seed, std_normalize=std_normalize, eps=eps
        ).items()
    }
    arms["e"] = turn_reached_token_advantages(
        batch, kappa=kappa, std_normalize=std_normalize, eps=eps
    )
    return arms


def explained_share(values: np.ndarray, turns: np.ndarray) -> float:
    """``Var(E[values | turn]) / Var(values)`` over tokens (NaN when ``Var(values) = 0``)."""
    if values.size == 0:
        return float("nan")
    v = values.astype(np.float64)
    total = v.var()
    if total <= 0:
        return float("nan")
    n = np.bincount(turns)
    cond = np.divide(np.bincount(turns, weights=v), n, out=np.zeros(n.shape), where=n > 0)
    return float(cond[turns].var() / total)


def variance_report(
    batch: ArmBatch, tokens: dict[str, np.ndarray], *, std_normalize: bool = True, eps: float = 1e-6
) -> dict[str, float | str]:
    """Per-token variance under (a) and (e), the explained shares and the P7 verdict.

    Over loss tokens (turn index >= 1). ``explained_share`` is ``Var(E[R0 | turn])/Var(R0)``
    with each token carrying its rollout's ``R0``; ``explained_share_in_group`` is the same
    for the group-centred ``R0 - mean_x R0`` (what remains after the reference baseline).
    """
    loss = batch.token_turns > 0
    l_t = batch.token_turns[loss]
    R_tok = np.repeat(batch.R0, batch.counts)[loss]
    centred = np.repeat(batch.R0 - group_baseline(batch.R0, batch.group), batch.counts)[loss]
    var_a = _var(tokens["a"], loss)
    var_e = _var(tokens["e"], loss)
    scale = frozen_scale(batch.R0, batch.group, std_normalize=std_normalize, eps=eps)
    loo = group_advantages(batch.R0, batch.group, population="loo", std_normalize=False) * scale
    var_loo = _var(broadcast(batch, loo), loss)
    reduction = 1.0 - var_e / var_a if var_a > 0 else float("nan")
    reduction_loo = 1.0 - var_e / var_loo if var_loo > 0 else float("nan")
    return {
        "rollouts": float(batch.n),
        "excluded_no_reward": float(len(batch.excluded)),
        "groups": float(int(batch.group.max()) + 1 if batch.n else 0),
        "loss_tokens": float(loss.sum()),
        "var_a": var_a,
        "var_e": var_e,
        "reduction": reduction,
        "explained_share": explained_share(R_tok, l_t),
        "explained_share_in_group": explained_share(centred, l_t),
        "verdict": p7_verdict(reduction),
        "var_loo": var_loo,
        "reduction_vs_loo": reduction_loo,
        "verdict_vs_loo": p7_verdict(reduction_loo),
    }


def _var(values: np.ndarray, where: np.ndarray) -> float:
    return float(values[where].astype(np.float64).var()) if where.any() else float("nan")


def advantages_report(
    dumps: Sequence,
    *,
    rhos: Sequence[float] = DEFAULT_RHOS,
    seed: int = 0,
    kappa: float = 2.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> dict:
    """``variance_report`` per step and over all steps (groups stay within their step)."""
    opts = {"rhos": rhos, "seed": seed, "kappa": kappa, "std_normalize": std_normalize, "eps": eps}
    steps = []
    for d in dumps:
        batch = build_batch(d.trajectories)
        steps.append(
            {
                "step": d.step,
                "path": d.path,
                **variance_report(
                    batch, token_advantages(batch, **opts), std_normalize=std_normalize, eps=eps
                ),
            }
        )
    batch = build_batch([t for d in dumps for t in d.trajectories])
    tokens = token_advantages(batch, **opts)
    loss = batch.token_turns > 0
    arms = {
        k: {
            "mean": float(v[loss].mean()) if loss.any() else float("nan"),
            "var": float(v[loss].astype(np.float64).var()) if loss.any() else float("nan"),
        }
        for k, v in tokens.items()
    }
    total = variance_report(batch, tokens, std_normalize=std_normalize, eps=eps)
    return {"steps": steps, "total": total, "arms": arms}


def format_advantages(report: dict) -> str:
    """The advantages report as text."""
    lines = [
        f"{'step':>8} {'rollouts':>8} {'tokens':>10} {'Var(a)':>10} {'Var(e)':>10} {'reduction':>9} {'share':>7} {'share|x':>7}  verdict"
    ]

    def line(label: str, r: dict) -> str:
        return (
            f"{label:>8} {int(r['rollouts']):8d} {int(r['loss_tokens']):10d} {r['var_a']:10.4g} {r['var_e']:10.4g} "
            f"{r['reduction']:9.1%} {r['explained_share']:7.3f} {r['explained_share_in_group']:7.3f}  {r['verdict']}"
        )

    lines += [line(str(s["step"]), s) for s in report["steps"]]
    total = report["total"]
    lines.append(line("total", total))
    lines.append("")
    lines.append("per-token advantages over loss tokens, all steps:")
    for k, m in report["arms"].items():
        lines.append(f"  arm {k:<6} mean {m['mean']:+.4f}  var {m['var']:.4f}")
    if total["excluded_no_reward"]:
        lines.append(f"left out (no finite reward): {int(total['excluded_no_reward'])} rollouts")
    lines.append("")
    lines.append(
        f"P7 (turn-reached baseline reduces per-token advantage variance): "
        f"{total['verdict_vs_loo']} ({total['reduction_vs_loo']:.1%} reduction against the "
        f"leave-one-out group baseline, Var {total['var_loo']:.4g}, the scale the judge decides "
        f"on; at or above {P7_SUPPORTS:.0%} as predicted, below {P7_FALSIFIES:.0%} opposite)"
    )
    lines.append(
        f"  against (a), the group mean: {total['verdict']} ({total['reduction']:.1%} reduction); "
        "(a) counts R_i in its own baseline, which shrinks its variance by ((G-1)/G)^2 along "
        "with its expected gradient"
    )
    lines.append(
        "share = Var(E[R | turn]) / Var(R) over loss tokens; share|x = the same for R - mean_x R"
    )
    return "\n".join(lines)
