"""A group through the gate: what rescue writes on its samples, and its census bucket.

Specification
-------------
- gating (``gate_group``, shared by the Miles buffer and the slime drain): the gate
  decides on the group id and staleness; a dropped group's bucket is ``dropped_stale``;
  a kept group is tagged with its loss weight (``1/a`` when protected, any leftover key
  removed otherwise) and its bucket is ``trained_protected``, ``trained_stale`` or
  ``trained_fresh``. ``GatedGroup.settle`` closes its census entry with the records of
  its trajectories as they are at that moment.
- recording (also ``gate_group``, every arm): every sample of every group that reaches
  the gate carries ``metadata["rescue_staleness"]`` (``STALENESS_KEY``; ``None`` when
  unknown), ``metadata["rescue_would_drop"]`` (``WOULD_DROP_KEY``: the group is stale,
  so the drop arm drops it) and ``metadata["rescue_coin"]`` (``COIN_KEY``: the protect
  coin ``u(seed, group id)`` of the gate's seed, which protect compares with ``a``). A
  never-drop run's dump therefore holds the cohort and every arm's selection of it
  (``rescue.oracle``); the selection is recomputed with ``Gate.decide_drawn``.

Samples are read through ``rescue.samples`` (their group id, staleness and records).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rescue.census import Bucket, Census
from rescue.gate import Gate
from rescue.samples import (
    COIN_KEY,
    STALENESS_KEY,
    WEIGHT_KEY,
    WOULD_DROP_KEY,
    field,
    group_id,
    group_records,
    group_staleness,
    iter_samples,
)


def sample_metadata(sample: Any) -> dict:
    """The sample's metadata dict, created (and attached) when it has none."""
    is_dict = isinstance(sample, dict)
    metadata = sample.get("metadata") if is_dict else getattr(sample, "metadata", None)
    if metadata is None:
        metadata = {}
        if is_dict:
            sample["metadata"] = metadata
        else:
            sample.metadata = metadata
    return metadata


def set_group_weight(group: Iterable[Any], weight: float | None) -> None:
    """Write ``weight`` into every sample's metadata, or remove the key when ``None``."""
    for s in iter_samples(group):
        if weight is None:
            if metadata := field(s, "metadata"):
                metadata.pop(WEIGHT_KEY, None)
            continue
        sample_metadata(s)[WEIGHT_KEY] = float(weight)


def tag_group(group: Iterable[Any], staleness: int | None, would_drop: bool, u: float) -> None:
    """Record the gate's inputs on every sample: staleness, would-drop and the coin."""
    for s in iter_samples(group):
        metadata = sample_metadata(s)
        metadata[STALENESS_KEY] = staleness
        metadata[WOULD_DROP_KEY] = bool(would_drop)
        metadata[COIN_KEY] = float(u)


@dataclass
class GatedGroup:
    """A group after the gate: its id, staleness, census bucket and loss weight."""

    gid: int | str
    group: Any
    staleness: int | None
    bucket: Bucket
    weight: float

    @property
    def kept(self) -> bool:
        """Whether the gate kept the group for training."""
        return self.bucket.trained

    def settle(self, census: Census, *, reward_key: str | None = None) -> None:
        """Close the group's census entry into its bucket, with its trajectories' records."""
        records = group_records(self.group, reward_key=reward_key)
        census.settle(self.gid, self.bucket, records, staleness=self.staleness, weight=self.weight)


def gate_group(gate: Gate, group: Sequence[Any], current_version: int | None) -> GatedGroup:
    """Pass one group through the gate, recording its inputs on every sample; a kept group
    is tagged with its loss weight."""
    gid = group_id(group)
    staleness = group_staleness(group, current_version)
    u = gate.coin(gid)
    decision = gate.decide_drawn(gate.is_stale(staleness), u)
    tag_group(group, staleness, decision.stale, u)
    if decision.keep:
        set_group_weight(group, decision.weight if decision.protected else None)
    return GatedGroup(gid, group, staleness, Bucket.after_gate(decision), decision.weight)
