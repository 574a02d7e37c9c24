"""The sample model: groups, trajectories, staleness and census records of trainer samples.

Specification
-------------
This module is the one converter from a trainer's sample shapes to the core's plain
records; the simulator's census, replay, the sample filters and every adapter (the Miles
buffer, reward hook and log function, the slime drain) go through it. It imports no
framework: it reads fields by name, so it accepts

- a Miles or slime ``Sample`` (or any object with the same attributes),
- a Sample dict (``Sample.to_dict()``, as in ``--save-debug-rollout-data`` dumps),
- a *trajectory*: one sample, or a ``list`` of samples that together form one rollout
  (Miles' multi-sample generate functions, e.g. one ``Sample`` per turn),
- a *group*: a list of trajectories (Miles' ``Group = list[Sample | list[Sample]]``).

Rules (each equal to Miles' own where Miles has one):

- group id: the first sample's ``group_index`` (stable across retries; Miles' data source
  assigns it per prompt draw); else ``"index:<index>"``; else ``"prompt:<hash>"`` of the
  prompt text, so the gate's coin is still a pure function of the group.
- oldest weight version of a sample: the minimum of its numeric counted versions
  (``rescue.model_calls.counted_weight_versions``: those of model calls that produced
  trained tokens, so a reply aborted at a weight update before its first token, or a
  segment the loss mask excludes, does not make the group look staler than its tokens;
  every version when the sample has no record of its calls); ``None`` if none is numeric;
  of a group: the minimum over all samples and turns; staleness = ``current_version -
  oldest`` (``None`` if either is unknown). The newest version of a group (what the slime
  drain's current version is bounded below by) reads every version.
- a group without a result: ``rescue.census.no_result`` of its records (a sample with
  status ``aborted`` makes its trajectory's record ``infra_no_result``, reason
  ``aborted``).
- a trajectory's record (``rollout_record``): status ``aborted`` if any sample is
  aborted, else the last sample's status (Miles' merged status is the last turn's);
  reward of the last sample that has one (``reward_key`` picks a field of a dict
  reward, as ``--reward-key`` does); metadata of all samples merged, later samples
  winning; turns from ``metadata["turns"]`` / ``metadata["agent_metrics"]["turns"]``,
  else the model calls that produced tokens, a resumed call joined to the one it resumes
  (``rescue.model_calls.turn_count`` summed; ``len(weight_versions)`` without a record of
  the calls), else unknown;
  masked when every sample has ``remove_sample`` set (a partly masked trajectory still
  trains). The outcome comes from ``rescue.outcomes.classify``.
- loss weight: ``metadata["rescue_weight"]`` (``WEIGHT_KEY``) on every sample of a
  protected group; absent means 1.
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
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rescue.census import Bucket, Census, RolloutRecord
from rescue.errors import InputError
from rescue.gate import Gate
from rescue.model_calls import counted_weight_versions, turn_count
from rescue.outcomes import status_value

#: Metadata key carrying a sample's loss weight (1/a for a protected stale group).
WEIGHT_KEY = "rescue_weight"
#: Metadata key: the group's staleness at the gate (``None`` when unknown).
STALENESS_KEY = "rescue_staleness"
#: Metadata key: whether the drop arm would drop the group (it is stale).
WOULD_DROP_KEY = "rescue_would_drop"
#: Metadata key: the group's protect coin ``u(seed, group id)`` in [0, 1).
COIN_KEY = "rescue_coin"

_MISSING = object()


def field(sample: Any, name: str, default: Any = None) -> Any:
    """A field of a ``Sample`` or of a Sample dict (``default`` when absent)."""
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def _sample_status(sample: Any) -> str | None:
    return status_value(field(sample, "status"))


def trajectory_samples(trajectory: Any) -> list[Any]:
    """The samples of one trajectory: a list of samples as is, a single sample as ``[it]``."""
    return trajectory if isinstance(trajectory, list) else [trajectory]


def iter_samples(group: Iterable[Any]) -> Iterator[Any]:
    """Every sample of a group, flattening list-of-samples trajectories."""
    for item in group:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def first_sample(group: Sequence[Any]) -> Any:
    """The first sample of a group (of its first trajectory)."""
    head = group[0]
    return head[0] if isinstance(head, list) else head


def group_id(group: Sequence[Any]) -> int | str:
    """The group's stable id (rules in the module docstring); the gate's coin key."""
    if not group:
        raise InputError("group is empty: a group needs at least one sample")
    s = first_sample(group)
    gid = field(s, "group_index")
    if gid is not None:
        return gid
    index = field(s, "index")
    if index is not None:
        return f"index:{index}"
    prompt = str(field(s, "prompt", ""))
    return "prompt:" + hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


def oldest_weight_version(sample: Any) -> int | None:
    """Minimum numeric weight version over the sample's counted model calls (those that
    produced trained tokens; ``rescue.model_calls``)."""
    best = None
    for v in counted_weight_versions(sample):
        text = v if v.__class__ is str else str(v)
        if text.isdigit() and (best is None or int(text) < best):
            best = int(text)
    return best


def group_oldest_weight_version(group: Iterable[Any]) -> int | None:
    """Minimum weight version across all trajectories and turns of a group."""
    best = None
    for item in group:
        for s in item if isinstance(item, list) else (item,):
            v = oldest_weight_version(s)
            if v is not None and (best is None or v < best):
                best = v
    return best


def group_newest_weight_version(group: Iterable[Any]) -> int | None:
    """Maximum numeric weight version across all trajectories and turns of a group."""
    versions = [
        int(v)
        for s in iter_samples(group)
        for v in field(s, "weight_versions") or ()
        if str(v).isdigit()
    ]
    return max(versions, default=None)


def group_staleness(group: Iterable[Any], current_version: int | None) -> int | None:
    """``current_version - oldest weight version``; ``None`` when either is unknown."""
    if current_version is None:
        return None
    oldest = group_oldest_weight_version(group)
    return None if oldest is None else int(current_version) - oldest


def reward_value(sample: Any, reward_key: str | None = None) -> float | None:
    """The scalar reward, honouring ``--reward-key`` for dict rewards (``None`` if unset).

    A dict reward without a ``reward_key``, or without that key (Miles' own
    ``get_reward_value`` fails there too), is a ``ValueError`` naming ``--reward-key``: a
    misconfigured key must not turn every rollout into a reward-less no-result.
    """
    reward = field(sample, "reward")
    if isinstance(reward, Mapping):
        if not reward_key:
            raise InputError(
                f"reward is a dict with keys {sorted(reward)} but --reward-key is not set; "
                "set --reward-key to the field that holds the scalar reward"
            )
        if reward_key not in reward:
            raise InputError(
                f"reward has no key {reward_key!r} (--reward-key); its keys: {sorted(reward)}"
            )
        reward = reward[reward_key]
    return None if reward is None else float(reward)


def rollout_record(trajectory: Any, *, reward_key: str | None = None) -> RolloutRecord:
    """The census record of one trajectory (a sample, a Sample dict or a list of them)."""
    samples = trajectory_samples(trajectory)
    if not samples:
        raise InputError("trajectory is empty: a trajectory needs at least one sample")
    if len(samples) == 1 and not field(samples[0], "metadata"):
        s = samples[0]
        return _plain_record(
            _sample_status(s),
            reward_value(s, reward_key),
            bool(field(s, "remove_sample", False)),
            len(field(s, "weight_versions") or ()) or None,
        )
    statuses = [_sample_status(s) for s in samples]
    status = "aborted" if "aborted" in statuses else statuses[-1]
    reward = None
    for s in reversed(samples):
        if (reward := reward_value(s, reward_key)) is not None:
            break
    metadata: dict[str, Any] = {}
    for s in samples:
        metadata.update(field(s, "metadata") or {})
    turns = None
    if "turns" not in metadata and "turns" not in (metadata.get("agent_metrics") or {}):
        turns = sum(turn_count(s) for s in samples) or None
    return RolloutRecord.from_sample_fields(
        status=status,
        reward=reward,
        metadata=metadata,
        remove_sample=all(bool(field(s, "remove_sample", False)) for s in samples),
        turns=turns,
    )


@functools.lru_cache(maxsize=4096)
def _plain_record(
    status: str | None, reward: float | None, masked: bool, turns: int | None
) -> RolloutRecord:
    """The record of a single sample without metadata: a pure function of these fields.

    Memoized (records are frozen), the least recently used of 4096 keys evicted: a math-RL
    batch has a handful of distinct keys, and the buffer settles every sample every step.
    """
    return RolloutRecord.from_sample_fields(
        status=status, reward=reward, metadata={}, remove_sample=masked, turns=turns
    )


def group_records(group: Iterable[Any], *, reward_key: str | None = None) -> list[RolloutRecord]:
    """One record per trajectory of a group."""
    return [rollout_record(t, reward_key=reward_key) for t in group]


def rollout_key(sample: Any) -> Any:
    """The rollout a sample belongs to, as Miles keys it: ``rollout_id``, else ``index``.

    ``None`` when the sample has neither; callers say what stands in then.
    """
    rid = field(sample, "rollout_id")
    return rid if rid is not None else field(sample, "index")


def trajectories_of(samples: Iterable[Any]) -> list[list[Any]]:
    """Split a flat sample list (what Miles logs and trains) into trajectories.

    Consecutive samples with the same ``(group_index, rollout_id)`` form one trajectory
    (``rollout_id`` falls back to ``index``, as in Miles); each other sample is its own.
    """
    out: list[list[Any]] = []
    last: Any = _MISSING
    for s in samples:
        key = (field(s, "group_index"), rollout_key(s))
        if out and key == last and key[1] is not None:
            out[-1].append(s)
        else:
            out.append([s])
        last = key
    return out


def weight_of(sample: Any) -> float:
    """A sample's loss weight: ``metadata["rescue_weight"]``, 1 when absent."""
    metadata = field(sample, "metadata") or {}
    return float(metadata.get(WEIGHT_KEY, 1.0))


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
