"""Every change the CPU rehearsal makes to a SWE arm's Miles run, in one table, with its reason.

``CHANGES`` lists them; ``rescue.miles.rehearsal`` prints the table at the start of a run,
applies the ``argument`` rows to the training command the launcher builds, and the
``patch`` and ``probe`` rows are installed in every process of the run by
``rescue/miles/rehearsal_site/sitecustomize.py`` (on ``PYTHONPATH`` before ``ray start``,
active only with ``RESCUE_REHEARSAL_DIR`` set): an import hook that patches a module right
after it is first imported, so the Miles checkout is never touched.

Kinds: ``argument`` (a flag added, removed or replaced), ``patch`` (a Miles or library
function changed in-process because a CPU forces it), ``probe`` (an observation for the
report; behaviour unchanged). Line numbers are Miles 31f1ca96.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Change:
    """One row of the table."""

    kind: str
    what: str
    reason: str
    module: str = ""  # patch/probe: applied right after this module is imported
    apply: Callable[[types.ModuleType], None] | None = None


# ── patches ─────────────────────────────────────────────────────────────────────────────


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _layout(module: types.ModuleType) -> None:
    original = module._get_placement_group_layout

    def layout(args: Any) -> tuple[int, int]:
        if args.rollout_external and not args.debug_train_only:
            actor = args.actor_num_nodes * args.actor_num_gpus_per_node
            return actor + args.rollout_num_gpus, actor
        return original(args)

    module._get_placement_group_layout = layout


def _set_device(module: types.ModuleType) -> None:
    import torch

    if _no_cuda():
        torch.cuda.set_device = lambda *args, **kwargs: None


def _current_device(module: types.ModuleType) -> None:
    import torch

    if _no_cuda():
        torch.cuda.current_device = lambda: "cpu"


def _mesh(module: types.ModuleType) -> None:
    original = module.build_fsdp_meshes

    def build(*args: Any, **kwargs: Any) -> Any:
        if _no_cuda() and kwargs.get("device_type") == "cuda":
            kwargs["device_type"] = "cpu"
        return original(*args, **kwargs)

    module.build_fsdp_meshes = build


def _server_args_fields(module: types.ModuleType) -> None:
    import dataclasses

    class Fields(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(dataclasses, name)

        @staticmethod
        def fields(cls: Any) -> Any:
            if dataclasses.is_dataclass(cls):
                return dataclasses.fields(cls)
            import msgspec

            return msgspec.structs.fields(cls)

    module.dataclasses = Fields("dataclasses")


def _image_processors(module: types.ModuleType) -> None:
    module.register_image_processor = lambda config, image_processor: None


def _weight_version(module: types.ModuleType) -> None:
    group = module.RayTrainGroup
    original = group.update_weights
    stride = int(os.environ.get("RESCUE_REHEARSAL_VERSION_STRIDE", "1"))

    async def update_weights(self: Any, rollout_id: int | None = None) -> None:
        if not self.args.debug_rollout_only:
            return await original(self, rollout_id)
        import asyncio

        self._rescue_weight_version = getattr(self, "_rescue_weight_version", 0) + stride
        version = self._rescue_weight_version
        info = await self.rollout_manager.get_updatable_engines_and_lock.remote()
        engines = list(info.rollout_engines) if info is not None else []
        await asyncio.gather(*[e.update_weight_version.remote(str(version)) for e in engines])
        await self.rollout_manager.set_weight_version.remote(version)
        _record("versions", {"version": version, "rollout_id": rollout_id})
        return None

    group.update_weights = update_weights


def _register_external_engines(module: types.ModuleType) -> None:
    original = module.start_router

    def start_router(args: Any, *rest: Any, **kwargs: Any) -> tuple[str, int]:
        ip, port = original(args, *rest, **kwargs)
        if getattr(args, "rollout_external", False) and getattr(args, "use_miles_router", False):
            import requests

            for addr in args.rollout_external_engine_addrs or []:
                url = f"http://{ip}:{port}/add_worker"
                requests.post(url, params={"url": f"http://{addr}"}, timeout=30).raise_for_status()
        return ip, port

    module.start_router = start_router


#: Packages imported only by SGLang's vision code on the rollout side's import path; when
#: not installable next to the CPU torch they are placeholders that fail when used. They
#: appear only after transformers has recorded them as unavailable, so transformers never
#: takes a placeholder for the package.
_PLACEHOLDERS = ("torchvision",)
_PLACEHOLDERS_ON = False


def _placeholders_on(module: types.ModuleType) -> None:
    global _PLACEHOLDERS_ON
    module.is_torchvision_available()  # cached as False before the placeholder exists
    _PLACEHOLDERS_ON = True


# ── probes ──────────────────────────────────────────────────────────────────────────────

_WRITE = threading.Lock()


def _record(name: str, row: dict[str, Any]) -> None:
    folder = os.environ.get("RESCUE_REHEARSAL_DIR")
    if not folder:
        return
    with _WRITE, open(Path(folder) / "probes" / f"{name}.jsonl", "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def _sample_row(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None) or {}
    return {
        "index": getattr(sample, "index", None),
        "group_index": getattr(sample, "group_index", None),
        "rollout_id": getattr(sample, "rollout_id", None),
        "status": str(getattr(sample, "status", "")),
        "outcome": metadata.get("outcome"),
        "outcome_reason": metadata.get("outcome_reason"),
        "rescue_weight": metadata.get("rescue_weight"),
        "weight_versions": list(getattr(sample, "weight_versions", None) or []),
    }


def _unused_handler(module: types.ModuleType) -> None:
    cls = module.FullyAsyncRolloutFn
    original = cls.__init__

    def __init__(self: Any, input: Any) -> None:
        original(self, input)
        handle = self._handle_unused

        def recorded(prompt_group: list[Any]) -> None:
            _record("unused", {"samples": [_sample_row(s) for s in prompt_group]})
            handle(prompt_group)

        self._handle_unused = recorded

    cls.__init__ = __init__


def _train_data(module: types.ModuleType) -> None:
    original = module.convert_samples_to_train_data

    def convert(args: Any, samples: Any, *rest: Any, **kwargs: Any) -> Any:
        data = original(args, samples, *rest, **kwargs)
        rows = [_sample_row(s) for s in samples]
        for i, row in enumerate(rows):
            row["reward"] = float(data["rewards"][i])
            row["raw_reward"] = float(data["raw_reward"][i])
            row["loss_mask_sum"] = int(sum(data["loss_masks"][i]))
        _record("train_data", {"samples": rows})
        return data

    module.convert_samples_to_train_data = convert


#: The table. Arguments first, in the order the rehearsal applies them.
CHANGES: tuple[Change, ...] = (
    Change(
        "argument",
        "--train-backend fsdp --debug-rollout-only",
        "no Megatron and no training step on a CPU; Miles' own e2e tests run the rollout side "
        "this way. The actors still start, receive every batch and return before the step",
    ),
    Change(
        "argument",
        "removed: every flag the FSDP parser does not know (listed at the start of the run)",
        "Megatron-only flags (model architecture, TP/SP/PP, recompute, optimizer offload, "
        "attention backend): Miles' FSDP parser rejects them",
    ),
    Change(
        "argument",
        "--context-parallel-size 1",
        "Miles asserts context parallelism is off for the FSDP backend",
    ),
    Change(
        "argument",
        "--rollout-external --rollout-external-engine-addrs 127.0.0.1:PORT",
        "no GPU for SGLang: rescue's stand-in engine (rescue.rehearsal.engine) answers instead",
    ),
    Change(
        "argument",
        "--use-miles-router (rehearsal option --router miles, the default); with --router "
        "sglang: --worker-urls http://127.0.0.1:PORT instead",
        "PyPI sglang-router (0.2.4 to 0.3.2, all tried) re-serializes /v1/chat/completions and "
        "drops return_meta_info and input_ids, which Miles' session server sets and needs "
        "(session/core.py ~176-200, ~214): no meta_info comes back and every turn is a 502. "
        "Miles' own router forwards the body unchanged. With sglang-router, --worker-urls: "
        "with external engines Miles never registers the engine with its router",
    ),
    Change(
        "patch",
        "router_manager.start_router: with --rollout-external and --use-miles-router, the "
        "external engines are added to the router (POST /add_worker)",
        "Miles registers an engine with its router only when it launches the engine "
        "(sglang_engine.py _init_normal); the external path never does",
        "miles.ray.rollout.router_manager",
        _register_external_engines,
    ),
    Change("argument", "--distributed-backend gloo", "no NCCL without CUDA"),
    Change(
        "argument",
        "--sglang-router-port P --session-server-port P",
        "free ports picked at run time: the machine is shared",
    ),
    Change(
        "patch",
        "sglang.srt.entrypoints.openai.encoding_dsv4: an empty module",
        "PyPI sglang 0.5.23 lacks it; Miles imports it for DeepSeek-V4 chat templates only "
        "(created by the import hook, see _MISSING)",
    ),
    Change(
        "patch",
        "torchvision: a placeholder package whose objects fail when used (only when "
        "torchvision is not installed, and only after transformers recorded it as missing)",
        "SGLang's VLM configs import torchvision at import time; its PyPI wheels link "
        "libtorch_cuda and cannot load beside the CPU torch; no image is processed",
        "transformers.utils.import_utils",
        _placeholders_on,
    ),
    Change(
        "patch",
        "sglang.srt.configs.utils.register_image_processor: a no-op",
        "registering SGLang's VLM image processors needs torchvision, whose PyPI wheels are "
        "CUDA builds that cannot load beside the CPU torch; Miles reaches it only through "
        "sglang's debug dumper import (dumper_utils.py ~15), and no image is processed",
        "sglang.srt.configs.utils",
        _image_processors,
    ),
    Change(
        "patch",
        "miles.ray.placement_group._get_placement_group_layout: external engines keep their "
        "rollout bundles (Ray logical GPUs)",
        "Miles bug on the external-engine path: with --rollout-external it reserves 0 rollout "
        "bundles (0 of any kind with --debug-rollout-only, placement_group.py ~98) but "
        "server_group.py ~87-96 indexes the rollout GPU list and actor_factory.py ~89 the "
        "actor bundles: IndexError",
        "miles.ray.placement_group",
        _layout,
    ),
    Change(
        "patch",
        "torch.cuda.set_device: a no-op without CUDA",
        "train_actor.py ~95 selects a GPU unconditionally",
        "miles.ray.train_actor",
        _set_device,
    ),
    Change(
        "patch",
        "miles.backends.fsdp_utils.parallel.build_fsdp_meshes: device 'cpu' without CUDA",
        "parallel.py ~52 hard-codes the cuda device mesh",
        "miles.backends.fsdp_utils.parallel",
        _mesh,
    ),
    Change(
        "patch",
        "torch.cuda.current_device(): 'cpu' without CUDA",
        "training_utils/data.py ~51 moves the batch to the GPU before the debug-mode return "
        "(fsdp_utils/actor.py ~456-458)",
        "miles.backends.training_utils.data",
        _current_device,
    ),
    Change(
        "patch",
        "sglang_engine.dataclasses.fields: msgspec's field list for ServerArgs",
        "version skew: PyPI sglang 0.5.23's ServerArgs is a msgspec.Struct; Miles' image pins "
        "a 0.5.16 fork where it is a dataclass (sglang_engine.py ~806)",
        "miles.backends.sglang_utils.sglang_engine",
        _server_args_fields,
    ),
    Change(
        "patch",
        "RayTrainGroup.update_weights under --debug-rollout-only: the weight version "
        "advances by RESCUE_REHEARSAL_VERSION_STRIDE (default 1) on every engine "
        "(update_weight_version) and the rollout manager (set_weight_version); no weights move",
        "--debug-rollout-only skips the update, so the version would stay unset and no group "
        "could ever be stale; a real update does exactly these two calls after the transfer",
        "miles.ray.actor_group",
        _weight_version,
    ),
    Change(
        "probe",
        "FullyAsyncRolloutFn's unused handler records every group it receives",
        "the report checks that dropped and aborted groups reached it",
        "miles.rollout.fully_async_rollout",
        _unused_handler,
    ),
    Change(
        "probe",
        "RolloutManager's convert_samples_to_train_data records each trained sample's "
        "reward after the hook, loss-mask sum, outcome and weight",
        "the report checks the 1/a weights and that no infra_no_result rollout has a "
        "non-zero loss mask",
        "miles.ray.rollout.rollout_manager",
        _train_data,
    ),
)

#: Modules PyPI sglang lacks that Miles imports: created empty by the hook.
_MISSING = ("sglang.srt.entrypoints.openai.encoding_dsv4",)


class _Placeholder(type):
    """Any attribute is another placeholder class; calling one says what is missing."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {"_missing": cls._missing})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{cls._missing} is not installed (CPU rehearsal placeholder)")


class _Hook(importlib.abc.MetaPathFinder):
    """Patches a module right after its first import; creates ``_MISSING`` modules."""

    def __init__(self, patches: dict[str, list[Callable[[types.ModuleType], None]]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.split(".")[0]
        if _PLACEHOLDERS_ON and top in _PLACEHOLDERS and self._real_spec(top, None, None) is None:
            return importlib.machinery.ModuleSpec(name, _PlaceholderLoader(), is_package=True)
        if name in _MISSING:
            spec = self._real_spec(name, path, target)
            if spec is None:
                return importlib.machinery.ModuleSpec(name, _EmptyLoader())
            return None
        if name not in self.patches:
            return None
        spec = self._real_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patches[name])
        return spec

    def _real_spec(self, name: str, path: Any, target: Any) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
        return None


class _EmptyLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "Empty stand-in created by rescue's CPU rehearsal."


class _PlaceholderLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        missing = module.__name__.split(".")[0]
        module.__getattr__ = lambda name: (  # type: ignore[method-assign]
            _Placeholder(name, (), {"_missing": missing})
            if not name.startswith("__")
            else (_ for _ in ()).throw(AttributeError(name))
        )


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patches: list[Callable[[types.ModuleType], None]]) -> None:
        self.loader = loader
        self.patches = patches

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        for patch in self.patches:
            patch(module)


def install() -> None:
    """Install the import hook for every ``patch`` and ``probe`` row (idempotent)."""
    if any(isinstance(f, _Hook) for f in sys.meta_path):
        return
    patches: dict[str, list[Callable[[types.ModuleType], None]]] = {}
    for change in CHANGES:
        if change.apply is not None:
            patches.setdefault(change.module, []).append(change.apply)
    sys.meta_path.insert(0, _Hook(patches))
