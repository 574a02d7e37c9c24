"""Turns of a rollout as token spans: the loss mask of a merged multi-turn trajectory.

Specification
-------------
A merged multi-turn rollout is one token sequence ``turn_1 + obs + turn_2 + ... + turn_L``
whose loss mask is 1 on the agent's tokens and 0 on observation tokens. Turn ``ℓ`` is the
``ℓ``-th run of 1s, the half-open span ``[s_ℓ, e_ℓ)``. A rollout's spans are valid when::

    0 ≤ s_1 ≤ e_1 ≤ s_2 ≤ e_2 ≤ ... ≤ s_L ≤ e_L ≤ n_tokens

and so its tokens are the alternating segments ``gap_0, turn_1, gap_1, ..., turn_L, gap_L``
with lengths ``s_1, e_1 - s_1, s_2 - e_1, ..., n_tokens - e_L`` (all ≥ 0). A per-turn value
``v[ℓ]`` becomes per-token values by repeating ``0, v[1], 0, v[2], ..., v[L], 0`` by those
lengths: the same numbers a per-token turn index ``ℓ_t`` (0 on observations) gathers as
``v[ℓ_t]``, without reading or writing a per-token index.

``broadcast`` does this for a whole batch at once: the rollouts are laid end to end in one
token stream, so the stream is again ``gap, turn, gap, ..., turn, gap`` and one ``np.repeat``
writes every token. Invalid spans are an error naming the rollout and the turn.

``check_turn_indices`` checks the other form, one turn index per token (0 on observation
tokens): every index of a rollout lies in ``0..length``, whatever its integer type.

**Recorded spans.** A rollout that builds a sample's loss mask knows where each model
call's tokens start and stop; it records them in ``Sample.metadata[TURN_SPANS_KEY]``
(``record_turn_spans``: response-token positions and the response length, plain ints, so
they survive Ray, the dumps and JSON), and the turn-reached reward hook reads them
(``recorded_turn_spans``) instead of reading the spans back from the mask. The record must
be the spans the mask gives: turn ``ℓ`` is the ``ℓ``-th run of 1s (``mask_turn_spans``),
which a merged trajectory satisfies when every model call has at least one token and an
observation of at least one token separates two calls (Miles' ``merge_samples`` asserts
the latter). A record whose length is not the sample's ``response_length`` (the response
changed after it was recorded) is not used: the mask is read instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rescue.errors import InputError


@dataclass(frozen=True, eq=False)
class TurnSpans:
    """The turns of one rollout: turn ``ℓ`` is tokens ``starts[ℓ-1]:stops[ℓ-1]``.

    Attributes:
        starts: ``[L]`` first token of each turn (int64 after construction).
        stops: ``[L]`` one past the last token of each turn.
        n_tokens: tokens in the rollout; those outside every span (observations, prompt)
            get advantage 0.

    Only shapes and types are checked here; the order ``0 ≤ s_1 ≤ e_1 ≤ ... ≤ e_L ≤
    n_tokens`` is checked where the spans are used, naming the rollout.
    """

    starts: np.ndarray
    stops: np.ndarray
    n_tokens: int

    def __post_init__(self) -> None:
        for name in ("starts", "stops"):
            x = np.asarray(getattr(self, name))
            if x.ndim != 1 or (x.size and not np.issubdtype(x.dtype, np.integer)):
                raise InputError(
                    f"TurnSpans.{name} must be a 1-D integer array (one token index per "
                    f"turn); got shape {x.shape}, dtype {x.dtype}"
                )
            object.__setattr__(self, name, x.astype(np.int64, copy=False))
        if self.starts.shape != self.stops.shape:
            raise InputError(
                f"TurnSpans.starts and .stops must have one entry per turn; got "
                f"{self.starts.size} starts and {self.stops.size} stops"
            )
        if not isinstance(self.n_tokens, (int, np.integer)) or self.n_tokens < 0:
            raise InputError(f"TurnSpans.n_tokens must be an integer >= 0; got {self.n_tokens!r}")
        object.__setattr__(self, "n_tokens", int(self.n_tokens))


def turn_spans(loss_mask) -> TurnSpans | list[TurnSpans]:
    """The turns of a 0/1 loss mask: turn ``ℓ`` is the ``ℓ``-th run of 1s.

    Args:
        loss_mask: ``[T]`` 0/1 (or bool) mask of one rollout, or ``[..., T]`` for several
            rollouts of equal length (ragged rollouts: call it once per rollout).

    Returns:
        ``TurnSpans`` for a 1-D mask, else a list of them in row-major order (the order
        ``per_token_advantages`` reads rollouts in).
    """
    m = np.asarray(loss_mask)
    if m.ndim == 0:
        raise InputError("loss_mask must be [T] or [..., T] (one 0/1 entry per token)")
    K, T = math.prod(m.shape[:-1]), m.shape[-1]
    rows = m.reshape(K, T)
    if rows.dtype != bool:
        bad = (rows != 0) & (rows != 1)
        if bad.any():
            k, t = (int(x) for x in np.argwhere(bad)[0])
            raise InputError(
                f"loss_mask of rollout {k} holds {rows[k, t].item()!r} at token {t}; "
                "allowed: 0 (observation) and 1 (turn)"
            )
    # Rows end to end, each framed by a 0 on both sides: the value changes at the edges of
    # the runs of 1s, alternately a start and a stop, and no run crosses a row. An edge
    # between positions i and i+1 of the stream is token i % (T+2) of rollout i // (T+2).
    framed = np.zeros((K, T + 2), dtype=bool)
    framed[:, 1:-1] = rows
    stream = framed.ravel()
    rollout, token = np.divmod(np.flatnonzero(stream[1:] != stream[:-1]), T + 2)
    starts, stops, rollout = token[0::2], token[1::2], rollout[0::2]
    n_turns = np.bincount(rollout, minlength=K)
    last = np.cumsum(n_turns)
    spans = [
        TurnSpans(starts[a:b], stops[a:b], T)
        for a, b in zip((last - n_turns).tolist(), last.tolist(), strict=True)
    ]
    return spans[0] if m.ndim == 1 else spans


def broadcast(table: np.ndarray, spans: Sequence[TurnSpans], lengths: np.ndarray) -> list:
    """Per-token values ``table[k, ℓ]`` on turn ``ℓ`` of rollout ``k``, 0 between turns.

    Args:
        table: ``[K, L_max + 1]`` values per rollout and turn (column ``ℓ`` is turn ``ℓ``;
            column 0 is not read). Its dtype is the output's.
        spans: ``K`` ``TurnSpans``, one per row of ``table``.
        lengths: ``[K]`` turns each rollout reached; a rollout with more spans is an error.

    Returns:
        ``K`` 1-D arrays of ``n_tokens`` values each, views of one contiguous buffer.
    """
    K = len(spans)
    n_turns = np.array([len(s.starts) for s in spans], dtype=np.int64).reshape(K)
    over = np.flatnonzero(n_turns > lengths)
    if over.size:
        k = int(over[0])
        raise InputError(
            f"turn spans of rollout {k} hold {int(n_turns[k])} turns; its length is "
            f"{int(lengths[k])} turns"
        )
    n = np.array([s.n_tokens for s in spans], dtype=np.int64).reshape(K)
    first_token = np.cumsum(n) - n  # where each rollout starts in the stream
    first_span = np.cumsum(n_turns) - n_turns
    rollout = np.repeat(np.arange(K), n_turns)  # of each span
    ell = np.arange(rollout.size) - first_span[rollout] + 1  # its turn ℓ
    s = np.concatenate([x.starts for x in spans] or [np.zeros(0, np.int64)])
    e = np.concatenate([x.stops for x in spans] or [np.zeros(0, np.int64)])

    # Segment lengths of the stream gap, turn, gap, ..., turn, gap; every one >= 0.
    bounds = np.stack([s, e], axis=1).ravel() + np.repeat(first_token[rollout], 2)
    count = np.diff(bounds, prepend=0, append=n.sum())
    gap, run = count[:-1:2], count[1::2]
    bad = np.flatnonzero((gap < 0) | (run < 0) | (s < 0) | (e > n[rollout]))
    if bad.size:
        j = int(bad[0])
        k = int(rollout[j])
        after = f" after turn {ell[j] - 1} = [{s[j - 1]}, {e[j - 1]})" if ell[j] > 1 else ""
        raise InputError(
            f"turn spans of rollout {k} must satisfy 0 <= start_1 <= stop_1 <= start_2 <= ... "
            f"<= stop_L <= n_tokens={n[k]}; got turn {ell[j]} = [{s[j]}, {e[j]}){after}"
        )

    value = np.zeros(count.size, dtype=table.dtype)
    value[1::2] = table[rollout, ell]
    stream = np.repeat(value, count)
    return [stream[a : a + m] for a, m in zip(first_token.tolist(), n.tolist(), strict=True)]


def check_turn_indices(T: np.ndarray, L: np.ndarray, first: int = 0) -> None:
    """Every turn index of rollout ``first + k`` (row ``k`` of ``T``) lies in ``0..L[k]``.

    An error names the rollout and the index; one pass over the tokens.
    """
    if T.size == 0:
        return
    if not np.issubdtype(T.dtype, np.integer):
        raise InputError(f"token_turns must be integers; got dtype {T.dtype}")
    if T.dtype.kind == "i" and int(L.max(initial=0)) > np.iinfo(T.dtype).max:
        # A negative index viewed as unsigned (>= iinfo.max + 1) could fall inside 0..L:
        # compare the signed values at both ends.
        outside = (T.min(axis=1) < 0) | (T.max(axis=1) > L)
    else:
        # Viewed as unsigned, a negative index exceeds every length: one max per rollout.
        unsigned = T.view(np.dtype(f"u{T.dtype.itemsize}")) if T.dtype.kind == "i" else T
        outside = unsigned.max(axis=1) > L
    bad = np.flatnonzero(outside)
    if bad.size:
        k = int(bad[0])
        row = T[k]
        v = int(row[(row < 0) | (row > L[k])][0])
        raise InputError(
            f"token_turns of rollout {first + k} holds turn {v} outside 0..{int(L[k])} "
            "(0 = observation tokens, 1..length = its turns)"
        )


#: ``Sample.metadata`` key of the recorded turn spans (module docstring).
TURN_SPANS_KEY = "rescue_turn_spans"


def record_turn_spans(metadata: dict, spans: TurnSpans) -> None:
    """Record ``spans`` (one sample's turns, response-token positions) in ``metadata``."""
    metadata[TURN_SPANS_KEY] = {
        "starts": spans.starts.tolist(),
        "stops": spans.stops.tolist(),
        "n_tokens": spans.n_tokens,
    }


def recorded_turn_spans(metadata: Mapping[str, Any] | None, n_tokens: int) -> TurnSpans | None:
    """The spans recorded in ``metadata`` for a response of ``n_tokens``; None when none
    are recorded or the record is for another length. A malformed record is an error."""
    record = (metadata or {}).get(TURN_SPANS_KEY)
    if record is None:
        return None
    try:
        if int(record["n_tokens"]) != n_tokens:
            return None
        starts = np.fromiter(record["starts"], dtype=np.int64)
        stops = np.fromiter(record["stops"], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(
            f"metadata[{TURN_SPANS_KEY!r}] must be {{'starts': [int], 'stops': [int], "
            f"'n_tokens': int}}; got {record!r} ({type(e).__name__}: {e})"
        ) from None
    return TurnSpans(starts, stops, n_tokens)


def mask_turn_spans(loss_mask: Sequence[int]) -> TurnSpans:
    """``turn_spans`` of one mask given as a sequence of 0/1 ints (a ``Sample.loss_mask``).

    Same spans as ``turn_spans(np.asarray(loss_mask))``, read without building an integer
    array: the mask becomes bytes in one C pass, and each edge of a run of 1s is found with
    ``bytearray.find``, so the cost is one pass plus two searches per turn.
    """
    if isinstance(loss_mask, np.ndarray):
        spans = turn_spans(loss_mask.reshape(-1))
        assert isinstance(spans, TurnSpans)
        return spans
    try:
        buf = bytearray(loss_mask)
    except (TypeError, ValueError):
        buf = None
    if buf is None or buf.translate(None, b"\x00\x01"):
        values = list(loss_mask)
        t = next(k for k, v in enumerate(values) if v not in (0, 1))
        raise InputError(
            f"loss_mask holds {values[t]!r} at token {t}; allowed: 0 (observation) and 1 (turn)"
        )
    starts: list[int] = []
    stops: list[int] = []
    find, n, pos = buf.find, len(buf), 0
    while (s := find(1, pos)) >= 0:
        e = find(0, s)
        pos = n if e < 0 else e
        starts.append(s)
        stops.append(pos)
    return TurnSpans(np.array(starts, dtype=np.int64), np.array(stops, dtype=np.int64), n)
