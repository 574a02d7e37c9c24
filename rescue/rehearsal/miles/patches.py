"""The ``patch`` rows' functions: Miles and SGLang changed in-process where a CPU forces it.

Each takes the module just imported (``rescue.rehearsal.miles.hook``) and replaces one
function or adds names; ``rescue.rehearsal.miles.changes`` says why, row by row. The torch
stand-ins are in ``device``, the packed attention in ``attention``.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from rescue.rehearsal.miles.hook import Placeholder


def layout(module: types.ModuleType) -> None:
    """``miles.ray.placement_group``: external engines keep their rollout bundles."""
    original = module._get_placement_group_layout

    def placement(args: Any) -> tuple[int, int]:
        if args.rollout_external and not args.debug_train_only:
            actor = args.actor_num_nodes * args.actor_num_gpus_per_node
            return actor + args.rollout_num_gpus, actor
        return original(args)

    module._get_placement_group_layout = placement


def server_args_fields(module: types.ModuleType) -> None:
    """``sglang_engine``: msgspec's field list where ``ServerArgs`` is no dataclass."""
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


def parallelism_names(module: types.ModuleType) -> None:
    """``sglang.srt.distributed.parallel_state``: the fork's names as placeholders."""
    for name in ("ParallelismContext", "RankParallelismConfig"):
        if not hasattr(module, name):
            setattr(module, name, Placeholder(name, (), {"_missing": f"sglang's {name}"}))


def image_processors(module: types.ModuleType) -> None:
    """``sglang.srt.configs.utils``: registering VLM image processors is a no-op."""
    module.register_image_processor = lambda config, image_processor: None


def register_external_engines(module: types.ModuleType) -> None:
    """``router_manager``: external engines are added to Miles' router."""
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


def gloo_update_group(module: types.ModuleType) -> None:
    """``update_weight_from_distributed.broadcast``: the trainer's end of the weight-update
    group on gloo (Miles asks for nccl)."""
    original = module.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = "gloo"
        return original(*args, **kwargs)

    module.init_process_group = init_process_group


def gloo_engine_group(module: types.ModuleType) -> None:
    """``sglang_engine.SGLangEngine``: the engine's end of the group on gloo too."""
    cls = module.SGLangEngine
    original = cls.init_weights_update_group

    def init_weights_update_group(
        self: Any, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str,
    ) -> Any:  # fmt: skip
        return original(
            self, master_address, master_port, rank_offset, world_size, group_name, "gloo"
        )

    cls.init_weights_update_group = init_weights_update_group


# ── faults: deliberate breakage the rehearsal must catch (``--fault``) ─────────────────


def fault_turn_channel(module: types.ModuleType) -> None:
    """``rescue.miles.loss``: the loss ignores the per-token channel."""
    module.trained_advantages = lambda batch: batch["advantages"]


def fault_missing_head(module: types.ModuleType) -> None:
    """``rescue.miles.topk_store``: the first trained position of every sample loses its
    head on the way to the trainer."""
    import numpy as np

    cls = module.Trainer
    rows = cls.rows

    def lossy(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = rows(self, *args, **kwargs)
        has = np.array(out["has"], copy=True)
        where = np.flatnonzero(has)
        if where.size:
            has[where[0]] = False
        return {**out, "has": has}

    cls.rows = lossy


def finish_rollout_tracking(module: types.ModuleType) -> None:
    """``RolloutManager.dispose`` finishes the process's tracking (its wandb run). The class
    is a Ray actor (``@ray.remote``): the method is patched on the class Ray wraps, which the
    actor's process imports by name (so this hook patches it there)."""
    actor = module.RolloutManager
    meta = getattr(actor, "__ray_metadata__", None)
    # the class Ray wraps, and the subclass it instantiates in the actor's process (Ray copies
    # the methods into it when it decorates the class, so it is patched too)
    classes = [getattr(actor, "__ray_actor_class__", actor)]
    if meta is not None:
        classes.append(meta.modified_class)
    for cls in classes:
        original = cls.dispose

        def dispose(self: Any, _original: Any = original) -> None:
            try:
                _original(self)
            finally:
                from miles.utils.tracking_utils.tracking import finish_tracking

                finish_tracking()

        cls.dispose = dispose


def finish_train_tracking(module: types.ModuleType) -> None:
    """``MegatronTrainRayActor.update_weights`` finishes the train actor's tracking (its wandb
    run) after the update that follows the run's last rollout (``--num-rollout``): nothing
    the actor logs comes after it. Ray copies the class's methods when the driver decorates
    it, after this hook patched it there."""
    cls = module.MegatronTrainRayActor
    original = cls.update_weights

    @functools.wraps(original)
    def update_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        last = getattr(self, "_last_rollout_id", None)
        if last is not None and last + 1 >= self.args.num_rollout:
            from miles.utils.tracking_utils.tracking import finish_tracking

            finish_tracking()
        return out

    cls.update_weights = update_weights


def optimizer_state_before_a_step(module: types.ModuleType) -> None:
    """``DistributedOptimizer.state_dict`` of an optimizer that has taken no step yet, on
    Megatron's path without Apex or Transformer Engine (torch's Adam): the state dict with
    step 0 instead of an assertion (``distrib_optimizer.py`` ~672 asserts one step count among
    the parameters' states, of which a new optimizer has none). A resumed run builds this
    template before the checkpoint's state replaces it, step included."""
    cls = module.DistributedOptimizer
    original = cls.state_dict

    def state_dict(self: Any) -> dict[str, Any]:
        if module.HAVE_APEX_OR_TE or len(self.optimizer.state):
            return original(self)
        inner = self.optimizer.state_dict()
        out: dict[str, Any] = {"optimizer": {k: v for k, v in inner.items() if k != "state"}}
        for group in out["optimizer"]["param_groups"]:
            del group["params"]
            group["step"] = 0
        if self.grad_scaler:
            out["grad_scaler"] = self.grad_scaler.state_dict()
        return out

    cls.state_dict = state_dict
