"""Per-token turn-reached advantages in the reward hook (``RESCUE_ESTIMATOR=turn``).

Specification
-------------
For rollout ``i`` of a group and each of its response tokens ``t`` in turn ``ℓ_t`` the
trained advantage is ``A_t = w_i (R_i - b_{i,ℓ_t}) / σ``, with ``b`` the turn-reached
baseline (``rescue.advantages.per_token_advantages``: leave-one-out over the members that
reached turn ``ℓ``, shrunk toward the leave-one-out group mean with ``n_ℓ/(n_ℓ+κ)``),
``σ`` the group std under GRPO's rule (``--disable-grpo-std-normalization`` drops it) and
``w_i`` the protect arm's ``metadata["rescue_weight"]``, applied after normalization.
Observation tokens (turn 0) get 0; the loss mask excludes them anyway.

**Channel.** Miles keeps only whitelisted fields between the reward hook and the loss.
The one per-token float field that reaches the loss micro-batch and is otherwise unused is
``Sample.opd_reverse_kl``; slime's Sample has no such field, and its whitelisted per-token
float field is ``teacher_log_probs``. The hook writes ``A_t`` there (a float32 tensor per
sample, CP-sliced by the trainer like the log-probs; plain lists under
``--object-store-backend mooncake``) and returns the scalar reward 0 for every sample, so
the trainer's GRPO advantage is ``0 + A_t`` exactly. The consumer adds it:

- Miles: ``--loss-type custom_loss --custom-loss-function-path
  rescue.miles.loss.policy_loss`` (adds the channel to ``batch["advantages"]`` and calls
  Miles' own ``policy_loss_function``), or ``rescue.miles.sc_loss.policy_loss`` (the same
  advantages under TIS + score centering). Not ``--use-opd``: OPD would *subtract* the field,
  so the combination is refused.
- slime: ``--custom-advantage-function-path rescue.slime.advantages.turn_advantages``.

**Turns.** A rollout is the samples sharing ``(group, rollout_id)`` (else ``index``), in
list order; its model calls ``C`` are the entries of their ``weight_versions`` that
produced tokens, a call that resumed an aborted sample joined to the one it resumed
(``rescue.model_calls.turn_count``: slime aborts the requests in flight at every weight
update and resumes them, so a single-turn reply can carry two versions; Miles' samples,
without the record of their calls, count every entry).

- A group in which some rollout made more than one model call (or, with no weight version
  recorded, has more than one run of 1s) is *multi-turn*: turn ``ℓ`` is the ``ℓ``-th run
  of 1s in the rollout's loss masks, read across its samples in list order (a sample's
  ``loss_mask`` of ``None`` is all 1s). A sample whose rollout recorded its spans where
  the mask was built (``rescue.turns.TURN_SPANS_KEY`` in its metadata, for its
  ``response_length``) is not read: its record is used, the same spans without a pass
  over the mask; the others are read back from the mask. When ``C > 0`` the number of runs must equal ``C``;
  a disagreement (a turn with no output token, a tool response of no token, a partial
  rollout's masked segment) is an ``InputError`` naming the sample, never a guess.
- A group whose every rollout made at most one model call is *single-turn*: turn ``ℓ``
  covers response tokens ``[(ℓ-1)K, ℓK)`` (positions counted across siblings),
  ``K = RESCUE_TURN_TOKENS`` (default 512). This is the single-turn deviation: the "turn
  reached" is the number of K-token chunks the response reached, prefix-measurable like a
  turn, so the baseline stays unbiased.

**Population** (``RESCUE_BASELINE``): ``all`` lets every rollout vote; ``survivors`` lets
only rollouts with an unmasked sample vote (and be normalized); the others get 0.

**Preconditions**, checked at every call (the first call stops a misconfigured run, with
the flags named): ``--advantage-estimator grpo|gspo``, rewards normalization on, no
``--normalize-advantages`` (it would whiten the zero scalar), no ``--use-opd``, and the
consumer above configured. Siblings must share one reward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rescue import flags
from rescue.errors import InputError
from rescue.samples import SampleView, views
from rescue.turns import TurnSpans

#: Environment variable choosing the estimator of the reward hook.
ENV_ESTIMATOR = "RESCUE_ESTIMATOR"
#: Allowed values of ``RESCUE_ESTIMATOR``; the first is the default.
ESTIMATORS = ("group", "turn")
#: Environment variable: shrinkage κ of the turn-reached baseline.
ENV_KAPPA = "RESCUE_KAPPA"
DEFAULT_KAPPA = 2.0
#: Environment variable: tokens per "turn" of a single-turn rollout.
ENV_TURN_TOKENS = "RESCUE_TURN_TOKENS"
DEFAULT_TURN_TOKENS = 512

#: The Miles losses that consume the channel (Miles' PPO loss, and TIS + score centering),
#: and slime's advantage function.
MILES_LOSS_PATH = "rescue.miles.loss.policy_loss"
MILES_LOSS_PATHS = (MILES_LOSS_PATH, "rescue.miles.sc_loss.policy_loss")
SLIME_ADVANTAGE_PATH = "rescue.slime.advantages.turn_advantages"
#: The per-token channel field in Miles and in slime.
MILES_CHANNEL = "opd_reverse_kl"
SLIME_CHANNEL = "teacher_log_probs"
#: Estimators whose GRPO advantage the turn-reached baseline replaces.
TURN_ESTIMATORS = frozenset({"grpo", "gspo"})


#: ``RESCUE_ESTIMATOR`` (default ``group``).
ESTIMATOR = flags.choice(ENV_ESTIMATOR, ESTIMATORS)
estimator_from_env = ESTIMATOR.read
#: ``RESCUE_KAPPA`` (default 2), a number >= 0 (``inf`` is the plain leave-one-out mean).
KAPPA = flags.amount(ENV_KAPPA, DEFAULT_KAPPA, 0, finite=False)
kappa_from_env = KAPPA.read
#: ``RESCUE_TURN_TOKENS`` (default 512), an integer >= 1.
TURN_TOKENS = flags.count(ENV_TURN_TOKENS, DEFAULT_TURN_TOKENS, 1)
turn_tokens_from_env = TURN_TOKENS.read


def is_slime_sample(sample: Any) -> bool:
    """Whether a sample is slime's (it has no ``opd_reverse_kl`` field)."""
    return not hasattr(sample, MILES_CHANNEL)


def check_turn_supported(args: Any, *, slime: bool = False) -> None:
    """Refuse every setting under which the channel would not be the trained advantage."""
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in TURN_ESTIMATORS:
        raise InputError(
            f"{ENV_ESTIMATOR}=turn with --advantage-estimator {estimator}; allowed: "
            f"{', '.join(sorted(TURN_ESTIMATORS))}"
        )
    if not getattr(args, "rewards_normalization", True):
        raise InputError(
            f"{ENV_ESTIMATOR}=turn with --disable-rewards-normalization: the turn-reached "
            "baseline is a normalization; remove the flag or use RESCUE_ESTIMATOR=group"
        )
    if getattr(args, "normalize_advantages", False):
        raise InputError(
            f"{ENV_ESTIMATOR}=turn with --normalize-advantages: it whitens the scalar part only "
            "and would undo the per-token baseline; remove the flag"
        )
    if getattr(args, "use_opd", False):
        raise InputError(
            f"{ENV_ESTIMATOR}=turn with --use-opd: the per-token advantages ride the OPD field, "
            "and OPD would subtract them; remove --use-opd (rescue's consumer adds them)"
        )
    if slime:
        path = getattr(args, "custom_advantage_function_path", None)
        if path != SLIME_ADVANTAGE_PATH:
            raise InputError(
                f"{ENV_ESTIMATOR}=turn in slime needs --custom-advantage-function-path "
                f"{SLIME_ADVANTAGE_PATH} (got {path!r}): it adds the per-token advantages"
            )
        return
    loss_type = getattr(args, "loss_type", None)
    path = getattr(args, "custom_loss_function_path", None)
    if loss_type != "custom_loss" or path not in MILES_LOSS_PATHS:
        raise InputError(
            f"{ENV_ESTIMATOR}=turn needs --loss-type custom_loss --custom-loss-function-path "
            f"{' or '.join(MILES_LOSS_PATHS)} (got --loss-type {loss_type}, "
            f"--custom-loss-function-path {path}): those losses add the per-token advantages "
            "to Miles' advantages"
        )


def _describe(read: Sequence[SampleView], i: int) -> str:
    return f"sample {i} ({read[i].describe()})"


def _rollout_spans(
    read: Sequence[SampleView], rows: list[int], multi_turn: bool, chunk: int
) -> tuple[TurnSpans, int]:
    """The spans of one rollout over its samples' responses laid end to end, and its length."""
    lengths = [read[i].response_length for i in rows]
    n = sum(lengths)
    if not multi_turn:
        starts = np.arange(0, n, chunk, dtype=np.int64)
        return TurnSpans(starts, np.minimum(starts + chunk, n), n), int(starts.size)
    parts = [_spans(read, i) for i in rows]
    if len(parts) == 1:
        span = parts[0]
    else:
        offsets = np.cumsum([0, *lengths[:-1]])
        starts = np.concatenate([p.starts + o for p, o in zip(parts, offsets, strict=True)])
        stops = np.concatenate([p.stops + o for p, o in zip(parts, offsets, strict=True)])
        span = TurnSpans(starts, stops, n)
    runs = int(span.starts.size)
    calls = sum(read[i].turn_count for i in rows)
    if calls and runs != calls:
        raise InputError(
            f"{_describe(read, rows[0])}: its rollout's loss mask has {runs} runs of 1s but "
            f"{calls} model calls (weight_versions); turns cannot be assigned (a turn without "
            "output tokens, a tool response without tokens, a masked partial-rollout segment, "
            "or a partial rollout resumed within one turn: on slime, set "
            "--custom-generate-function-path rescue.slime.generate.generate, which records "
            "the calls)"
        )
    return span, runs


def _spans(read: Sequence[SampleView], i: int) -> TurnSpans:
    """The view's turn spans, an error naming the sample's position in the batch."""
    try:
        return read[i].turn_spans
    except InputError as e:
        raise InputError(f"{_describe(read, i)}: {e}") from None


def _calls_or_runs(read: Sequence[SampleView], rows: list[int]) -> int:
    calls = sum(read[i].turn_count for i in rows)
    if calls:
        return calls
    return sum(int(_spans(read, i).starts.size) for i in rows)


def turn_advantages(
    args: Any,
    samples: Sequence[Any],
    rewards: np.ndarray,
    rollout_rows: Mapping[tuple[Any, Any], list[int]],
    weights: np.ndarray,
    *,
    population: str = "all",
    std_normalize: bool = True,
    eps: float = 1e-6,
    read: Sequence[SampleView] | None = None,
) -> list[float]:
    """Write each sample's per-token advantages into the channel; return scalar rewards 0.

    Args:
        args: the framework's arguments (preconditions in the module docstring).
        samples: the flat list of samples of one step.
        rewards: ``[N]`` finite scalar rewards (siblings must agree).
        rollout_rows: sample positions of each rollout keyed ``(group, rollout key)``
            (``rescue.reward.rollouts``).
        weights: ``[N]`` loss weights (``metadata["rescue_weight"]``, 1 when absent).
        population: ``all`` or ``survivors``.
        std_normalize: divide by the group's ``σ + eps`` (GRPO).
        eps: the std guard.
        read: the samples' views (``rescue.samples.views``; default: read here).

    Returns:
        ``[0.0] * N``: the scalar part of each sample's advantage.
    """
    from rescue.advantages import per_token_advantages

    if not samples:
        return []
    slime = is_slime_sample(samples[0])
    check_turn_supported(args, slime=slime)
    read = views(samples) if read is None else read
    kappa, chunk = kappa_from_env(), turn_tokens_from_env()

    groups: dict[Any, list[list[int]]] = {}
    for (g, _), rows in rollout_rows.items():
        groups.setdefault(g, []).append(rows)
    B, G = len(groups), max(len(v) for v in groups.values())
    R = np.zeros((B, G))
    L = np.zeros((B, G), dtype=np.int64)
    W = np.ones((B, G))
    P = np.zeros((B, G), dtype=bool)
    spans: list[TurnSpans] = [TurnSpans(np.zeros(0, np.int64), np.zeros(0, np.int64), 0)] * (B * G)
    members: list[list[int] | None] = [None] * (B * G)
    for b, rollouts in enumerate(groups.values()):
        multi_turn = any(_calls_or_runs(read, rows) > 1 for rows in rollouts)
        for k, rows in enumerate(rollouts):
            first = rows[0]
            for i in rows[1:]:
                if rewards[i] != rewards[first]:
                    raise InputError(
                        f"all samples of a rollout must share one reward; {_describe(read, i)} "
                        f"has {rewards[i]!r}, {_describe(read, first)} has {rewards[first]!r}"
                    )
            kept = any(not read[i].remove_sample for i in rows)
            span, turns = _rollout_spans(read, rows, multi_turn, chunk)
            R[b, k], W[b, k] = rewards[first], weights[first]
            P[b, k] = population == "all" or kept
            L[b, k] = turns
            spans[b * G + k] = (
                span if P[b, k] else TurnSpans(span.starts[:0], span.stops[:0], span.n_tokens)
            )
            members[b * G + k] = rows

    per_rollout = per_token_advantages(
        R, L, spans, kappa=kappa, std_normalize=std_normalize, weights=W, eps=eps, present=P
    )
    as_lists = getattr(args, "object_store_backend", "ray") == "mooncake"
    import torch

    channel = SLIME_CHANNEL if slime else MILES_CHANNEL
    for values, rows in zip(per_rollout, members, strict=True):
        if rows is None:
            continue
        start = 0
        for i in rows:
            n = read[i].response_length
            part = values[start : start + n]
            start += n
            setattr(samples[i], channel, part.tolist() if as_lists else torch.from_numpy(part))
    return [0.0] * len(samples)
