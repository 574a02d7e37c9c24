"""Every change the CPU rehearsal makes to an arm's Miles run, in one table, with its reason.

``CHANGES`` lists them; ``rescue.rehearsal.miles.run`` prints the table at the start of a run
and applies the ``argument`` rows to the training command the launcher builds; the ``patch``
and ``probe`` rows are installed in every process of the run by
``rescue/rehearsal/miles/site/sitecustomize.py`` (on ``PYTHONPATH`` before ``ray start``,
active only with ``RESCUE_REHEARSAL_DIR`` set) through the import hook of
``rescue.rehearsal.miles.hook``, which patches a module right after its first import, so the
Miles checkout is never touched.

Kinds: ``argument`` (a flag added, removed or replaced), ``patch`` (a Miles, Megatron, SGLang
or torch function changed in-process because a CPU forces it), ``probe`` (an observation for
the report; behaviour unchanged). Line numbers are Miles 31f1ca96 and Megatron-LM 2e64d788.

``FAULTS`` are breakage on purpose, installed only when a run names one
(``--fault NAME``, which sets ``RESCUE_REHEARSAL_FAULT``): each must make the rehearsal
fail, which its test checks.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from dataclasses import dataclass

from rescue.rehearsal.miles import attention, device, hook, patches, probes
from rescue.rehearsal.miles.command import GPU_ONLY, NO_FUSION


@dataclass(frozen=True)
class Change:
    """One row of the table."""

    kind: str
    what: str
    reason: str
    module: str = ""  # patch/probe: applied right after this module is imported
    apply: Callable[[types.ModuleType], None] | None = None


#: The table. Arguments first, in the order the rehearsal applies them.
CHANGES: tuple[Change, ...] = (
    Change(
        "argument",
        f"removed: {' '.join(GPU_ONLY)} (with their values)",
        "each picks a GPU mechanism: Transformer Engine's attention kernel, moving the "
        "optimizer's state between GPU and host, TE's precision-aware Adam. On a CPU the "
        "attention is Megatron's own and every tensor already lives in host memory",
    ),
    Change(
        "argument",
        "removed: --colocate; added: --rollout-num-gpus 1 --num-gpus-per-node 2 (the "
        "single-turn and text-game launchers)",
        "colocated training and generation share the GPUs and move the weights by CUDA IPC "
        "(Miles' UpdateWeightFromTensor); an external engine on a CPU takes them by broadcast "
        "instead (UpdateWeightFromDistributed, over gloo: the rows below), as a cluster run "
        "without --colocate does, and holds one Ray logical GPU of its own beside the trainer's",
    ),
    Change(
        "argument",
        "--train-backend megatron --transformer-impl local",
        "the launcher's backend, built from Megatron's own layers: Transformer Engine needs "
        "CUDA. The architecture and the parameters are the same",
    ),
    Change(
        "argument",
        " ".join(NO_FUSION),
        "each turns off one fused CUDA kernel (Transformer Engine, Apex); Megatron computes "
        "the same operation in plain torch",
    ),
    Change(
        "argument",
        "--rollout-external --rollout-external-engine-addrs 127.0.0.1:PORT",
        "no GPU for SGLang: rescue's stand-in engine (rescue.rehearsal.standins.engine) serves the "
        "tiny policy instead and takes Miles' weight updates",
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
    Change("argument", "--distributed-backend gloo", "no NCCL without CUDA"),
    Change(
        "argument",
        "--sglang-router-port P --session-server-port P",
        "free ports picked at run time: the machine is shared",
    ),
    Change(
        "patch",
        f"stand-in modules whose names fail when used: {', '.join(hook.MISSING)}",
        "imported at module level by Miles for paths the rehearsal never takes: DeepSeek-V4 "
        "chat templates, the P2P weight transfer and Mooncake's object store. PyPI sglang "
        "0.5.23 and this machine lack them (Miles' image pins a 0.5.16 fork)",
    ),
    Change(
        "patch",
        "torchvision: a stand-in package whose objects fail when used (only when torchvision "
        "is not installed, and only after transformers recorded it as missing)",
        "SGLang's VLM configs import torchvision at import time; its PyPI wheels link "
        "libtorch_cuda and cannot load beside the CPU torch; no image is processed",
        "transformers.utils.import_utils",
        hook.placeholders_on,
    ),
    Change(
        "patch",
        "sglang.srt.distributed.parallel_state: ParallelismContext and RankParallelismConfig "
        "as placeholders that fail when used",
        "version skew: Miles' P2P weight transfer (update_weight_from_distributed/p2p.py ~12) "
        "imports them from its SGLang fork; PyPI sglang 0.5.23 lacks them. The rehearsal "
        "updates weights by broadcast, never P2P",
        "sglang.srt.distributed.parallel_state",
        patches.parallelism_names,
    ),
    Change(
        "patch",
        "sglang.srt.configs.utils.register_image_processor: a no-op",
        "registering SGLang's VLM image processors needs torchvision, whose PyPI wheels are "
        "CUDA builds that cannot load beside the CPU torch; Miles reaches it only through "
        "sglang's debug dumper import (dumper_utils.py ~15), and no image is processed",
        "sglang.srt.configs.utils",
        patches.image_processors,
    ),
    Change(
        "patch",
        "megatron.core.optimizer.DistributedOptimizer.state_dict: an optimizer that has taken "
        "no step yet gives its state dict with step 0",
        "Megatron's path without Apex or Transformer Engine (torch's Adam on a CPU) asserts "
        "one step count among the parameters' states (distrib_optimizer.py ~672), and a new "
        "optimizer has none: a resumed run builds that template before loading its "
        "checkpoint, whose state (step included) replaces it. On a GPU, TE's FusedAdam keeps "
        "the step in its parameter groups",
        "megatron.core.optimizer.distrib_optimizer",
        patches.optimizer_state_before_a_step,
    ),
    Change(
        "patch",
        "miles.ray.placement_group._get_placement_group_layout: external engines keep their "
        "rollout bundles (Ray logical GPUs)",
        "Miles bug on the external-engine path: with --rollout-external it reserves no "
        "rollout bundle (placement_group.py ~97-100) but server_group.py ~87-96 indexes the "
        "rollout GPU list: IndexError",
        "miles.ray.placement_group",
        patches.layout,
    ),
    Change(
        "patch",
        "router_manager.start_router: with --rollout-external and --use-miles-router, the "
        "external engines are added to the router (POST /add_worker)",
        "Miles registers an engine with its router only when it launches the engine "
        "(sglang_engine.py _init_normal); the external path never does",
        "miles.ray.rollout.router_manager",
        patches.register_external_engines,
    ),
    Change(
        "patch",
        "RolloutManager.dispose finishes the rollout manager's tracking (its wandb run)",
        "Miles bug: the rollout manager logs each step's rollout metrics and rescue's census "
        "from its own process but never finishes its wandb run (rollout_manager.py ~131), so "
        "the rows still queued when Ray stops it are lost: on a cluster the last step's, on a "
        "CPU with steps of a few seconds the last several (the report is judged from them)",
        "miles.ray.rollout.rollout_manager",
        patches.finish_rollout_tracking,
    ),
    Change(
        "patch",
        "MegatronTrainRayActor.update_weights finishes the train actor's tracking (its wandb "
        "run) after the last rollout's update",
        "Miles bug: the train actor logs each optimizer step's train/* from its own process but "
        "never finishes its wandb run (train.py finishes only the driver's), so the rows still "
        "queued when Ray stops it are lost: a CPU rehearsal of train.py lost the last 2 of 4 "
        "steps' rows (the report is judged from them)",
        "miles.backends.megatron_utils.actor",
        patches.finish_train_tracking,
    ),
    Change(
        "patch",
        "sglang_engine.dataclasses.fields: msgspec's field list for ServerArgs",
        "version skew: PyPI sglang 0.5.23's ServerArgs is a msgspec.Struct; Miles' image pins "
        "a 0.5.16 fork where it is a dataclass (sglang_engine.py ~806)",
        "miles.backends.sglang_utils.sglang_engine",
        patches.server_args_fields,
    ),
    Change(
        "patch",
        "SGLangEngine.init_weights_update_group and broadcast.init_process_group: the "
        "weight-update group on gloo at both ends",
        "Miles builds the trainer-to-engine group with nccl (broadcast.py ~220-240); no NCCL "
        "without CUDA. The transfer itself is Miles' own: names, dtypes and shapes by HTTP, "
        "each tensor broadcast from the trainer",
        "miles.backends.sglang_utils.sglang_engine",
        patches.gloo_engine_group,
    ),
    Change(
        "patch",
        "broadcast.init_process_group: the trainer's end of the weight-update group on gloo",
        "the trainer's half of the row above: both ends of one group must use one backend",
        "miles.backends.megatron_utils.update_weight.update_weight_from_distributed.broadcast",
        patches.gloo_update_group,
    ),
    Change(
        "patch",
        "torch.cuda on a CPU (rescue.rehearsal.miles.device): current_device 'cpu', the CUDA "
        "generator a CPU generator of its own, cuda devices in factory functions and .to/.cuda "
        "mapped to the CPU, factory functions' pin_memory=True to ordinary host memory, "
        "Tensor.type() naming the cuda type, synchronize/streams/events no-ops, the "
        "allocator's counters 0 and mem_get_info the host's memory",
        "Megatron places every tensor on torch.cuda.current_device(), forks the CUDA generator "
        "for model-parallel regions and checks that parameters are cuda tensors, and Miles "
        "backs the actor's weights up into pinned host memory beside a reference model "
        "(tensor_backper.py ~70); without CUDA each call raises. No computation changes: "
        "every op runs on the CPU",
        "megatron.core",
        device.patch,
    ),
    Change(
        "patch",
        "megatron.core.tensor_parallel.random._get/_set_cuda_rng_state: the stand-in generator",
        "Megatron's own setter queues the state through torch.cuda._lazy_call, which never "
        "runs without CUDA: the RNG tracker's fork would silently not restore",
        "megatron.core.tensor_parallel.random",
        device.patch_rng,
    ),
    Change(
        "patch",
        "DotProductAttention.forward takes packed sequences (qkv_format thd): causal softmax "
        "attention within each sequence of cu_seqlens (rescue.rehearsal.miles.attention)",
        "Miles trains on packed micro-batches, which only Transformer Engine's attention "
        "accepts; Megatron's local attention refuses them (dot_product_attention.py ~159). "
        "The result is what TE's kernel computes",
        "megatron.core.transformer.dot_product_attention",
        attention.patch,
    ),
    Change(
        "probe",
        "rescue's buffer records each step's group census as it hands it to Miles",
        "conservation is checked on every step, the last one included (Miles can lose the "
        "last step's wandb row at exit)",
        "rescue.miles.buffer",
        probes.census,
    ),
    Change(
        "probe",
        "rescue's buffer records every group its gate decides on (id, staleness, bucket, weight)",
        "a killed and resumed run: a group id that comes back meets the same coin (the "
        "report compares them across the lives)",
        "rescue.miles.buffer",
        probes.gate,
    ),
    Change(
        "probe",
        "FullyAsyncRolloutFn's unused handler records every group it receives, and after "
        "which census",
        "the report checks that every group it receives is one the census counted dropped or "
        "aborted in that step, and the other way round",
        "miles.rollout.fully_async_rollout",
        probes.unused_handler,
    ),
    Change(
        "probe",
        "Miles' convert_samples_to_train_data records each trained sample's reward after "
        "the hook, loss-mask sum, the turn channel's sum, outcome and weight",
        "the report checks the 1/a weights, that no infra_no_result rollout has a non-zero "
        "loss mask, and that the loss trained exactly the advantages of the train data",
        "miles.ray.rollout.train_data_conversion",
        probes.train_data,
    ),
    Change(
        "probe",
        "rescue's Dr. GRPO reducer records what it returns for all-ones, with the tokens "
        "and the divisor",
        "the report checks that the loss divided by the constant divisor",
        "rescue.miles.drgrpo",
        probes.reducer,
    ),
    Change(
        "probe",
        "UpdateWeightFromDistributed records the digest of the tensors each update sends",
        "the report checks that the engine received exactly these weights at each version",
        "miles.backends.megatron_utils.update_weight.update_weight_from_distributed.broadcast",
        probes.trainer_weights,
    ),
)


#: Faults a run may name (``--fault``); none is ever installed otherwise.
FAULTS: dict[str, Change] = {
    "turn-channel": Change(
        "fault",
        "rescue.miles.loss.trained_advantages ignores the turn arm's per-token channel",
        "a loss that trains the group baseline instead of the turn-reached advantages must "
        "fail the advantages check",
        "rescue.miles.loss",
        patches.fault_turn_channel,
    ),
    "missing-head": Change(
        "fault",
        "the first trained position of every sample loses its score-centering head on the "
        "way to the trainer (rescue.miles.topk_store.Trainer.rows)",
        "under tis-sc a trained position without its head must stop the step",
        "rescue.miles.topk_store",
        patches.fault_missing_head,
    ),
}
#: The environment variable that names a run's fault.
FAULT_ENV = "RESCUE_REHEARSAL_FAULT"


def install() -> None:
    """Install the import hook for every ``patch`` and ``probe`` row, and the fault
    ``RESCUE_REHEARSAL_FAULT`` names (idempotent)."""
    table: dict[str, list[Callable[[types.ModuleType], None]]] = {}
    rows = list(CHANGES)
    if fault := os.environ.get(FAULT_ENV):
        if fault not in FAULTS:
            raise ValueError(f"{FAULT_ENV}={fault!r}; allowed: {', '.join(FAULTS)}")
        rows.append(FAULTS[fault])
    for change in rows:
        if change.apply is not None:
            table.setdefault(change.module, []).append(change.apply)
    hook.install(table)
