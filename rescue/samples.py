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

**One reading.** A sample is read once, into its ``SampleView`` (``view``, ``views``):
its fields, and on first use what rescue derives from them (its model calls and counted
weight versions, its turns, its oldest weight version, its turn spans, recorded or read
from the loss mask). The reward hook reads its batch into views and hands the views to the
R = 0 rule, the normalizer and the turn estimator; a census record is built from views
(``rollout_record``), through ``rescue.outcomes.classify``. A view has the sample's field
names, so every function here takes a view where it takes a sample.

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
- gating and recording: ``rescue.gating`` writes the gate's inputs and a kept group's loss
  weight on its samples.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rescue.census import RolloutRecord
from rescue.errors import InputError
from rescue.model_calls import CALLS_KEY, ModelCall, calls_of, counted_of, trained_mask, turns_of
from rescue.outcomes import status_value
from rescue.turns import TurnSpans, mask_turn_spans, recorded_turn_spans

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
    """A field of a ``Sample``, of a Sample dict or of a ``SampleView`` (``default`` when
    absent)."""
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


class SampleView:
    """One trainer sample read once: its fields, and what rescue derives from them.

    ``view(sample)`` reads every field rescue uses, once; the derived parts are computed on
    first use and kept: the model calls and the counted weight versions
    (``rescue.model_calls``), the turns, the oldest weight version, the turn spans
    (recorded, else read from the loss mask: ``rescue.turns``) and the loss weight. The
    view has the sample's field names, so every function of this module takes a view where
    it takes a sample. The metadata dict and the loss mask are the sample's own objects,
    not copies.
    """

    __slots__ = (
        "_derived",
        "group_index",
        "index",
        "loss_mask",
        "metadata",
        "prompt",
        "remove_sample",
        "response_length",
        "reward",
        "rollout_id",
        "status",
        "weight_versions",
    )  # fmt: skip

    def __init__(self, sample: Any) -> None:
        if isinstance(sample, dict):
            sample = _DictFields(sample)
        self.group_index = getattr(sample, "group_index", None)
        self.index = getattr(sample, "index", None)
        self.rollout_id = getattr(sample, "rollout_id", None)
        self.prompt = getattr(sample, "prompt", "")
        self.status = status_value(getattr(sample, "status", None))
        self.reward = getattr(sample, "reward", None)
        self.metadata = getattr(sample, "metadata", None)
        self.remove_sample = bool(getattr(sample, "remove_sample", False))
        versions = getattr(sample, "weight_versions", None)
        self.weight_versions = tuple(versions) if versions else ()
        self.response_length = int(getattr(sample, "response_length", 0) or 0)
        self.loss_mask = getattr(sample, "loss_mask", None)
        self._derived: dict[str, Any] | None = None

    def _once(self, name: str, compute: Any) -> Any:
        derived = self._derived
        if derived is None:
            derived = self._derived = {}
        if name not in derived:
            derived[name] = compute()
        return derived[name]

    def describe(self) -> str:
        """``group_index=.., index=.., rollout_id=..`` for error messages."""
        return f"group_index={self.group_index}, index={self.index}, rollout_id={self.rollout_id}"

    @property
    def calls(self) -> list[ModelCall] | None:
        """Its model calls (``rescue.model_calls.calls_of``; None without a consistent record)."""
        record = self.metadata.get(CALLS_KEY) if isinstance(self.metadata, dict) else None
        return self._once(
            "calls", lambda: calls_of(record, self.weight_versions, self.response_length)
        )

    @property
    def counted_weight_versions(self) -> list[Any]:
        """The versions of model calls that produced trained tokens (``rescue.model_calls``)."""
        return self._once(
            "counted",
            lambda: counted_of(
                self.calls,
                self.weight_versions,
                trained_mask(self.loss_mask, self.response_length),
            ),
        )

    @property
    def turn_count(self) -> int:
        """Model calls that produced tokens, a resumed call joined to the one it resumes."""
        return self._once("turns", lambda: turns_of(self.calls, len(self.weight_versions)))

    @property
    def oldest_weight_version(self) -> int | None:
        """Minimum numeric counted weight version (module docstring)."""

        def oldest() -> int | None:
            best = None
            for v in self.counted_weight_versions:
                text = v if v.__class__ is str else str(v)
                if text.isdigit() and (best is None or int(text) < best):
                    best = int(text)
            return best

        return self._once("oldest", oldest)

    @property
    def turn_spans(self) -> TurnSpans:
        """Its turns as response-token spans: the spans recorded in its metadata for its
        response length, else the runs of 1s of its loss mask (all of the response when it
        has none). ``InputError`` when neither can be read (the caller names the sample)."""

        def spans() -> TurnSpans:
            n = self.response_length
            recorded = recorded_turn_spans(self.metadata, n)
            if recorded is not None:  # recorded where the mask was built: no pass over it
                return recorded
            if self.loss_mask is None:
                one = np.zeros(1 if n else 0, dtype=np.int64)
                return TurnSpans(one, one + n, n)
            if len(self.loss_mask) != n:
                raise InputError(
                    f"loss_mask has {len(self.loss_mask)} entries, response_length is {n}"
                )
            try:
                return mask_turn_spans(self.loss_mask)
            except ValueError as e:
                raise InputError(str(e)) from None

        return self._once("spans", spans)


class _DictFields:
    """A Sample dict's keys as attributes (what ``SampleView`` reads a dict through)."""

    __slots__ = ("_d",)

    def __init__(self, d: dict) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None


def view(sample: Any) -> SampleView:
    """The view of a sample (a ``Sample``, a Sample dict, or already a view)."""
    return sample if sample.__class__ is SampleView else SampleView(sample)


def views(samples: Iterable[Any]) -> list[SampleView]:
    """One view per sample, in order: what an adapter reads a batch into once."""
    return [view(s) for s in samples]


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
    return view(sample).oldest_weight_version


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
    """The census record of one trajectory (a sample, a Sample dict, a view or a list of
    them), read through the samples' views."""
    read = [view(s) for s in trajectory_samples(trajectory)]
    if not read:
        raise InputError("trajectory is empty: a trajectory needs at least one sample")
    if len(read) == 1 and not read[0].metadata:
        s = read[0]
        return _plain_record(
            s.status, reward_value(s, reward_key), s.remove_sample, len(s.weight_versions) or None
        )
    statuses = [s.status for s in read]
    status = "aborted" if "aborted" in statuses else statuses[-1]
    reward = None
    for s in reversed(read):
        if (reward := reward_value(s, reward_key)) is not None:
            break
    metadata: dict[str, Any] = {}
    for s in read:
        metadata.update(s.metadata or {})
    turns = None
    if "turns" not in metadata and "turns" not in (metadata.get("agent_metrics") or {}):
        turns = sum(s.turn_count for s in read) or None
    return RolloutRecord.from_sample_fields(
        status=status,
        reward=reward,
        metadata=metadata,
        remove_sample=all(s.remove_sample for s in read),
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
