"""The gradient oracle's capture in Miles: the reduced gradient of each replayed arm.

Switched on by ``RESCUE_ORACLE_DIR`` (an oracle directory, ``rescue oracle build``) in a
Miles replay with rescue's before-train-step hook
(``--custom-megatron-before-train-step-hook-path rescue.miles.train_step.before_train_step``),
``--load-debug-rollout-data ORACLE_DIR/rollout_data/{rollout_id}.pt``,
``--debug-disable-optimizer`` (no optimizer: the weights stay at the checkpoint ``--load``)
and ``--global-batch-size`` equal to the rollouts of a dumped step (one optimizer step, one
gradient, per replayed arm). ``make oracle`` sets all of it.

Specification
-------------
Before each step the hook wraps the model config's ``finalize_model_grads_func`` (Miles sets
it anew for every rollout; the wrapper is replaced, not stacked). Megatron calls it once
after the last micro-batch's backward; the original all-reduces the gradients over data
(and context) parallel ranks, so afterwards every such rank holds the averaged gradient of
the whole batch in each parameter's ``main_grad``, and the wrapper reads it there. Only
the ranks of data- and context-parallel rank 0 capture; each parameter is counted once, as
Megatron's grad norm counts it (no shared duplicate, no tensor-parallel replica).

``RESCUE_ORACLE_STREAM`` = ``0`` (default): each tensor/pipeline rank writes its gradient
as ``{parameter name: float32 tensor}`` to ``ORACLE_DIR/gradients/{rollout_id}/tp<t>-pp<p>.pt``
(4 bytes per parameter per replayed arm). ``1``: nothing that size is written; the ranks
keep a float32 CPU copy of each earlier arm of the current step, take the new gradient's
squared norm and its inner products with them (float64, summed over the model-parallel
group), and tensor/pipeline rank 0 writes ``ORACLE_DIR/stats/{rollout_id}.json``. Memory:
up to (arms − 1) copies of the rank's gradient in host memory.

Refused, naming the flag: an optimizer (``--debug-disable-optimizer`` missing), a replay
path other than the manifest's, more than one step per replayed rollout, the distributed
optimizer, expert parallelism (its expert gradients live on other ranks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from rescue import flags
from rescue.errors import InputError
from rescue.oracle.manifest import Entry, Manifest, gradient_dir, stats_path

#: Environment variable naming the oracle directory; unset: no capture.
ENV_ORACLE_DIR = "RESCUE_ORACLE_DIR"
#: Environment variable: ``1`` streams inner products instead of writing gradients.
ENV_ORACLE_STREAM = "RESCUE_ORACLE_STREAM"
#: Attribute holding the original finalize function on the wrapper.
ATTRIBUTE = "_rescue_oracle_original"
#: Elements per block of the streamed products.
BLOCK = 1 << 24


#: ``RESCUE_ORACLE_DIR`` (default unset: no capture).
ORACLE_DIR = flags.text(ENV_ORACLE_DIR, None, shown="unset (off)")
oracle_dir_from_env = ORACLE_DIR.read
#: ``RESCUE_ORACLE_STREAM`` (default ``0``): ``0`` or ``1``.
ORACLE_STREAM = flags.switch(ENV_ORACLE_STREAM, False)
stream_from_env = ORACLE_STREAM.read


def counted_gradients(model: Any) -> list[tuple[str, Any]]:
    """``(name, reduced gradient)`` of every trainable parameter this rank counts."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import param_is_not_shared

    out = []
    for c, chunk in enumerate(model):
        for name, p in chunk.named_parameters():
            if not p.requires_grad:
                continue
            if not (
                param_is_not_shared(p) and tensor_parallel.param_is_not_tensor_parallel_duplicate(p)
            ):
                continue
            g = getattr(p, "main_grad", None)
            if g is None:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
            out.append((name if len(model) == 1 else f"{c}.{name}", g.detach()))
    return out


def _blocks(grads: list[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
    offset = 0
    for _, g in grads:
        flat = g.reshape(-1)
        for lo in range(0, flat.numel(), BLOCK):
            yield offset + lo, flat[lo : lo + BLOCK]
        offset += flat.numel()


class Capture:
    """What one replay process captures (module docstring)."""

    def __init__(self, directory: str, stream: bool) -> None:
        self.directory, self.stream = directory, stream
        self.manifest = Manifest.read(directory)
        self.kept: dict[int, Any] = {}  # earlier arms of the current step: flat CPU float32
        self.kept_step: int | None = None

    def record(self, entry: Entry, model: Any) -> None:
        """Capture the reduced gradient of ``entry`` (called right after finalize)."""
        from megatron.core import mpu

        if mpu.get_data_parallel_rank(with_context_parallel=True) != 0:
            return
        grads = counted_gradients(model)
        shard = (
            f"tp{mpu.get_tensor_model_parallel_rank()}-pp{mpu.get_pipeline_model_parallel_rank()}"
        )
        if self.stream:
            self._stream(entry, grads)
        else:
            import torch

            target = gradient_dir(self.directory, entry.rollout_id)
            os.makedirs(target, exist_ok=True)
            path = os.path.join(target, f"{shard}.pt")
            torch.save({k: g.float().cpu() for k, g in grads}, path + ".tmp")
            os.replace(path + ".tmp", path)

    def _stream(self, entry: Entry, grads: list[tuple[str, Any]]) -> None:
        import torch
        import torch.distributed as dist
        from megatron.core import mpu

        if entry.step != self.kept_step:
            self.kept, self.kept_step = {}, entry.step
        earlier = [e for e in self.manifest.of_step(entry.step) if e.rollout_id < entry.rollout_id]
        missing = [e.rollout_id for e in earlier if e.rollout_id not in self.kept]
        if missing:
            raise InputError(
                f"{ENV_ORACLE_STREAM}=1: replay rollout {entry.rollout_id} needs replay rollouts "
                f"{missing} of its step first; replay from --start-rollout-id 0 in order"
            )
        later = any(e.rollout_id > entry.rollout_id for e in self.manifest.of_step(entry.step))
        total = sum(g.numel() for _, g in grads)
        copy = torch.empty(total, dtype=torch.float32) if later else None
        device = grads[0][1].device if grads else torch.device("cpu")
        sums = torch.zeros(1 + len(earlier), dtype=torch.float64, device=device)
        for lo, block in _blocks(grads):
            b = block.double()
            sums[0] += (b * b).sum()
            for k, e in enumerate(earlier):
                kept = self.kept[e.rollout_id][lo : lo + block.numel()]
                sums[1 + k] += (b * kept.to(device=device, dtype=torch.float64)).sum()
            if copy is not None:
                copy[lo : lo + block.numel()].copy_(block)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums, group=mpu.get_model_parallel_group())
        values = sums.cpu().tolist()
        if copy is not None:
            self.kept[entry.rollout_id] = copy
        if mpu.get_model_parallel_group().rank() == 0:
            data = {
                "rollout_id": entry.rollout_id,
                "step": entry.step,
                "arm": entry.arm,
                "sq_norm": values[0],
                "dots": {str(e.rollout_id): v for e, v in zip(earlier, values[1:], strict=True)},
            }
            path = stats_path(self.directory, entry.rollout_id)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)


_CAPTURES: dict[tuple[str, bool], Capture] = {}


def _capture(directory: str, stream: bool) -> Capture:
    key = (os.path.abspath(directory), stream)
    if key not in _CAPTURES:
        _CAPTURES[key] = Capture(directory, stream)
    return _CAPTURES[key]


def check_replay_flags(
    args: Any, optimizer: Any, step_id: int, manifest: Manifest, directory: str
) -> None:
    """Refuse a replay that would not give one reduced gradient per arm at the checkpoint."""
    if optimizer is not None or not getattr(args, "debug_disable_optimizer", False):
        raise InputError(
            f"{ENV_ORACLE_DIR} is set but the run has an optimizer: the oracle replay needs "
            "--debug-disable-optimizer (the weights must stay at the checkpoint)"
        )
    expected = os.path.abspath(os.path.join(directory, manifest.rollout_data))
    given = getattr(args, "load_debug_rollout_data", None)
    if given is None or os.path.abspath(given) != expected:
        raise InputError(
            f"{ENV_ORACLE_DIR}={directory} replays --load-debug-rollout-data {expected} "
            f"(got {given!r})"
        )
    if step_id != 0:
        raise InputError(
            "the oracle replay takes one optimizer step per replayed arm: set "
            "--global-batch-size to the rollouts of a dumped step (rollout_batch_size x "
            "n_samples_per_prompt)"
        )


def install_capture(args: Any, rollout_id: int, step_id: int, model: Any, optimizer: Any) -> None:
    """Wrap this step's ``finalize_model_grads_func`` to capture the gradient (module docstring)."""
    from megatron.core import mpu
    from megatron.core.utils import get_model_config

    directory = oracle_dir_from_env()
    if directory is None:
        return
    capture = _capture(directory, stream_from_env())
    check_replay_flags(args, optimizer, step_id, capture.manifest, directory)
    ddp_config = getattr(model[0], "ddp_config", None)
    if ddp_config is not None and ddp_config.use_distributed_optimizer:
        raise InputError(
            "the oracle capture reads all-reduced gradients: the distributed optimizer "
            "reduce-scatters them (Miles turns it off under --debug-disable-optimizer)"
        )
    if mpu.get_expert_model_parallel_world_size() > 1:
        raise InputError("the oracle capture does not support --expert-model-parallel-size > 1")
    entry = capture.manifest.by_rollout_id(rollout_id)
    config = get_model_config(model[0])
    original = getattr(config.finalize_model_grads_func, ATTRIBUTE, None)
    if original is None:
        original = config.finalize_model_grads_func

    def finalize(*a: Any, **kw: Any) -> Any:
        out = original(*a, **kw)
        capture.record(entry, model)
        return out

    setattr(finalize, ATTRIBUTE, original)
    config.finalize_model_grads_func = finalize
