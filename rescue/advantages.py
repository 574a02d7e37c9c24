"""Group baselines and advantages: one normalizer for the simulator, Miles and slime.

Specification
-------------
A group is the G rollouts of one prompt, with rewards ``R_1 .. R_G``. The advantage of
rollout ``i`` is ``A_i = (R_i - b_i) / σ`` (or ``R_i - b_i`` without std normalization),
then ``× w_i``. The baseline population decides ``b_i``:

``all``        ``b = mean_j R_j`` over every member. Miles, slime, verl and TRL compute
               this: a loss-masked sample (``remove_sample``) still votes.
``survivors``  ``b = mean of R_j over kept members`` (rLLM compact filtering); ``σ`` over
               the kept members too. Applied to every member; a group with no survivor
               gets advantage 0.
``loo``        ``b_i = mean_{j≠i} R_j`` (leave-one-out; ``b_i`` never depends on ``R_i``,
               so the estimator is unbiased). A group of one has no other member:
               ``b = 0`` (plain REINFORCE), which keeps it unbiased.

``group_baseline`` returns ``b_i``; replay and the simulator's P7 statistic take their
group-mean and leave-one-out baselines from it (or from ``group_advantages``).

Std normalization (GRPO) divides by ``σ + eps`` with ``σ`` the unbiased (ddof=1) std of the
population's rewards, only when that population has more than one member and ``σ > 0``:
exactly Miles' ``_normalize_rewards_by_rollout``. Off (Dr. GRPO) leaves ``R_i - b_i``. One
function decides it (``_std_divisor``), for ``group_advantages``, ``std_scale`` and
``per_token_advantages`` alike.
Consequences: a group of one gets ``A = 0`` under ``all``/``survivors`` (``R - R``), and a
group whose rewards are all equal gets ``A = 0`` under every population.

The turn-reached baseline, for rollout ``i`` at turn ``ℓ`` (turns are 1-based)::

    n_ℓ   = #{j ≠ i : len_j ≥ ℓ}
    m_ℓ   = mean of R_j over those j                       (any value when n_ℓ = 0)
    b̄_i   = mean_{j≠i} R_j                                  (0 for a group of one)
    b_iℓ  = n_ℓ/(n_ℓ+κ) · m_ℓ + κ/(n_ℓ+κ) · b̄_i              (κ = 2 by default)

It reads only other members' rewards and lengths, so it never depends on ``R_i``: the
per-token advantage ``R_i - b_{i,ℓ_t}`` is unbiased. ``n_ℓ = 0`` gives ``b̄_i``; a group of
one gets ``b = 0``. Tokens with turn index 0 (observations, prompt) get advantage 0.

Per-sample weights ``w`` (the protect arm's ``1/a``) multiply AFTER normalization. This
deviates from the frameworks' default place for a loss weight on purpose: a weight folded
into the rewards before normalization would be divided out again by the group std and
re-centred by the mean; applied after, no normalization can undo it.

A NaN or infinite reward is an error naming the sample; no group or sample is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rescue.errors import InputError
from rescue.turns import TurnSpans, broadcast, check_turn_indices

Population = Literal["all", "survivors", "loo"]
POPULATIONS: tuple[str, ...] = ("all", "survivors", "loo")


def _finite(name: str, x: np.ndarray) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        idx = tuple(int(k) for k in np.argwhere(bad)[0])
        where = idx[0] if len(idx) == 1 else idx
        raise InputError(
            f"{name}[{where}] = {x[idx]!r} is not finite; every sample needs a finite value"
        )


def _per_sample(name: str, x, n: int, dtype=np.float64) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    if a.shape != (n,):
        raise InputError(f"{name} must have one entry per sample, shape ({n},); got {a.shape}")
    return a


@dataclass(frozen=True)
class _Votes:
    """Flat groups and who votes in ``b`` and ``σ``, on rewards shifted per group.

    ``X = R − R0`` with ``R0`` the group's first voter's reward, so that equal rewards
    give exactly 0 (and σ exactly 0); ``n`` voters per group, ``S`` their sum of ``X``.
    """

    R: np.ndarray  # [N] rewards
    g: np.ndarray  # [N] group code 0..n_groups-1
    v: np.ndarray  # [N] 1.0 for a voter, else 0.0
    R0: np.ndarray  # [n_groups]
    X: np.ndarray  # [N] R - R0[g]
    n: np.ndarray  # [n_groups] voters
    S: np.ndarray  # [n_groups] Σ of the voters' X

    @property
    def mean(self) -> np.ndarray:
        """``[n_groups]`` mean of the voters' ``X`` (0 without a voter)."""
        return np.divide(self.S, self.n, out=np.zeros(self.n.shape), where=self.n > 0)


def _votes(rewards, group_ids, population: str, kept) -> _Votes:
    """Validate the inputs of ``group_advantages`` and count the population's voters."""
    if population not in POPULATIONS:
        raise InputError(f"population={population!r}; allowed: {', '.join(POPULATIONS)}")
    R = np.asarray(rewards, dtype=np.float64)
    if R.ndim != 1:
        raise InputError(f"rewards must be 1-D (one reward per sample); got shape {R.shape}")
    _finite("rewards", R)
    N = R.shape[0]
    gid = np.asarray(group_ids)
    if gid.shape != (N,):
        raise InputError(f"group_ids must have shape ({N},) like rewards; got {gid.shape}")
    if population == "survivors":
        if kept is None:
            raise InputError('population="survivors" needs kept= (one bool per sample)')
        voter = _per_sample("kept", kept, N, dtype=bool)
    else:
        voter = np.ones(N, dtype=bool)
    if N == 0:
        empty = np.zeros(0)
        return _Votes(R, np.zeros(0, np.int64), empty, empty, empty, empty, empty)
    _, g = np.unique(gid, return_inverse=True)
    g = g.reshape(-1)
    n_groups = int(g.max()) + 1
    v = voter.astype(np.float64)
    R0 = np.zeros(n_groups)
    voters = np.flatnonzero(voter)
    has_voter, first = np.unique(g[voters], return_index=True)
    R0[has_voter] = R[voters[first]]
    X = R - R0[g]
    n = np.bincount(g, weights=v, minlength=n_groups)
    S = np.bincount(g, weights=v * X, minlength=n_groups)
    return _Votes(R, g, v, R0, X, n, S)


def _baseline(votes: _Votes, population: str) -> np.ndarray:
    """``[N]`` ``b_i`` of the population (module docstring); 0 where no one votes for it."""
    g, R0 = votes.g, votes.R0
    if population == "loo":
        n_i = votes.n[g] - 1.0
        b = np.divide(votes.S[g] - votes.X, n_i, out=np.zeros(g.shape), where=n_i > 0)
        return np.where(n_i > 0, b + R0[g], 0.0)  # group of one: b = 0
    return votes.mean[g] + R0[g]


def _std_divisor(votes: _Votes, eps: float) -> np.ndarray:
    """The GRPO std rule, per group: ``σ + eps`` where GRPO divides, else 1.

    ``σ`` is the unbiased (ddof=1) std of the voters' rewards; GRPO divides only when the
    group has more than one voter and ``σ > 0`` (Miles' ``_normalize_rewards_by_rollout``).
    Every std normalization in rescue divides by this.
    """
    n, g = votes.n, votes.g
    dev2 = votes.v * (votes.X - votes.mean[g]) ** 2
    var = np.divide(
        np.bincount(g, weights=dev2, minlength=n.shape[0]),
        n - 1.0,
        out=np.zeros(n.shape),
        where=n > 1,
    )
    sigma = np.sqrt(var)
    return np.where((n > 1) & (sigma > 0), sigma + eps, 1.0)


def group_baseline(rewards, group_ids, *, population: Population = "all", kept=None) -> np.ndarray:
    """``[N]`` the baseline ``b_i`` each sample's advantage subtracts (module docstring).

    ``"all"``: the group mean; ``"survivors"``: the mean over ``kept`` members (0 in a
    group without survivor); ``"loo"``: the mean of the other members (0 in a group of
    one). Arguments as ``group_advantages``; ``group_advantages(..., std_normalize=False)``
    is ``rewards - group_baseline(...)`` (times the weights).
    """
    return _baseline(_votes(rewards, group_ids, population, kept), population)


def group_advantages(
    rewards,
    group_ids,
    *,
    population: Population = "all",
    kept=None,
    std_normalize: bool = True,
    weights=None,
    eps: float = 1e-6,
) -> np.ndarray:
    """Advantages for flat, possibly ragged groups.

    Args:
        rewards: ``[N]`` rewards, finite.
        group_ids: ``[N]`` group id of each sample (any values ``np.unique`` can sort);
            members of a group need not be contiguous.
        population: ``"all"`` (default; every member votes, as Miles/slime do),
            ``"survivors"`` (mean/std over ``kept`` members), ``"loo"`` (leave-one-out mean).
        kept: ``[N]`` bool, required for ``"survivors"``; ignored by the other populations
            (under ``"all"`` a masked sample still votes, which is the point).
        std_normalize: divide by ``σ + eps`` when the population has > 1 member and
            ``σ > 0`` (default True, GRPO); False is Dr. GRPO. Under ``"loo"``, ``σ`` is
            the std over all members.
        weights: ``[N]`` per-sample loss weights, multiplied after normalization
            (default None = 1).
        eps: added to ``σ`` (default 1e-6, as Miles).

    Returns:
        ``[N]`` float64 advantages, in the input order.
    """
    votes = _votes(rewards, group_ids, population, kept)
    N = votes.R.shape[0]
    if N == 0:
        return np.zeros(0)
    A = votes.R - _baseline(votes, population)
    if std_normalize:
        A = A * (1.0 / _std_divisor(votes, eps))[votes.g]
    if population == "survivors":
        A = np.where((votes.n > 0)[votes.g], A, 0.0)  # no survivor: no baseline, no signal
    if weights is not None:
        w = _per_sample("weights", weights, N)
        _finite("weights", w)
        A = A * w
    return A


def std_scale(rewards, group_ids, *, eps: float = 1e-6) -> np.ndarray:
    """``[N]`` GRPO's std factor of each sample's group over all members: ``1/(σ + eps)``.

    The rule ``group_advantages(..., population="all", std_normalize=True)`` applies
    (unbiased σ; 1 for a group of one or with σ = 0), for callers that freeze σ and apply
    it to other centrings (offline replay).
    """
    votes = _votes(rewards, group_ids, "all", None)
    if votes.R.size == 0:
        return np.ones(0)
    return (1.0 / _std_divisor(votes, eps))[votes.g]


# ---------------------------------------------------------------- turn-reached baseline


def _groups(rewards, lengths, present):
    """Validate and lift to the batched layout ``[B, G]``; returns (R, L, P, batched)."""
    R = np.asarray(rewards, dtype=np.float64)
    batched = R.ndim == 2
    if R.ndim not in (1, 2):
        raise InputError(f"rewards must be [G] or [B, G]; got shape {R.shape}")
    Lr = np.asarray(lengths)
    if Lr.shape != R.shape:
        raise InputError(f"lengths must have the shape of rewards {R.shape}; got {Lr.shape}")
    whole = np.issubdtype(Lr.dtype, np.integer) or (
        np.all(np.isfinite(Lr)) and np.all(Lr == np.round(Lr))
    )
    if Lr.size and not whole:
        raise InputError("lengths must be whole numbers of turns")
    L = Lr.astype(np.int64)
    if (L < 0).any():
        raise InputError(f"lengths must be >= 0 turns; got {int(L.min())}")
    P = np.ones(R.shape, dtype=bool) if present is None else np.asarray(present, dtype=bool)
    if P.shape != R.shape:
        raise InputError(f"present must have the shape of rewards {R.shape}; got {P.shape}")
    R = np.where(P, R, 0.0)  # padding is never read
    _finite("rewards", R)
    L = np.where(P, L, 0)  # an absent (padding) member reached no turn
    if not batched:
        R, L, P = R[None], L[None], P[None]
    return R, L, P, batched


def _turn_table(R, L, P, kappa: float) -> np.ndarray:
    """``b[B, G, L_max]``; column ``ℓ-1`` is turn ``ℓ``. Padded members get 0."""
    if not (kappa >= 0):  # also rejects NaN
        raise InputError(f"kappa must be >= 0 (shrinkage strength κ); got {kappa!r}")
    Rp = np.where(P, R, 0.0)
    G = R.shape[1]
    # others[b, i, j] = 1 when j is a member of i's group other than i: every sum below
    # reads only the others, so b_i never depends on R_i (not even by rounding).
    others = (P[:, None, :] & ~np.eye(G, dtype=bool)).astype(np.float64)  # [B, G, G]
    L_max = int(L.max(initial=0))
    reached = (L[:, :, None] >= np.arange(1, L_max + 1)).astype(np.float64)  # [B, G, L_max]
    n_l = others @ reached  # n_ℓ: others who reached turn ℓ
    m_l = np.divide(
        others @ (Rp[:, :, None] * reached), n_l, out=np.zeros(n_l.shape), where=n_l > 0
    )
    n_o = others.sum(axis=2)
    b_bar = np.divide(
        others @ Rp[:, :, None],
        n_o[:, :, None],
        out=np.zeros((*n_l.shape[:2], 1)),
        where=n_o[:, :, None] > 0,
    )
    w = np.divide(n_l, n_l + kappa, out=np.zeros(n_l.shape), where=n_l + kappa > 0)  # n_ℓ/(n_ℓ+κ)
    b = w * m_l + (1.0 - w) * b_bar
    return np.where(P[:, :, None], b, 0.0)


def turn_reached_baseline(rewards, lengths, *, kappa: float = 2.0, present=None) -> np.ndarray:
    """The turn-reached baseline table ``b[i, ℓ-1] = b_{i,ℓ}`` (see the module docstring).

    Args:
        rewards: ``[G]`` rewards of one group, or ``[B, G]`` for a batch of groups.
        lengths: number of turns each rollout reached, same shape, integers >= 0.
        kappa: shrinkage κ >= 0 toward the leave-one-out group mean (default 2.0;
            0 = no shrinkage where some other member reached ℓ, inf = plain LOO).
        present: bool mask of real members for padded batches (default all present);
            absent members neither vote nor get a baseline (their rows are 0).

    Returns:
        ``[G, L_max]`` (or ``[B, G, L_max]``) float64, ``L_max = max(lengths)``; entries
        are defined for every ``ℓ``, a trainer reads those with ``ℓ <= len_i``.
    """
    R, L, P, batched = _groups(rewards, lengths, present)
    b = _turn_table(R, L, P, float(kappa))
    return b if batched else b[0]


def per_token_advantages(
    rewards,
    lengths,
    token_turns,
    *,
    kappa: float = 2.0,
    std_normalize: bool = False,
    weights=None,
    eps: float = 1e-6,
    present=None,
    dtype=np.float32,
):
    """Per-token advantages ``A_t = (R_i - b_{i,ℓ_t}) / σ · w_i`` with the turn-reached baseline.

    Args:
        rewards, lengths, kappa, present: as ``turn_reached_baseline``.
        token_turns: each token's 1-based turn index, 0 for tokens outside any turn
            (observations, prompt) which get advantage 0. Either an integer array whose
            leading shape is that of ``rewards`` (``[G, T]`` or ``[B, G, T]``, padded with
            0), or a sequence of 1-D arrays, one per rollout in row-major order. int64
            indices are fastest (other integer dtypes are converted on the fly). Or, the
            fastest form, a sequence of ``rescue.turns.TurnSpans``, one per rollout in
            row-major order (``turn_spans(loss_mask)`` derives them): turn ``ℓ`` is the
            span ``[starts[ℓ-1], stops[ℓ-1])``, every other token is an observation.
        std_normalize: divide by the group's ``σ + eps`` under the same rule as
            ``group_advantages`` (default False, Dr. GRPO). ``σ`` is computed over the
            whole group, ``R_i`` included, as GRPO does; only without it is the estimator
            exactly unbiased.
        weights: per-rollout loss weights, shape of ``rewards``, multiplied after
            normalization (default None = 1).
        eps: added to ``σ`` (default 1e-6).
        dtype: output dtype (default float32, what trainers consume).

    Returns:
        An array shaped like ``token_turns``, or a list of 1-D arrays for the list and
        span forms (for spans: ``n_tokens`` each, views of one buffer). A turn index above
        the rollout's ``length``, more spans than ``length``, or spans out of order,
        overlapping or past ``n_tokens`` are errors naming the rollout.
    """
    R, L, P, batched = _groups(rewards, lengths, present)
    b = _turn_table(R, L, P, float(kappa))  # [B, G, L_max]
    # Column 0 is turn 0 (observation tokens): advantage 0.
    A = np.zeros((*b.shape[:2], b.shape[2] + 1))
    A[:, :, 1:] = R[:, :, None] - b
    if std_normalize:  # σ over the whole group, R_i included, by the one std rule
        B, G = R.shape
        votes = _votes(R.ravel(), np.repeat(np.arange(B), G), "survivors", P.ravel())
        A = A / _std_divisor(votes, eps)[:, None, None]
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != np.shape(rewards):
            raise InputError(
                f"weights must have the shape of rewards {np.shape(rewards)}; got {w.shape}"
            )
        w = np.where(P, w if batched else w[None], 1.0)
        _finite("weights", w if batched else w[0])
        A = A * w[:, :, None]
    A = np.where(P[:, :, None], A, 0.0).astype(dtype)
    table = A.reshape(-1, A.shape[2])  # [B*G, L_max + 1]
    Ls = L.reshape(-1)

    if isinstance(token_turns, np.ndarray):
        if token_turns.shape[:-1] != np.shape(rewards):
            raise InputError(
                f"token_turns must be shaped {np.shape(rewards)} + (T,) like rewards; "
                f"got {token_turns.shape}"
            )
        T = token_turns.reshape(table.shape[0], -1)
        check_turn_indices(T, Ls)
        out = np.empty(T.shape, dtype=table.dtype)
        for k in range(T.shape[0]):  # one gather per rollout from its small [L_max + 1] row
            np.take(table[k], T[k], out=out[k], mode="wrap")  # indices checked above
        return out.reshape(token_turns.shape)
    seqs: Sequence = token_turns
    if len(seqs) != table.shape[0]:
        raise InputError(f"token_turns has {len(seqs)} rollouts; rewards has {table.shape[0]}")
    spans = [isinstance(t, TurnSpans) for t in seqs]
    if any(spans):
        if not all(spans):
            raise InputError(
                f"token_turns[{spans.index(False)}] is not TurnSpans; give every rollout "
                "as TurnSpans or every rollout as an array of turn indices"
            )
        return broadcast(table, seqs, Ls)
    out_list = []
    for k, t in enumerate(seqs):
        t = np.asarray(t)
        if t.ndim != 1:
            raise InputError(f"token_turns[{k}] must be 1-D (one turn index per token)")
        check_turn_indices(t[None], Ls[k : k + 1], first=k)
        out_list.append(table[k].take(t, mode="wrap"))
    return out_list
