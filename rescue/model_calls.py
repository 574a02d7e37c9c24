"""A sample's model calls: which weight versions produced trained tokens, and its turns.

Specification
-------------
A trainer's ``Sample`` lists one weight version per model reply it received
(``weight_versions``: slime and Miles append ``meta_info["weight_version"]`` with every
reply, ``slime/utils/types.py`` ``_apply_meta_info``). A reply that was aborted counts
there too, even when it carried no token: slime pauses its engines at every weight update
with SGLang's default ``abort`` mode, the aborted reply records the old version, the
worker requeues the group and slime's ``generate()`` resumes the sample from its tokens.
A single-turn sample then ends with two versions and one stretch of trained tokens.

So a version is *counted* (for staleness) only when the model call that recorded it
produced trained tokens, and a *turn* is a model call that produced tokens, a call that
resumes an aborted sample continuing the call it resumes. Both need to know which response
tokens each call produced; ``rescue.slime.generate`` (a generate-function wrapper) records
that on the sample as ``metadata["rescue_calls"]`` (``CALLS_KEY``): one entry
``[start, stop, versions, resumed]`` per generate call, with the response length before
and after the call, the number of weight versions the call appended, and whether the
sample entered the call aborted (a resume).

Rules (``calls``, ``counted_weight_versions``, ``turn_count``):

- a record is *consistent* when its entries are lists of four, ``0 <= start <= stop <=
  response_length``, the starts never decrease, and the versions add up to
  ``len(weight_versions)``; anything else (no record, a generate function that rebuilt
  ``weight_versions``, a sample the wrapper never saw) falls back to the plain rules:
  every version counts and every version is a turn (what Miles' samples get: Miles pauses
  its engines ``in_place`` or ``retract``, without aborting them);
- a call that appended one version produced the tokens ``[start, stop)``; a call that
  appended several (a multi-turn generate function: several replies in one call) cannot
  be split, so each of its versions is taken to have produced the call's tokens;
- tokens are *trained* where the loss mask is 1 (a mask of ``None``, or one whose length
  is not the response length, counts every token); the mask read is the final one, so a
  segment ``--partial-rollout --mask-offpolicy-in-partial-rollout`` masked does not count;
- the first version appended by a resumed call continues the previous model call: they
  are one turn, which counts when any of its calls produced tokens.

Framework-free: fields are read by name, from a ``Sample`` or a Sample dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Metadata key of the generate wrapper's record (``rescue.slime.generate``).
CALLS_KEY = "rescue_calls"


def _field(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


@dataclass(frozen=True)
class ModelCall:
    """One model reply of a sample: its weight version and the response tokens it produced.

    Attributes:
        version: the weight version the reply recorded.
        start: first response position of its tokens.
        stop: one past the last (``start == stop``: the reply carried no token).
        resumes: it continues the previous model call (the sample was aborted, requeued
            and resumed).
    """

    version: Any
    start: int
    stop: int
    resumes: bool = False


def record_entry(start: int, stop: int, versions: int, resumed: bool) -> list:
    """One entry of ``metadata["rescue_calls"]`` (what the wrapper appends per call)."""
    return [int(start), int(stop), int(versions), bool(resumed)]


def calls(sample: Any) -> list[ModelCall] | None:
    """The sample's model calls from its record; ``None`` when it has no consistent one."""
    metadata = _field(sample, "metadata") or {}
    record = metadata.get(CALLS_KEY) if isinstance(metadata, dict) else None
    versions = _field(sample, "weight_versions") or ()
    return calls_of(record, versions, int(_field(sample, "response_length", 0) or 0))


def calls_of(record: Any, versions: Sequence[Any], n: int) -> list[ModelCall] | None:
    """The model calls of a record (``metadata["rescue_calls"]``) of a sample with these
    weight versions and ``n`` response tokens; ``None`` when the record is not consistent."""
    if not isinstance(record, list) or not record:
        return None
    versions = list(versions)
    out: list[ModelCall] = []
    last_start = 0
    for entry in record:
        if not isinstance(entry, (list, tuple)) or len(entry) != 4:
            return None
        start, stop, k, resumed = entry
        if not (0 <= last_start <= start <= stop <= n) or k < 0:
            return None
        last_start = start
        for j in range(int(k)):
            if len(out) >= len(versions):
                return None
            out.append(
                ModelCall(versions[len(out)], int(start), int(stop), bool(resumed) and j == 0)
            )
    return out if len(out) == len(versions) else None


def _trained(mask: Sequence[int] | None, start: int, stop: int) -> bool:
    if mask is None:
        return stop > start
    return any(mask[start:stop])


def trained_mask(loss_mask: Sequence[int] | None, n: int) -> Sequence[int] | None:
    """The loss mask that says which tokens are trained: ``None`` (every token) when there
    is none or its length is not the response length ``n``."""
    return loss_mask if loss_mask is not None and len(loss_mask) == n else None


def counted_weight_versions(sample: Any) -> list[Any]:
    """The versions that count for staleness: those of model calls that produced trained
    tokens (every version without a consistent record)."""
    n = int(_field(sample, "response_length", 0) or 0)
    return counted_of(
        calls(sample),
        _field(sample, "weight_versions") or (),
        trained_mask(_field(sample, "loss_mask"), n),
    )


def counted_of(
    found: list[ModelCall] | None, versions: Sequence[Any], mask: Sequence[int] | None
) -> list[Any]:
    """``counted_weight_versions`` from a sample's calls (``calls_of``), its versions and
    its ``trained_mask``."""
    if found is None:
        return list(versions)
    return [c.version for c in found if _trained(mask, c.start, c.stop)]


def turn_count(sample: Any) -> int:
    """Model calls that produced tokens, a resumed call joined to the call it resumes
    (``len(weight_versions)`` without a consistent record)."""
    return turns_of(calls(sample), len(_field(sample, "weight_versions") or ()))


def turns_of(found: list[ModelCall] | None, n_versions: int) -> int:
    """``turn_count`` from a sample's calls (``calls_of``) and its number of versions."""
    if found is None:
        return n_versions
    turns = 0
    produced = None  # whether the current turn produced tokens; None before the first
    for c in found:
        if c.resumes and produced is not None:
            produced = produced or c.stop > c.start
            continue
        turns += bool(produced)
        produced = c.stop > c.start
    return turns + bool(produced)
