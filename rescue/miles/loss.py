"""Miles' policy loss, with rescue's per-token advantages added and their moments recorded.

Target of ``--loss-type custom_loss --custom-loss-function-path rescue.miles.loss.policy_loss``.

Specification
-------------
``policy_loss(args, batch, logits, sum_of_sample_mean)`` (Miles' loss protocol):

1. When the micro-batch carries the per-token channel (``batch["opd_reverse_kl"]``, written
   by the reward hook under ``RESCUE_ESTIMATOR=turn``), each sample's advantage becomes
   ``batch["advantages"][i] + channel[i]``: Miles' scalar part (0 under the turn estimator)
   plus the per-token advantages. Both are CP-local ``[C_i]`` tensors (the trainer slices
   the channel like the log-probs); a shape mismatch is an error naming the sample. The
   channel is then removed from the batch, so Miles does not log it as OPD.
2. It records, on the tokens the local loss mask trains, the count, sum and sum of squares
   of those advantages (``rescue.miles.train_step`` reduces them over DP x CP after the
   optimizer step and logs ``train/rescue/adv_mean`` and ``train/rescue/adv_var``). A
   micro-batch recomputed by ``--recompute-loss-function`` is recorded once.
3. It returns Miles' own ``policy_loss_function`` on that batch: PPO clipping, TIS, the
   pg-loss reducer (``--custom-pg-loss-reducer-function-path``), KL and entropy terms are
   Miles', unchanged. Only the policy-gradient term sees the per-token advantages.

Refused at the first call, naming the flags: ``--use-opd`` (Miles would already have
*subtracted* the channel as a reverse KL), and a missing before-train-step hook
(``--custom-megatron-before-train-step-hook-path rescue.miles.train_step.before_train_step``),
without which the recorded moments are never logged.

Why a custom loss and not ``--use-opd --opd-type sglang``: every run needs a train-side
place that sees exactly what is trained (after CP slicing, micro-batching and the DP split)
to log the advantage moments, and the loss is that place; with it, ``--use-opd`` stays
free of a second meaning and ``--skip-actor-forward-only`` is not ruled out by OPD. The
cost: Miles' own ``rollout/advantages`` shows only the scalar part (0 under the turn
estimator); ``train/rescue/adv_mean`` shows what was trained.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rescue.errors import InputError

#: This function's dotted path, as Miles' ``load_function`` loads it.
LOSS_PATH = "rescue.miles.loss.policy_loss"
#: The hook that logs what this loss records.
STEP_HOOK_PATH = "rescue.miles.train_step.before_train_step"
#: The per-token channel field.
CHANNEL = "opd_reverse_kl"


def check_loss_flags(args: Any) -> None:
    """Refuse ``--use-opd`` and a missing before-train-step hook (module docstring)."""
    if getattr(args, "use_opd", False):
        raise InputError(
            f"--custom-loss-function-path {LOSS_PATH} with --use-opd: rescue's per-token "
            "advantages ride the OPD field and Miles would subtract them as a reverse KL; "
            "remove --use-opd"
        )
    hook = getattr(args, "custom_megatron_before_train_step_hook_path", None)
    if hook != STEP_HOOK_PATH:
        raise InputError(
            f"--custom-loss-function-path {LOSS_PATH} needs "
            f"--custom-megatron-before-train-step-hook-path {STEP_HOOK_PATH} (got {hook!r}): "
            "it logs the advantage moments this loss records"
        )


def trained_advantages(batch: dict) -> list:
    """Each sample's advantages with the channel added (the batch's own list if none)."""
    advantages = batch["advantages"]
    channel = batch.get(CHANNEL)
    if channel is None:
        return advantages
    out = []
    for i, (a, c) in enumerate(zip(advantages, channel, strict=True)):
        c = c.to(device=a.device, dtype=a.dtype)
        if c.shape != a.shape:
            raise InputError(
                f"sample {i} of the micro-batch: per-token advantages {CHANNEL} have shape "
                f"{tuple(c.shape)}, Miles' advantages {tuple(a.shape)} (CP-local shapes must agree)"
            )
        out.append(a + c)
    return out


def policy_loss(
    args: Any,
    batch: dict,
    logits: Any,
    sum_of_sample_mean: Callable[[Any], Any],
) -> tuple[Any, dict[str, Any]]:
    """Miles' ``policy_loss_function`` on the advantages of the module docstring."""
    from miles.backends.training_utils.cp_utils import get_local_response_loss_masks
    from miles.backends.training_utils.loss_hub import losses

    from rescue.miles.train_step import MOMENTS

    check_loss_flags(args)
    advantages = trained_advantages(batch)
    masks = get_local_response_loss_masks(
        batch["total_lengths"],
        batch["response_lengths"],
        batch["loss_masks"],
        args.qkv_format,
        batch.get("max_seq_lens"),
    )
    MOMENTS.record(batch["advantages"], advantages, masks)
    if batch.get(CHANNEL) is not None:
        batch = {**batch, "advantages": advantages, CHANNEL: None}
    return losses.policy_loss_function(args, batch, logits, sum_of_sample_mean)
