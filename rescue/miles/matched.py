"""The two controls of the update's size: each step taken on two copies of the batch.

- The matched-update control (arm ``matched``): the mask arm's step rescaled to the R = 0
  arm's update norm. Target: ``--custom-convert-samples-to-train-data-path
  rescue.miles.matched.convert_samples_to_train_data``.
- The step-size control (arm ``step-control``): the R = 0 arm's step rescaled to the mask
  arm's update norm. Target: ``--custom-convert-samples-to-train-data-path
  rescue.miles.matched.convert_samples_to_train_data_step_control``.

Either goes with rescue's before-train-step hook
(``rescue.miles.train_step.before_train_step``), which installs ``MatchedUpdate`` when it
sees one of these convert paths. What follows describes the matched control; the step-size
control is the same schedule with the copies' roles swapped: its first copy (measured, not
applied) is the mask copy B, its second (applied at the first's update norm) the R = 0 copy
A, so it trains R = 0's direction at the mask's step size. Its logged ``update_norm_mask``
is the first copy's norm, ``update_norm_ref`` the second's before scaling, and the realized
``update_norm`` equals ``update_norm_mask``.

Specification
-------------
Each training step of the mask arm is taken twice from the same parameters and optimizer
state, once on each of two copies of the same batch:

- copy A, the R = 0 arm: the batch with every capped trajectory unmasked
  (``remove_sample`` cleared on the trajectories ``rescue.outcomes.is_capped`` marks, the
  only ones a mask filter masks; any other ``remove_sample`` stays);
- copy B, the mask arm: the batch as the sample filter left it.

Both copies go through Miles' own conversion with the run's reward hook
(``--custom-reward-post-process-path``, else Miles' normalization), each copy on its own, so
the group baselines, ``RESCUE_TRUNCATED_REWARD`` (``zero`` scores every budget failure 0:
the launchers' setting) and the per-rollout loss denominators are those each arm would
have. Copy B's rollout ids are shifted by ``ROLLOUT_ID_OFFSET``. The rollouts are laid out
``A_1, B_1, A_2, B_2, ...`` in chunks of ``--global-batch-size`` rollouts, so Miles' DP
schedule (steps of ``global_batch_size`` rollouts in first-appearance order) makes two
optimizer steps per base step: step ``2k`` is copy A's k-th chunk, ``2k + 1`` copy B's.

``MatchedUpdate``, a layer of the optimizer-step wrapper (``rescue.miles.step``):

- step ``2k`` (copy A): Megatron's full step runs (gradient norm, clipping by copy A's own
  norm, the inner optimizer step) with the inner step measured and undone
  (``measured_inner_steps``): the reference update norm ``‖Δθ_A‖`` is recorded, and
  parameters and optimizer state (moments, step counts) are left exactly as before. The
  learning-rate scheduler's step is skipped, so it advances once per base step, by the
  base step's rollouts, as in the mask arm.
- step ``2k + 1`` (copy B): the step is measured and undone the same way (``‖Δθ_B‖`` at
  the scheduled learning rate), then applied with every group's learning rate multiplied
  by ``s = ‖Δθ_A‖ / ‖Δθ_B‖`` (``step_with_ready_grads()`` on the prepared, clipped
  gradients).

Exactness: for the optimizers Megatron builds (SGD with momentum and coupled weight decay;
Adam and AdamW with bias correction, ε and decoupled decay ``lr·wd·θ``), the update from a
given state and gradient is ``lr · D(g, state, θ)`` and the new moments do not depend on
``lr``. So the applied update is ``s · Δθ_B`` and its norm equals ``‖Δθ_A‖`` up to the
rounding of the parameter arithmetic; under SGD without momentum or decay ``s`` is the
ratio of the clipped gradient norms. Both updates include weight decay, and each copy is
clipped by its own gradient norm, as each arm would be. What is matched is the update of
the step the mask arm takes, not its direction.

Logged at each step (``rescue.miles.train_step``; ``train/step = rollout_id · 2S + step``):
``train/rescue/matched_copy`` (0: copy A, measured, not applied; 1: copy B, applied), so
every Miles ``train/*`` row (``train/grad_norm``, ``train/pg_loss``, ...) says which copy it
belongs to; ``train/rescue/update_norm_ref`` (``‖Δθ_A‖``, both steps);
``train/rescue/update_norm_mask`` (``‖Δθ_B‖`` at the scheduled rate) and
``train/rescue/update_scale`` (``s``; NaN when copy B's update is 0 and copy A's is not)
at copy B's step; ``train/rescue/update_norm`` is the realized update (0 at copy A's step).

Costs: every step's forward and backward work doubles (the log-prob passes too, and the
reference-model pass under a KL loss), the rollout-to-trainer transfer doubles, and each
step holds one copy of this rank's parameters and optimizer state (``rescue.miles.step``).
Miles' train-side ``rollout/*`` means (rewards, advantages, log-probs) average both copies;
rescue's rollout census runs before conversion and sees the batch once.

Refused, with the flag named: a before-train-step hook other than rescue's (copy A would
be trained), ``--use-dynamic-global-batch-size``, multi-LoRA, a critic, ``--indep-dp``, a
batch whose rollouts are not a multiple of ``--global-batch-size`` (at conversion), and
``--overlap-param-gather-with-optimizer-step`` (at the first step).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import Any

from rescue.errors import InputError
from rescue.mask import matched_scale
from rescue.miles.step import StepContext, measured_inner_steps, scaled_learning_rate
from rescue.outcomes import Classification, is_capped
from rescue.samples import rollout_key, rollout_record, trajectories_of

logger = logging.getLogger(__name__)

#: This convert's dotted path, as Miles' ``load_function`` loads it (the matched control).
CONVERT_PATH = "rescue.miles.matched.convert_samples_to_train_data"
#: The step-size control's convert path.
STEP_CONVERT_PATH = "rescue.miles.matched.convert_samples_to_train_data_step_control"
#: The controls by convert path: ``(arm, the copy measured first, the copy applied second)``.
MODES: dict[str, tuple[str, int, int]] = {}
#: The before-train-step hook that applies the control.
STEP_HOOK_PATH = "rescue.miles.train_step.before_train_step"
#: Added to copy B's rollout ids (Miles ships them as int64).
ROLLOUT_ID_OFFSET = 1 << 40
#: Copy index of the R = 0 reference (A) and of the mask arm (B).
REFERENCE, MASK = 0, 1
#: Position of a copy's step in a base step: measured first, applied second.
MEASURED, APPLIED = 0, 1
MODES.update(
    {
        CONVERT_PATH: ("matched", REFERENCE, MASK),
        STEP_CONVERT_PATH: ("step-control", MASK, REFERENCE),
    }
)
#: The logged norm of each copy (``train/rescue/<name>``).
NORM_KEY = {REFERENCE: "update_norm_ref", MASK: "update_norm_mask"}


def mode(args: Any) -> tuple[str, int, int] | None:
    """``(arm, first copy, second copy)`` of the run's control, None without one."""
    return MODES.get(getattr(args, "custom_convert_samples_to_train_data_path", None) or "")


def matched_enabled(args: Any) -> bool:
    """Whether the run converts with one of the two-copy layouts (the matched or the
    step-size control): two optimizer steps per base step."""
    return mode(args) is not None


def check_matched_flags(args: Any) -> None:
    """Refuse the settings under which the two copies would not pair (module docstring)."""
    path = getattr(args, "custom_convert_samples_to_train_data_path", None) or CONVERT_PATH
    hook = getattr(args, "custom_megatron_before_train_step_hook_path", None)
    if hook != STEP_HOOK_PATH:
        raise InputError(
            f"--custom-convert-samples-to-train-data-path {path} needs "
            f"--custom-megatron-before-train-step-hook-path {STEP_HOOK_PATH} (got {hook!r}): "
            "without it the R = 0 copy would be trained"
        )
    refused = {
        "--use-dynamic-global-batch-size": getattr(args, "use_dynamic_global_batch_size", False),
        "--multi-lora": getattr(args, "multi_lora", False),
        "--use-critic": getattr(args, "use_critic", False),
        "--indep-dp": getattr(args, "indep_dp", False),
    }
    on = [flag for flag, value in refused.items() if value]
    if on:
        raise InputError(
            f"--custom-convert-samples-to-train-data-path {path} cannot run with "
            f"{', '.join(on)}: the two copies of a batch must be two plain optimizer steps"
        )


def reference_copy(samples: Sequence[Any], *, reward_key: str | None = None) -> list[Any]:
    """Copy A: shallow copies of the samples with the capped trajectories unmasked."""
    out = [copy.copy(s) for s in samples]
    for s in out:
        if getattr(s, "metadata", None) is not None:
            s.metadata = dict(s.metadata)
        if getattr(s, "loss_mask", None) is not None:
            s.loss_mask = list(s.loss_mask)  # Miles' convert reassigns masked loss masks
    for trajectory in trajectories_of(out):
        record = rollout_record(trajectory, reward_key=reward_key)
        if is_capped(Classification(record.outcome, record.reason)):
            for s in trajectory:
                s.remove_sample = False
    return out


def step_chunks(rollout_ids: Sequence[Any], global_batch_size: int) -> list[list[int]]:
    """Sample positions of each base step: ``global_batch_size`` rollouts in first-appearance
    order, as Miles' DP schedule cuts them."""
    positions: dict[Any, list[int]] = {}
    for i, rid in enumerate(rollout_ids):
        if rid is None:
            raise InputError(
                f"sample {i} has neither rollout_id nor index: the matched arm pairs steps by "
                "rollout ids"
            )
        positions.setdefault(rid, []).append(i)
    order = list(positions)
    if not order or len(order) % global_batch_size:
        raise InputError(
            f"the matched arm needs the batch's rollouts to fill whole steps: {len(order)} "
            f"rollouts, --global-batch-size {global_batch_size}; set --global-batch-size to a "
            "divisor of the rollouts per step (rollout_batch_size × n_samples_per_prompt)"
        )
    return [
        [i for rid in order[k : k + global_batch_size] for i in positions[rid]]
        for k in range(0, len(order), global_batch_size)
    ]


def interleave(a: dict, b: dict, global_batch_size: int) -> dict:
    """One train-data dict: ``a``'s and ``b``'s chunks alternating, ``a``'s first (the copy
    measured), ``b``'s ids shifted (the copy applied)."""
    if set(a) != set(b):
        raise ValueError(f"the two copies' train data differ in keys: {sorted(set(a) ^ set(b))}")
    n = len(a["tokens"])
    chunks = step_chunks(a["rollout_ids"], global_batch_size)
    order = [(c, i) for chunk in chunks for c in (REFERENCE, MASK) for i in chunk]
    out: dict[str, Any] = {}
    for key, value in a.items():
        if isinstance(value, list) and len(value) == n:
            copies = (value, b[key])
            if key == "rollout_ids":
                copies = (value, [r + ROLLOUT_ID_OFFSET for r in b[key]])
            out[key] = [copies[c][i] for c, i in order]
        elif value == b[key]:
            out[key] = value
        else:
            raise ValueError(f"train data key {key!r} is not per sample and differs between copies")
    return out


def convert_samples_to_train_data(args: Any, samples: Sequence[Any]) -> dict:
    """Miles' conversion of copy A and copy B, interleaved by step (module docstring)."""
    return _convert(args, samples, first=REFERENCE)


def convert_samples_to_train_data_step_control(args: Any, samples: Sequence[Any]) -> dict:
    """The step-size control's conversion: copy B (the mask's, measured) then copy A (R =
    0's, applied at copy B's update norm), interleaved by step (module docstring)."""
    return _convert(args, samples, first=MASK)


def _convert(args: Any, samples: Sequence[Any], *, first: int) -> dict:
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data as convert
    from miles.utils.misc import load_function

    check_matched_flags(args)
    samples = list(samples)
    path = getattr(args, "custom_reward_post_process_path", None)
    reward = load_function(path) if path else None
    reward_key = getattr(args, "reward_key", None)
    reference = reference_copy(samples, reward_key=reward_key)
    a = convert(args, reference, {}, None, reward)
    b = convert(args, samples, {}, None, reward)
    unmasked = sum(
        1 for s, r in zip(samples, reference, strict=True) if s.remove_sample != r.remove_sample
    )
    logger.info(
        "%s arm: %d samples, %d unmasked in the R = 0 copy, %d rollouts",
        "matched" if first == REFERENCE else "step-control",
        len(samples),
        unmasked,
        len({rollout_key(s) for s in samples}),
    )
    measured, applied = (a, b) if first == REFERENCE else (b, a)
    return interleave(measured, applied, int(args.global_batch_size))


class MatchedUpdate:
    """Layer: measure the first copy's step, apply the second's rescaled to it (copy A then
    B for the matched control, B then A for the step-size control: module docstring)."""

    def __init__(self) -> None:
        self.reference: dict[tuple[int, int], float] = {}

    def __call__(self, ctx: StepContext, optimizer: Any, step: Any) -> Any:
        config = getattr(optimizer, "config", None)
        if getattr(config, "overlap_param_gather_with_optimizer_step", False):
            raise InputError(
                "the matched arm applies copy B's step after measuring it; "
                "--overlap-param-gather-with-optimizer-step would gather the parameters "
                "asynchronously in between: remove it"
            )
        pair, which = divmod(ctx.step_id, 2)
        _, first, second = mode(ctx.args) or ("matched", REFERENCE, MASK)
        norms: list[float] = []
        with measured_inner_steps(optimizer, norms.append):
            result = step()
        if not norms:  # Megatron skipped the step (inf/NaN gradients)
            return result
        norm = math.sqrt(sum(norms))
        ctx.metrics["matched_copy"] = which
        if which == MEASURED:
            self.reference = {(ctx.rollout_id, pair): norm}
            ctx.metrics[NORM_KEY[first]] = norm
            return result
        target = self.reference.pop((ctx.rollout_id, pair), None)
        if target is None:
            raise RuntimeError(
                f"rollout {ctx.rollout_id} step {ctx.step_id} (the applied copy) has no "
                "update norm from the step before it (the measured copy)"
            )
        scale = matched_scale(target, norm)
        ctx.metrics.update({NORM_KEY[first]: target, NORM_KEY[second]: norm, "update_scale": scale})
        with scaled_learning_rate(optimizer, scale if math.isfinite(scale) else 1.0):
            optimizer.step_with_ready_grads()
        return result


class ReferenceStepHold:
    """The scheduler's ``step`` that does nothing at copy A's steps (installed once)."""

    attribute = "_rescue_reference_hold"

    def __init__(self, scheduler: Any, context_of: Any) -> None:
        self.original = scheduler.step
        self.context_of = context_of

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.context_of().step_id % 2 == MEASURED:
            return None
        return self.original(*args, **kwargs)

    @classmethod
    def install(cls, scheduler: Any, context_of: Any) -> None:
        """Replace ``scheduler.step`` unless already replaced."""
        if scheduler is None or scheduler.__dict__.get(cls.attribute) is not None:
            return
        hold = cls(scheduler, context_of)
        scheduler.step = hold
        setattr(scheduler, cls.attribute, hold)
