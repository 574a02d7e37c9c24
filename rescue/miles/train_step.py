"""The train-side half of the logging contract: update norm and trained advantage moments.

Target of ``--custom-megatron-before-train-step-hook-path
rescue.miles.train_step.before_train_step``; works with ``rescue.miles.loss.policy_loss``.

Specification
-------------
Miles calls ``before_train_step(args, rollout_id, step_id, model, optimizer,
opt_param_scheduler)`` before every optimizer step (after the gradients are zeroed). It

1. clears the advantage moments ``MOMENTS`` that ``rescue.miles.loss.policy_loss`` records
   for this step's micro-batches; under score centering (``rescue.miles.sc_loss``) also
   clears its figures ``SC_STATS`` and names the rollout being trained to the heads'
   transport (``rescue.miles.topk_store.TRAINER.begin``);
2. installs, once per optimizer, the step wrapper (``rescue.miles.step``) with its layers:
   ``TrainLog`` (outermost); unless ``RESCUE_UPDATE_NORM=0``, ``UpdateNorm``; and, when
   the run converts with ``rescue.miles.matched.convert_samples_to_train_data`` (the
   matched-update control), ``MatchedUpdate`` (innermost), with the scheduler's step held
   at the reference copy's steps (``rescue.miles.matched``);
3. hands the wrapper this step's ``(args, rollout_id, step_id)``;
4. with ``RESCUE_ORACLE_DIR`` set (a gradient-oracle replay, ``rescue.miles.oracle``),
   wraps this step's ``finalize_model_grads_func`` to capture the reduced gradient.

After Miles' ``optimizer.step()``, ``TrainLog`` reduces the moments over the DP x CP groups
(every rank takes part) and logs, through Miles' tracking on the rank that has it
initialized (last pipeline stage, DP x CP rank 0, TP rank 0: Miles'
``is_first_replica_megatron_main_rank``):

``train/rescue/update_norm``   ``‖Δθ‖₂`` of the step (``UpdateNorm``);
``train/rescue/adv_mean``      mean advantage over the tokens trained this step (loss mask 1);
``train/rescue/adv_var``       their variance (population variance over those tokens);
``train/rescue/adv_tokens``    how many tokens that is (0, alone, in a step that trained none);
``train/rescue/sc/*``          under score centering: ``tokens``, ``head_mass_sampler``,
                               ``head_mass_trainer``, ``truncated_frac``, ``correction_l1``
                               (``rescue.miles.sc_loss``; means over the trained tokens);

and, under the matched-update control, ``train/rescue/matched_copy``,
``train/rescue/update_norm_ref``, ``train/rescue/update_norm_mask`` and
``train/rescue/update_scale`` (``rescue.miles.matched``); at ``train/step = rollout_id * S +
step_id`` with ``S`` Miles' steps per rollout (``--num-steps-per-rollout``, else
``rollout_batch_size * n_samples_per_prompt // global_batch_size``; twice that under the
matched control, which takes each step on two copies), the value Miles logs its own
``train/*`` keys at when every rollout has ``S`` steps. Clip fraction and TIS statistics are Miles' own (``train/pg_clipfrac``,
``train/tis*``). Nothing is logged for a step Miles skips (no ``optimizer.step()`` call:
inf/NaN gradients, ``--debug-disable-optimizer``).

Settings: ``RESCUE_UPDATE_NORM`` = ``1`` (default) | ``0`` (no parameter copy, no
``train/rescue/update_norm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rescue import flags
from rescue.errors import InputError
from rescue.miles.matched import MatchedUpdate, ReferenceStepHold, matched_enabled
from rescue.miles.sc_flags import sc_enabled
from rescue.miles.step import StepContext, StepWrapper, UpdateNorm

#: Prefix of every key this module logs.
PREFIX = "train/rescue/"
#: Miles' step key of ``train/*`` metrics.
STEP_KEY = "train/step"
#: Environment variable switching the update norm.
ENV_UPDATE_NORM = "RESCUE_UPDATE_NORM"


#: ``RESCUE_UPDATE_NORM`` (default ``1``): ``1`` or ``0``.
UPDATE_NORM = flags.switch(ENV_UPDATE_NORM, True)
update_norm_from_env = UPDATE_NORM.read


class AdvantageMoments:
    """Count, sum and sum of squares of the trained advantages of the current step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded (start of a step)."""
        self._seen: dict[int, Any] = {}
        self.sums: Any = None

    def record(self, key: Any, advantages: Sequence[Any], masks: Sequence[Any]) -> None:
        """Add one micro-batch's advantages on its mask-1 tokens; ``key`` once per step.

        ``key`` is an object of the micro-batch (its advantages list), held until the next
        ``reset`` so that a recomputation of the same micro-batch is recognized.
        """
        import torch

        if id(key) in self._seen or not advantages:
            return
        self._seen[id(key)] = key
        with torch.no_grad():
            a = torch.cat([x.detach().reshape(-1) for x in advantages]).double()
            m = torch.cat([x.reshape(-1) for x in masks]).to(device=a.device, dtype=torch.float64)
            if m.shape != a.shape:
                raise InputError(
                    f"advantages cover {a.numel()} tokens, the local loss masks {m.numel()}"
                )
            sums = torch.stack([m.sum(), (a * m).sum(), (a * a * m).sum(), m.new_ones(())])
        self.sums = sums if self.sums is None else self.sums + sums

    def reduce(self, groups: Sequence[Any] = ()) -> dict[str, float]:
        """``adv_tokens``, ``adv_mean``, ``adv_var`` over all ranks of ``groups`` (all-reduced).

        Every rank of the groups must call it (a rank with nothing recorded adds zeros).
        Empty when nothing was recorded anywhere (rescue's loss did not run); only
        ``adv_tokens`` = 0 when micro-batches were recorded but none trained a token (a step
        whose every sample was loss-masked): there is no mean or variance of nothing.
        """
        import torch
        import torch.distributed as dist

        sums = self.sums if self.sums is not None else torch.zeros(4, dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            for group in groups:
                dist.all_reduce(sums, group=group)
        n, s1, s2, batches = (float(x) for x in sums.cpu())
        if batches <= 0:
            return {}
        if n <= 0:
            return {"adv_tokens": 0.0}
        mean = s1 / n
        return {"adv_tokens": n, "adv_mean": mean, "adv_var": max(s2 / n - mean * mean, 0.0)}


#: The moments of the current step, recorded by ``rescue.miles.loss.policy_loss``.
MOMENTS = AdvantageMoments()


def steps_per_rollout(args: Any) -> int:
    """Miles' optimizer steps per rollout (module docstring), at least 1."""
    copies = 2 if matched_enabled(args) else 1
    configured = getattr(args, "num_steps_per_rollout", None)
    if configured:
        return copies * int(configured)
    batch = getattr(args, "rollout_batch_size", 0) * getattr(args, "n_samples_per_prompt", 0)
    gbs = getattr(args, "global_batch_size", None) or batch
    return copies * (max(1, batch // gbs) if gbs else 1)


def _parallel() -> tuple[Sequence[Any], bool]:
    """DP x CP groups to reduce over, and whether this rank logs (Miles' rule)."""
    from miles.backends.training_utils.parallel import get_parallel_state

    state = get_parallel_state()
    groups = [g for g in state.effective_dp_cp.groups_inner_to_outer if g is not None]
    logs = (
        state.effective_dp_cp.rank == 0
        and state.tp.rank == 0
        and state.pp.rank == state.pp.size - 1
    )
    return groups, logs


class TrainLog:
    """Layer: after the step, log ``metrics`` and the reduced moments (module docstring)."""

    def __call__(self, ctx: StepContext, optimizer: Any, step: Any) -> Any:
        result = step()
        groups, logs = _parallel()
        reduced = {**ctx.metrics, **MOMENTS.reduce(groups)}
        if sc_enabled(ctx.args):
            from rescue.miles.sc_stats import SC_STATS

            reduced.update(SC_STATS.reduce(groups))
        metrics = {PREFIX + k: v for k, v in reduced.items()}
        ctx.metrics.clear()
        if logs and metrics:
            from miles.utils.tracking_utils import tracking

            metrics[STEP_KEY] = ctx.rollout_id * steps_per_rollout(ctx.args) + ctx.step_id
            tracking.log(ctx.args, metrics, step_key=STEP_KEY)
        return result


def before_train_step(
    args: Any,
    rollout_id: int,
    step_id: int,
    model: Any,
    optimizer: Any,
    opt_param_scheduler: Any,
) -> None:
    """Miles' before-train-step hook (module docstring)."""
    from rescue.miles.oracle import install_capture, oracle_dir_from_env

    MOMENTS.reset()
    if sc_enabled(args):
        from rescue.miles.sc_stats import SC_STATS
        from rescue.miles.topk_store import TRAINER

        SC_STATS.reset()
        TRAINER.begin(rollout_id)
    if oracle_dir_from_env() is not None:
        install_capture(args, rollout_id, step_id, model, optimizer)
    if optimizer is None:
        return
    wrapper = StepWrapper.install(optimizer)
    wrapper.ensure(TrainLog)
    if update_norm_from_env():
        wrapper.ensure(UpdateNorm)
    if matched_enabled(args):
        wrapper.ensure(MatchedUpdate)
        ReferenceStepHold.install(opt_param_scheduler, lambda: wrapper.context)
    wrapper.context = StepContext(args=args, rollout_id=rollout_id, step_id=step_id)
