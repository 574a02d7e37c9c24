"""Debug rollout dumps (Miles and slime ``--save-debug-rollout-data``) as plain records.

Specification
-------------
A dump is one ``torch.save`` file per step holding a dict whose ``samples`` entry is a list
of ``Sample.to_dict()`` dicts (Miles adds ``rollout_id`` and ``metadata``; slime adds
``rollout_id``). Nothing from Miles or slime is imported: a dump is read as dicts.

From each sample dict the loader reads ``group_index``, ``status``, ``reward``,
``response_length``, ``loss_mask`` and ``metadata`` (and ``tokens`` when gradients need
them). A missing one is a ``ValueError`` naming the file, the sample and the field.

A *trajectory* (one rollout) is the set of samples sharing ``group_index`` and rollout key
(``rollout_id``, else ``index``, else the sample's position), as Miles' reward
normalization groups them: several samples per rollout are the siblings Miles' agentic
generate function emits. Siblings must share one reward. Per trajectory:

- status, reward (a dict reward needs ``reward_key``, Miles' ``--reward-key``), merged
  metadata, ``masked`` and the outcome: ``rescue.samples.rollout_record``, the one
  converter from Miles samples to census records (it classifies through
  ``rescue.outcomes.classify``);
- ``turns``: the number of runs of 1s in the loss masks (a merged multi-turn sample is
  ``turn_1 + [0]*obs + turn_2 ...``); a sample without a loss mask is one run over its
  whole response. This replaces the record's metadata-based turn count, so that the
  turn count and the token turn indices agree;
- each response token's turn index: 1-based, counted across siblings in dump order,
  0 for observation tokens (loss mask 0).

A group is ``(step, group_index)``: the rollouts of one prompt draw in one step.
"""

from __future__ import annotations

import glob
import math
import os
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from rescue.census import RolloutRecord
from rescue.errors import InputError
from rescue.samples import rollout_record

#: Fields every sample dict must carry (``tokens`` is added when gradients are computed).
REQUIRED_FIELDS: tuple[str, ...] = (
    "group_index",
    "status",
    "reward",
    "response_length",
    "loss_mask",
    "metadata",
)


@dataclass
class Trajectory:
    """One rollout of a dump: its group, its samples and what the census needs of it."""

    step: int
    group: tuple[int, Any]  # (step, group_index)
    key: Any  # rollout_id, else index, else ("row", position)
    samples: tuple[int, ...]  # positions in the dump's ``samples`` list, dump order
    record: RolloutRecord
    token_turns: list[np.ndarray]  # per sample: turn index of each response token (0 = obs)

    @property
    def reward(self) -> float | None:
        return self.record.reward

    @property
    def turns(self) -> int:
        return int(self.record.turns or 0)

    @property
    def capped(self) -> bool:
        return self.record.capped


@dataclass
class Dump:
    """One step's dump: the file, its step id, the raw sample dicts and the trajectories."""

    path: str
    step: int
    samples: list[Mapping[str, Any]]
    trajectories: list[Trajectory] = field(default_factory=list)


def expand_paths(patterns: Iterable[str]) -> list[str]:
    """Files matching each path or glob, in the order given (each glob sorted by name).

    A pattern that matches nothing is a ``ValueError`` naming it.
    """
    out: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            found = sorted(glob.glob(pattern), key=_natural)
            if not found:
                raise InputError(f"dump glob {pattern!r} matches no file")
            out.extend(found)
        elif os.path.isfile(pattern):
            out.append(pattern)
        else:
            raise InputError(f"dump {pattern!r} is not a file")
    return out


def _natural(path: str) -> list:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def read_payload(path: str, *, unsafe_load: bool = False) -> Any:
    """``torch.load`` a dump without letting it run code.

    A sample dict holds plain types, lists, tensors and, in Miles, possibly numpy arrays
    (``rollout_routed_experts``) and two small dataclasses (``adapter``, ``reward_spec``).
    The unpickler resolves only allow-listed globals: the ones torch's ``weights_only``
    loader allows, numpy's array constructors (data only), and, for a Miles/slime class,
    an inert stand-in that only holds its attributes (neither framework is imported). Any
    other global refuses to load unless ``unsafe_load`` (``weights_only=False``, arbitrary
    code: only for dumps you trust).

    The allow-list is enforced by a subclass of the C unpickler (``pickle.Unpickler`` with
    ``find_class`` restricted, the recipe of the ``pickle`` docs), which reads a dump about
    ten times faster than torch's pure-Python ``weights_only`` unpickler; where torch does
    not expose its allow-list, the ``weights_only`` loader is used instead.
    """
    import torch

    if unsafe_load:
        return torch.load(path, map_location="cpu", weights_only=False)
    restricted = _restricted_pickle_module(path)
    if restricted is not None:
        try:
            return torch.load(
                path, map_location="cpu", weights_only=False, pickle_module=restricted
            )
        except _Refused as e:
            raise InputError(
                f"{path}: refusing to unpickle {e.args[0]}; pass --unsafe-load "
                "(weights_only=False) only for a dump you trust"
            ) from None
        except Exception as e:  # whatever a file that is no pickle makes the unpickler raise
            raise InputError(f"{path}: not a torch.save file ({type(e).__name__}: {e})") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as first:  # pickle.UnpicklingError; the message names the global
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:
            raise InputError(f"{path}: not a torch.save file ({first})") from None
        allowed = [_allowed_global(name) for name in names]
        refused = [n for n, obj in zip(names, allowed, strict=True) if obj is None]
        if refused:
            raise InputError(
                f"{path}: refusing to unpickle {', '.join(refused)} with weights_only=True; "
                "pass --unsafe-load (weights_only=False) only for a dump you trust"
            ) from None
        with torch.serialization.safe_globals([*allowed, *_numpy_dtype_classes()]):
            return torch.load(path, map_location="cpu", weights_only=True)


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list (its qualified name is the first argument)."""


def _restricted_pickle_module(path: str) -> Any:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves allow-listed globals only."""
    try:
        from torch import _weights_only_unpickler
    except ImportError:
        return None
    allowed_fn = getattr(_weights_only_unpickler, "_get_allowed_globals", None)
    if allowed_fn is None:
        return None
    allowed = dict(allowed_fn())
    for cls in _numpy_dtype_classes():
        allowed[f"{cls.__module__}.{cls.__qualname__}"] = cls

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            qualname = f"{module}.{name}"
            obj = allowed.get(qualname)
            if obj is None:
                obj = _allowed_global(qualname)
            if obj is None:
                raise _Refused(qualname)
            return obj

    def load(file: Any, **kwargs: Any) -> Any:  # torch's loader of a file not in zip format
        return Unpickler(file, **kwargs).load()

    return SimpleNamespace(__name__="rescue_restricted_pickle", Unpickler=Unpickler, load=load)


def _numpy_dtype_classes() -> list:
    dtypes = getattr(np, "dtypes", None)
    if dtypes is None:
        return []
    return [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]


def _allowed_global(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    if module.split(".")[0] in ("numpy",) and name in ("_reconstruct", "ndarray", "dtype"):
        import importlib

        return getattr(importlib.import_module(module), name)
    if module.split(".")[0] in ("miles", "slime"):
        return type(name, (), {"__module__": module, "__qualname__": name})
    return None


def load_dumps(
    patterns: Iterable[str],
    *,
    reward_key: str | None = None,
    need_tokens: bool = False,
    unsafe_load: bool = False,
) -> list[Dump]:
    """Read every dump matching ``patterns`` (paths or globs), one ``Dump`` per file.

    Args:
        patterns: dump paths or globs.
        reward_key: key of a dict reward (Miles ``--reward-key``; default None = scalar).
        need_tokens: also require ``tokens`` (gradients; default False).
        unsafe_load: ``torch.load(weights_only=False)`` (default False; see ``read_payload``).
    """
    dumps = []
    seen: dict[int, str] = {}
    for ordinal, path in enumerate(expand_paths(patterns)):
        payload = read_payload(path, unsafe_load=unsafe_load)
        dump = parse_payload(
            payload,
            source=path,
            ordinal=ordinal,
            reward_key=reward_key,
            need_tokens=need_tokens,
        )
        # A step identifies a dump's groups and samples: two files of one step (two runs'
        # dumps, or a file copied) would have their groups merged.
        if dump.step in seen:
            raise InputError(
                f"{path}: rollout {dump.step} is also in {seen[dump.step]}; pass the dumps of "
                "one run (each rollout once)"
            )
        seen[dump.step] = path
        dumps.append(dump)
    return dumps


def parse_payload(
    payload: Any,
    *,
    source: str = "<dump>",
    ordinal: int = 0,
    reward_key: str | None = None,
    need_tokens: bool = False,
) -> Dump:
    """A ``Dump`` from an already loaded payload (``{"rollout_id", "samples": [...]}``).

    ``step`` is the payload's ``rollout_id`` when it is an int, else ``ordinal``.
    """
    if not isinstance(payload, Mapping) or "samples" not in payload:
        raise InputError(f"{source}: not a debug rollout dump (no 'samples' list)")
    samples = payload["samples"]
    if not isinstance(samples, Sequence):
        raise InputError(f"{source}: 'samples' is a {type(samples).__name__}, expected a list")
    rid = payload.get("rollout_id")
    step = int(rid) if isinstance(rid, (int, np.integer)) else ordinal
    required = (*REQUIRED_FIELDS, "tokens") if need_tokens else REQUIRED_FIELDS

    # Trajectories: samples sharing (group_index, rollout key), in order of first appearance.
    members: dict[tuple[Any, Any], list[int]] = {}
    for pos, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise InputError(f"{source}: samples[{pos}] is a {type(s).__name__}, not a dict")
        for name in required:
            if name not in s:
                raise InputError(
                    f"{source}: samples[{pos}] (index={s.get('index')}) has no field {name!r}"
                )
        if s["group_index"] is None:
            raise InputError(
                f"{source}: samples[{pos}] (index={s.get('index')}) has group_index=None; "
                "replay needs each sample's group"
            )
        key = _first_not_none(s.get("rollout_id"), s.get("index"), ("row", pos))
        members.setdefault((s["group_index"], key), []).append(pos)

    dump = Dump(path=source, step=step, samples=list(samples))
    for (group_index, key), positions in members.items():
        dump.trajectories.append(_trajectory(dump, group_index, key, positions, reward_key))
    return dump


def _first_not_none(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _where(dump: Dump, pos: int) -> str:
    return f"{dump.path}: samples[{pos}] (index={dump.samples[pos].get('index')})"


def reward_value(raw: Any, reward_key: str | None, where: str = "sample") -> float | None:
    """The scalar reward of a sample's ``reward`` field (Miles' ``get_reward_value``).

    None stays None; a dict needs ``reward_key``; a scalar with a ``reward_key`` is an error.
    """
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        if reward_key is None:
            raise InputError(
                f"{where}: reward is a dict with keys {sorted(map(str, raw))}; "
                "pass --reward-key to choose one"
            )
        if reward_key not in raw:
            raise InputError(
                f"{where}: reward has no key {reward_key!r} (--reward-key); keys: {sorted(map(str, raw))}"
            )
        return reward_value(raw[reward_key], None, where)
    if reward_key is not None:
        raise InputError(
            f"{where}: reward is a scalar ({raw!r}) but --reward-key={reward_key!r} was given"
        )
    try:
        return float(raw.item() if hasattr(raw, "item") else raw)
    except (TypeError, ValueError):
        raise InputError(f"{where}: reward {raw!r} is not a number or a dict") from None


def token_turn_index(loss_mask: Any, response_length: int, first_turn: int = 1) -> np.ndarray:
    """Turn index of each response token: runs of 1s numbered from ``first_turn``, 0 elsewhere.

    ``loss_mask=None`` means every response token is trained (one run).
    """
    if loss_mask is None:
        m = np.ones(int(response_length), dtype=bool)
    else:
        m = np.asarray(loss_mask).reshape(-1) != 0
    starts = m & ~np.concatenate(([False], m[:-1]))
    turn = np.cumsum(starts, dtype=np.int32) + np.int32(first_turn - 1)
    return np.where(m, turn, 0).astype(np.int32)


def _trajectory(
    dump: Dump, group_index: Any, key: Any, positions: list[int], reward_key: str | None
) -> Trajectory:
    samples = [dump.samples[p] for p in positions]
    rewards = [
        reward_value(s["reward"], reward_key, _where(dump, p))
        for p, s in zip(positions, samples, strict=True)
    ]
    if any(not _same(r, rewards[0]) for r in rewards[1:]):
        raise InputError(
            f"{dump.path}: rollout {key!r} of group {group_index!r} has samples "
            f"{positions} with different rewards {rewards}; siblings must share one reward"
        )
    token_turns, turns = [], 0
    for p, s in zip(positions, samples, strict=True):
        md = s["metadata"]
        if md is not None and not isinstance(md, Mapping):
            raise InputError(
                f"{_where(dump, p)}: field 'metadata' is a {type(md).__name__}, expected a dict"
            )
        n = s["response_length"]
        if s["loss_mask"] is not None and len(s["loss_mask"]) != n:
            raise InputError(
                f"{_where(dump, p)}: field 'loss_mask' has {len(s['loss_mask'])} entries, "
                f"response_length is {n}"
            )
        t = token_turn_index(s["loss_mask"], n, first_turn=turns + 1)
        token_turns.append(t)
        turns = max(turns, int(t.max(initial=0)))

    # The one Miles-sample converter decides status, reward, metadata, masked and outcome;
    # replay's turn count is the loss-mask runs, which the token turn indices number.
    record = replace(rollout_record(samples, reward_key=reward_key), turns=turns)
    return Trajectory(
        step=dump.step,
        group=(dump.step, group_index),
        key=key,
        samples=tuple(positions),
        record=record,
        token_turns=token_turns,
    )


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))
