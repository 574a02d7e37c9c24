"""CPU stand-ins for the CUDA calls Miles' Megatron backend makes, in a process without CUDA.

``install()`` is the one ``patch`` row of ``rescue.rehearsal.miles.changes`` that reaches into
torch itself: applied when ``megatron.core`` is first imported (so only in the trainer's
processes), and only when ``torch.cuda.is_available()`` is false. Each stand-in keeps the
call's meaning on a CPU:

- ``torch.cuda.current_device()`` is ``"cpu"`` and ``set_device`` a no-op: tensors Megatron
  places on "the current device" land on the CPU;
- the CUDA generator Megatron's RNG tracker saves, seeds and restores
  (``get_rng_state``, ``set_rng_state``, ``manual_seed``, ``default_generators``) is one CPU
  ``torch.Generator`` of its own: the tracker forks and restores it as it would the GPU's;
- factory functions (``tensor``, ``zeros``, ``ones``, ``empty``, ``full``, ``arange``,
  ``*_like``), ``Tensor.cuda``/``Module.cuda`` and ``Tensor.to``/``Module.to`` map a cuda
  device to the CPU, and the factory functions' ``pin_memory=True`` (page-locked host
  memory, which only CUDA allocates: Miles' weight backup of the actor beside a reference
  model asks for it) to ordinary host memory;
- ``Tensor.type()`` (no argument) names the cuda type of a CPU tensor
  (``torch.cuda.FloatTensor``), which Megatron's optimizers check parameters against;
- ``synchronize``, ``empty_cache``, streams and events are no-ops; the allocator's
  counters read 0 and ``mem_get_info`` the host's free and total memory.

Nothing here changes a computation: every op runs on the CPU as it would on the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

_INSTALLED = False


def _cpu(device: Any) -> Any:
    """``device`` with a cuda device replaced by the CPU."""
    import torch

    if isinstance(device, torch.device):
        return torch.device("cpu") if device.type == "cuda" else device
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    return device


def _with_cpu_device(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if kwargs.get("pin_memory"):  # page-locked host memory is CUDA's to allocate
            kwargs["pin_memory"] = False
        return fn(*args, **kwargs)

    return wrapped


class _NullStream:
    """A CUDA stream or event that has nothing to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = "cpu"

    def wait_stream(self, *args: Any) -> None: ...
    def wait_event(self, *args: Any) -> None: ...
    def record_event(self, *args: Any) -> _NullStream:
        return _NullStream()

    def record(self, *args: Any) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0

    def __enter__(self) -> _NullStream:
        return self

    def __exit__(self, *exc: Any) -> None: ...


def _host_memory(*args: Any, **kwargs: Any) -> tuple[int, int]:
    """(free, total) bytes of host memory, where a GPU's would be."""
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def install() -> None:
    """Install the stand-ins (idempotent; nothing when CUDA is available)."""
    global _INSTALLED
    import torch

    if _INSTALLED or torch.cuda.is_available():
        return
    _INSTALLED = True
    cuda = torch.cuda
    generator = torch.Generator()

    cuda.current_device = lambda: "cpu"
    cuda.set_device = lambda *a, **k: None
    cuda.device_count = lambda: 1
    cuda.get_rng_state = lambda device="cuda": generator.get_state()
    cuda.set_rng_state = lambda state, device="cuda": generator.set_state(state)
    cuda.manual_seed = lambda seed: generator.manual_seed(int(seed))
    cuda.manual_seed_all = lambda seed: generator.manual_seed(int(seed))
    cuda.default_generators = (generator,)
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda: None
    cuda.Stream = _NullStream
    cuda.Event = _NullStream
    cuda.current_stream = lambda *a, **k: _NullStream()
    cuda.default_stream = lambda *a, **k: _NullStream()
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    for name in (
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
    ):
        setattr(cuda, name, lambda *a, **k: 0)
    cuda.reset_peak_memory_stats = lambda *a, **k: None
    cuda.mem_get_info = _host_memory

    for name in ("tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint",
                 "zeros_like", "ones_like", "empty_like", "full_like", "as_tensor", "linspace"):  # fmt: skip
        setattr(torch, name, _with_cpu_device(getattr(torch, name)))

    tensor_to = torch.Tensor.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    module_to = torch.nn.Module.to

    def module_to_cpu(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return module_to(self, *args, **kwargs)

    torch.nn.Module.to = module_to_cpu

    tensor_type = torch.Tensor.type

    def type_(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = tensor_type(self, *args, **kwargs)
        if not args and not kwargs and name.startswith("torch.") and self.device.type == "cpu":
            return "torch.cuda." + name[len("torch.") :]
        return name

    torch.Tensor.type = type_
    torch.nn.Module.cuda = lambda self, *a, **k: self


def patch(module: types.ModuleType) -> None:
    """The row's ``apply``: install on the first import of ``megatron.core``."""
    install()


def patch_rng(module: types.ModuleType) -> None:
    """``megatron.core.tensor_parallel.random``: its own get/set of the CUDA generator's state
    (which queue the set through ``torch.cuda._lazy_call``, never run without CUDA) read and
    write the stand-in generator."""
    import torch

    install()
    if torch.cuda.is_available():
        return
    generator = torch.cuda.default_generators[0]
    module._get_cuda_rng_state = lambda *a, **k: generator.get_state()
    module._set_cuda_rng_state = lambda new_state, *a, **k: generator.set_state(new_state)
