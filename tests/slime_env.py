"""slime's rollout modules on a CPU, for the integration tests (``SLIME_SRC``).

``slime.rollout.sglang_rollout`` imports ``sglang_router`` and ``transformers``'
``AutoProcessor``/``AutoTokenizer``/``PreTrainedTokenizerBase``/``ProcessorMixin`` at import
time; a CPU test never calls them. Where those packages are not installed,
``slime_rollout_modules`` registers import-only stand-ins, as slime's own
``tests/test_fully_async_rollout.py`` does; nothing in slime's tree is touched.

``StubTokenizer`` is the tokenizer ``GenerateState`` loads (``load_tokenizer``): slime's
``generate()`` only calls its ``encode`` on the prompt of a sample that has no tokens yet.

The trainer side (``slime_train_modules``, ``rollout_manager_class``, ``cpu_accelerator``,
``megatron_ranks``): slime's RolloutManager and Megatron actor modules with import-only
stand-ins for what they import and the data path never calls, slime's accelerator on the
CPU through slime's own ``set_accelerator``, and Megatron's data/context-parallel getters
answering as any rank, so slime's own conversion, DP split, tensor cast, CP slicing,
advantages and loss run here.
"""

from __future__ import annotations

import contextlib
import sys
import types

from miles_env import require_slime

_TRANSFORMERS = ("AutoProcessor", "AutoTokenizer", "PreTrainedTokenizerBase", "ProcessorMixin")


def slime_rollout_modules() -> None:
    """slime's checkout on ``sys.path`` with the stand-ins its rollout modules need."""
    require_slime()
    for name, attrs in (
        ("sglang_router", {"__version__": "0.2.3"}),
        ("transformers", {n: type(n, (), {}) for n in _TRANSFORMERS}),
    ):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            for k, v in attrs.items():
                setattr(module, k, v)
            sys.modules[name] = module


class StubTokenizer:
    """``encode`` of a fixed three-token prompt (slime's ``_prepare_prompt_ids``)."""

    PROMPT = (1, 2, 3)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.PROMPT)


# ── slime's trainer side on a CPU ─────────────────────────────────────────────────────

#: What ``slime.ray.rollout`` (the RolloutManager: conversion, DP split) and
#: ``slime.backends.megatron_utils.actor`` (the actor: ``_get_rollout_data``) import at module
#: level but the conversion, the split, the actor's data path, the advantages and the loss
#: never call: SGLang (the engines), Megatron-LM's ``megatron.training`` (checkpointing, the
#: training loop; megatron-core is installed and real) and ``torch_memory_saver``.
_IMPORT_ONLY = ("sglang", "megatron.training", "megatron.legacy", "torch_memory_saver")


class _ImportOnly(types.ModuleType):
    """A module whose every attribute raises when it is called or instantiated."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        name = f"{self.__name__}.{attr}"

        def called(*args, **kwargs):
            raise RuntimeError(f"the import-only stand-in {name} was called")

        if attr[:1].isupper():
            return type(
                attr, (), {"__init__": called, "__call__": called, "__module__": self.__name__}
            )
        called.__name__ = attr
        return called


class _ImportOnlyFinder:
    """Last on ``sys.meta_path``: only what no installed package provides."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        import importlib.machinery

        if any(name == p or name.startswith(p + ".") for p in _IMPORT_ONLY):
            return importlib.machinery.ModuleSpec(name, _ImportOnlyFinder, is_package=True)
        return None

    @staticmethod
    def create_module(spec):
        module = _ImportOnly(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module):
        return None


def slime_train_modules() -> None:
    """slime's rollout modules, plus import-only stand-ins for what its RolloutManager and
    Megatron actor modules import and the data path never calls (``_IMPORT_ONLY``)."""
    slime_rollout_modules()
    if not any(f is _ImportOnlyFinder for f in sys.meta_path):
        sys.meta_path.append(_ImportOnlyFinder)


def remove_import_only() -> None:
    """Undo ``slime_train_modules``' stand-ins: the finder leaves ``sys.meta_path`` and every
    stand-in module leaves ``sys.modules``, so that a later test importing one of those
    packages meets what is installed (or its own stand-in), never a module that raises."""
    sys.meta_path[:] = [f for f in sys.meta_path if f is not _ImportOnlyFinder]
    for name in [n for n, m in sys.modules.items() if isinstance(m, _ImportOnly)]:
        del sys.modules[name]


def rollout_manager_class():
    """slime's ``RolloutManager`` class itself (``@ray.remote`` wraps it in an actor class)."""
    slime_train_modules()
    from slime.ray.rollout import RolloutManager

    return RolloutManager.__ray_metadata__.modified_class


@contextlib.contextmanager
def cpu_accelerator():
    """slime's accelerator on the CPU, installed with slime's own ``set_accelerator``:
    slime's CUDA backend with its device calls answering ``cpu``."""
    from slime.utils import accelerator
    from slime.utils.accelerator.cuda import CUDAAccelerator

    class CPU(CUDAAccelerator):
        def is_available(self) -> bool:
            return True

        def current_device(self):
            return "cpu"

        def device(self, index=None):
            import torch

            return torch.device("cpu")

    accelerator.set_accelerator(CPU())
    try:
        yield
    finally:
        accelerator.reset_accelerator()


@contextlib.contextmanager
def megatron_ranks(*, dp_rank: int = 0, dp_size: int = 1, cp_rank: int = 0, cp_size: int = 1):
    """Megatron's parallel state answering as rank ``(dp_rank, cp_rank)`` of ``dp_size x
    cp_size`` in this one process: its data- and context-parallel rank and size getters
    (what slime's CP slicing, DP partition and loss scaling read); tensor and pipeline
    parallelism stay the one-process world ``initialize_model_parallel(1, 1)`` built."""
    from megatron.core import parallel_state as mpu

    def dp_rank_of(with_context_parallel=False, partial_data_parallel=False):
        return dp_rank * cp_size + cp_rank if with_context_parallel else dp_rank

    def dp_size_of(with_context_parallel=False, partial_data_parallel=False):
        return dp_size * cp_size if with_context_parallel else dp_size

    patched = {
        "get_data_parallel_rank": dp_rank_of,
        "get_data_parallel_world_size": dp_size_of,
        "get_context_parallel_rank": lambda: cp_rank,
        "get_context_parallel_world_size": lambda: cp_size,
    }
    saved = {name: getattr(mpu, name) for name in patched}
    try:
        for name, fn in patched.items():
            setattr(mpu, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(mpu, name, fn)
