"""The transport of the recorded heads from the rollout side to the loss, in every process.

Why a store: Miles keeps only whitelisted ``Sample`` fields between the rollout and the
loss (``train_data_conversion.py`` ``_package_shards``, ``model.py`` ``get_batch``), none
of them can hold a ``[R, K]`` array (``opd_reverse_kl`` must have ``R`` entries and carries
rescue's per-token advantages), and ``metadata`` is dropped at packaging. So the heads
travel beside the batch, keyed by what the loss does see: the sample's tokens.

Specification
-------------
Rollout side, once per step (``publish``, called by ``rescue.miles.log.log_rollout``, the
``--custom-rollout-log-function-path`` every arm has, on the flat list of samples Miles
is about to convert, after the sample filter; on a ``--load-debug-rollout-data`` replay
too, from the heads the dump kept): every sample that trains a position (loss mask 1, not
``remove_sample``) must have its heads (``rescue.miles.topk.KEY``) recorded for exactly
those tokens (same ``digest``) and covering every such position, else ``InputError``
naming the sample. Each sample's entry (``positions``, ``ids``, ``logprobs`` and its
``rollout_log_probs``) is put under ``(rollout_id, token digest)``.

Train side (``Trainer``, one per process): ``begin(rollout_id)`` (the before-train-step
hook, every optimizer step) names the rollout being trained, and the first step of a new
rollout releases the older ones; ``rows(tokens,
sampled, total_length, response_length)`` returns one sample's heads aligned to its
response, ``ids`` ``[R, K]`` (``-1`` where there is none), ``logprobs`` ``[R, K]`` and
``has`` ``[R]``. Samples with the same tokens are told apart by their recorded sampled
log-probs (CP-local, compared on the positions this rank holds); none matching is an
``InputError``.

Backends: with Ray initialized (every Miles process: the rollout manager and each train
actor), one named actor ``rescue_topk_store`` (``ACTOR``, created on first use, no GPU, no
CPU reserved) holds per rollout a map from digest to Ray object references; each entry is
``ray.put`` by the rollout manager and fetched by the train ranks that hold the sample, on
any node, through Ray's object store. Without Ray (a test, a single process) an
in-process registry holds the entries themselves. Either way a missing entry is an error,
never a silent default.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rescue.errors import InputError
from rescue.miles.topk import KEY, token_digest

logger = logging.getLogger(__name__)

#: Name of the Ray actor that holds the published entries.
ACTOR = "rescue_topk_store"


class Registry:
    """Per rollout, ``{digest: [entry or object ref, ...]}`` (also the Ray actor's class)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, list[Any]]] = {}
        self.lock = threading.Lock()

    def publish(self, rollout_id: int, entries: dict[str, list[Any]]) -> int:
        with self.lock:
            step = self.steps.setdefault(int(rollout_id), {})
            for digest, values in entries.items():
                step.setdefault(digest, []).extend(values)
        return sum(len(v) for v in entries.values())

    def lookup(self, rollout_id: int) -> dict[str, list[Any]] | None:
        with self.lock:
            step = self.steps.get(int(rollout_id))
            return None if step is None else {d: list(v) for d, v in step.items()}

    def release(self, before: int) -> None:
        with self.lock:
            for r in [r for r in self.steps if r < before]:
                del self.steps[r]


_LOCAL = Registry()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        return None
    return ray if ray.is_initialized() else None


_HANDLE: list[Any] = []


def _actor(ray: Any, *, create: bool) -> Any:
    """The store actor (created by the publisher, the rollout manager, which lives for the
    whole job); ``None`` when it does not exist and ``create`` is false."""
    if not _HANDLE:
        if create:
            options = dict(name=ACTOR, get_if_exists=True, num_cpus=0, max_concurrency=16)
            _HANDLE.append(ray.remote(Registry).options(**options).remote())
        else:
            try:
                _HANDLE.append(ray.get_actor(ACTOR))
            except ValueError:
                return None
    return _HANDLE[0]


def trained_positions(sample: Any) -> np.ndarray:
    """Response positions the sample trains (loss mask 1, none when ``remove_sample``)."""
    n = int(sample.response_length or 0)
    if getattr(sample, "remove_sample", False):
        return np.zeros(0, dtype=np.int64)
    mask = sample.loss_mask
    if mask is None:
        return np.arange(n, dtype=np.int64)
    return np.flatnonzero(np.asarray(mask) != 0)


def _describe(sample: Any) -> str:
    return (
        f"sample group_index={getattr(sample, 'group_index', None)} "
        f"index={getattr(sample, 'index', None)}"
    )


def entry_of(sample: Any) -> dict[str, Any] | None:
    """The entry ``publish`` stores for one sample (``None`` when it trains nothing)."""
    need = trained_positions(sample)
    if need.size == 0:
        return None
    heads = (sample.metadata or {}).get(KEY)
    if heads is None:
        raise InputError(
            f"{_describe(sample)} trains {need.size} positions but has no recorded heads "
            f"(metadata[{KEY!r}]): score centering needs --custom-generate-function-path "
            "rescue.miles.topk.generate or rescue.miles.topk.agentic_generate"
        )
    digest = token_digest(sample.tokens)
    if heads["digest"] != digest:
        raise InputError(
            f"{_describe(sample)}: its recorded heads belong to other tokens (the sample "
            "changed after generation)"
        )
    missing = np.setdiff1d(need, heads["positions"])
    if missing.size:
        raise InputError(
            f"{_describe(sample)}: {missing.size} trained positions have no recorded head "
            f"(first at response position {int(missing[0])})"
        )
    sampled = sample.rollout_log_probs
    if sampled is None or len(sampled) != sample.response_length:
        raise InputError(f"{_describe(sample)}: rollout_log_probs missing or of the wrong length")
    return {
        "digest": digest,
        "positions": np.asarray(heads["positions"], dtype=np.int32),
        "ids": np.asarray(heads["ids"], dtype=np.int32),
        "logprobs": np.asarray(heads["logprobs"], dtype=np.float32),
        "sampled": np.asarray(sampled, dtype=np.float32),
    }


def publish(rollout_id: int, samples: Sequence[Any]) -> tuple[int, int]:
    """Put every trained sample's heads under ``rollout_id`` (module docstring); returns
    how many entries, and how many positions with a head, were published."""
    entries: dict[str, list[Any]] = {}
    positions = 0
    ray = _ray()
    for sample in samples:
        entry = entry_of(sample)
        if entry is None:
            continue
        positions += int(entry["positions"].size)
        entries.setdefault(entry["digest"], []).append(ray.put(entry) if ray else entry)
    if ray is None:
        return _LOCAL.publish(rollout_id, entries), positions
    return ray.get(_actor(ray, create=True).publish.remote(rollout_id, entries)), positions


class Trainer:
    """The train side of one process (module docstring)."""

    def __init__(self) -> None:
        self.rollout_id: int | None = None
        self._entries: dict[str, list[Any]] | None = None

    def begin(self, rollout_id: int) -> None:
        """The rollout the next loss calls train (its entries are looked up again at the next
        loss call); a new rollout releases the rollouts before it."""
        self._entries = None
        if rollout_id == self.rollout_id:
            return
        self.rollout_id = int(rollout_id)
        ray = _ray()
        if ray is None:
            _LOCAL.release(self.rollout_id)
        elif (actor := _actor(ray, create=False)) is not None:
            actor.release.remote(self.rollout_id)

    def _step_entries(self) -> dict[str, list[Any]]:
        if self.rollout_id is None:
            raise InputError(
                "score centering: the loss ran before the before-train-step hook named the "
                "rollout (--custom-megatron-before-train-step-hook-path "
                "rescue.miles.train_step.before_train_step runs only in the Megatron backend)"
            )
        if self._entries is None:
            ray = _ray()
            if ray is None:
                found = _LOCAL.lookup(self.rollout_id)
            else:
                actor = _actor(ray, create=False)
                found = None if actor is None else ray.get(actor.lookup.remote(self.rollout_id))
            if found is None:
                raise InputError(
                    f"score centering: no heads were published for rollout {self.rollout_id} "
                    "(--custom-rollout-log-function-path rescue.miles.log.log_rollout publishes "
                    "them)"
                )
            self._entries = found
        return self._entries

    def rows(
        self, tokens: Any, sampled: Any, total_length: int, response_length: int
    ) -> dict[str, np.ndarray]:
        """One sample's heads over its whole response, ``ids``/``logprobs`` ``[R, K]`` and
        ``has`` ``[R]``; ``sampled`` is the sample's CP-local ``rollout_log_probs``."""
        from miles.backends.training_utils.cp_utils import slice_log_prob_with_cp

        digest = token_digest(tokens)
        found = self._step_entries().get(digest)
        if not found:
            raise InputError(
                f"score centering: rollout {self.rollout_id} has no recorded heads for a "
                f"sample of {int(total_length)} tokens ({response_length} response) in this "
                "micro-batch"
            )
        import torch

        ray = _ray()
        local = torch.as_tensor(sampled).detach().cpu().float()
        for ref in found:
            entry = ray.get(ref) if ray is not None and not isinstance(ref, dict) else ref
            recorded = torch.from_numpy(np.asarray(entry["sampled"], dtype=np.float32))
            mine = slice_log_prob_with_cp(recorded, int(total_length), int(response_length))
            if mine.shape == local.shape and torch.allclose(mine, local, atol=1e-5):
                return _full(entry, int(response_length))
        raise InputError(
            f"score centering: rollout {self.rollout_id} has heads for this sample's tokens "
            "but none recorded with its sampled log-probs"
        )


def _full(entry: dict[str, Any], response_length: int) -> dict[str, np.ndarray]:
    k = entry["ids"].shape[1]
    ids = np.full((response_length, k), -1, dtype=np.int64)
    logprobs = np.zeros((response_length, k), dtype=np.float32)
    has = np.zeros(response_length, dtype=bool)
    pos = entry["positions"].astype(np.int64)
    ids[pos], logprobs[pos], has[pos] = entry["ids"], entry["logprobs"], True
    return {"ids": ids, "logprobs": logprobs, "has": has}


#: The train side of this process.
TRAINER = Trainer()
