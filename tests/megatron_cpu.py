"""Test-only patches that let Miles' trainer code and megatron-core 0.16.1 run on a CPU.

Nothing here is a stand-in for a Miles or Megatron class: their real code runs. What the
patch changes are hard-coded CUDA device choices that are not kernel requirements
(``reference``: megatron-cpu.md), and every change is undone on exit:

- ``torch.cuda.current_device()`` returns ``"cpu"``;
- the factory functions ``tensor, zeros, ones, empty, full, arange, as_tensor`` map a
  ``device`` of ``"cuda"`` (or ``torch.device("cuda")``) to the CPU;
- ``Tensor.cuda()`` returns the tensor itself;
- ``Tensor.type()`` without an argument reports ``torch.cuda.<T>`` for a CPU tensor (the
  grad-clip and float16-optimizer type assertions).

``miles_parallel_state(cp_rank, cp_size, ...)`` sets Miles' ``ParallelState`` for one
process at any DP and CP coordinates (their groups ``None``: the CP slicing functions only
read ranks and sizes; TP is the one-process gloo world, which Megatron's vocab-parallel
cross entropy reduces over), restoring the previous state on exit.
``local_object_store()`` installs an in-process ``BaseObjectStore`` (put returns a ``Box``
of the value, get returns it) in place of Ray's, and restores the previous instance.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "as_tensor")


def _cpu_device(device):
    if device is None:
        return None
    if isinstance(device, torch.device):
        return torch.device("cpu") if device.type == "cuda" else device
    if isinstance(device, int):
        return torch.device("cpu")
    text = str(device)
    return "cpu" if text.startswith("cuda") else device


@contextlib.contextmanager
def cpu_patch() -> Iterator[None]:
    """Apply the CPU patch (module docstring) for the duration of the block."""
    saved = {name: getattr(torch, name) for name in _FACTORIES}
    saved_current = torch.cuda.current_device
    saved_cuda = torch.Tensor.cuda
    saved_type = torch.Tensor.type

    def factory(original):
        def call(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            return original(*args, **kwargs)

        return call

    def tensor_type(self, *args, **kwargs):
        if args or kwargs:
            return saved_type(self, *args, **kwargs)
        text = saved_type(self)
        return text.replace("torch.", "torch.cuda.", 1) if "cuda" not in text else text

    try:
        for name, original in saved.items():
            setattr(torch, name, factory(original))
        torch.cuda.current_device = lambda: "cpu"
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.Tensor.type = tensor_type
        yield
    finally:
        for name, original in saved.items():
            setattr(torch, name, original)
        torch.cuda.current_device = saved_current
        torch.Tensor.cuda = saved_cuda
        torch.Tensor.type = saved_type


@contextlib.contextmanager
def gloo_world() -> Iterator[None]:
    """A one-process gloo default group (created and destroyed here unless one exists)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def miles_parallel_state(
    *, cp_rank: int = 0, cp_size: int = 1, dp_rank: int = 0, dp_size: int = 1
) -> Iterator[object]:
    """Miles' ParallelState for one process at the given CP and DP coordinates."""
    import torch.distributed as dist
    from miles.backends.training_utils import parallel
    from miles.utils.ft_utils.process_group_utils import GroupInfo

    def info(rank, size):
        return GroupInfo(rank=rank, size=size, group=None)

    world = dist.group.WORLD if dist.is_initialized() else None
    state = parallel.ParallelState(
        intra_dp=info(dp_rank, dp_size),
        intra_dp_cp=info(dp_rank * cp_size + cp_rank, dp_size * cp_size),
        cp=info(cp_rank, cp_size),
        tp=GroupInfo(rank=0, size=1, group=world),
        pp=info(0, 1),
        ep=info(0, 1),
        etp=info(0, 1),
        indep_dp=info(0, 1),
    )
    saved = parallel._parallel_state
    parallel.set_parallel_state(state)
    try:
        yield state
    finally:
        parallel._parallel_state = saved


@contextlib.contextmanager
def local_object_store() -> Iterator[object]:
    """An in-process object store in place of Miles' Ray store (module docstring)."""
    from miles.utils import object_store
    from miles.utils.ray_utils import Box

    class LocalObjectStore(object_store.BaseObjectStore):
        def put(self, value, value_spec=None):
            return Box(value)

        def get(self, ref):
            return object_store.ObjectStoreGetResult(value=ref.inner, release_fn=lambda v: None)

        def remove(self, ref):
            pass

    saved = object_store._INSTANCE
    object_store._INSTANCE = LocalObjectStore()
    try:
        yield object_store._INSTANCE
    finally:
        object_store._INSTANCE = saved
