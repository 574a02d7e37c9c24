"""slime's custom advantage function for rescue's per-token advantages.

Target of ``--custom-advantage-function-path rescue.slime.advantages.turn_advantages``
(slime has this hook; Miles does not, which is why Miles uses ``rescue.miles.loss``).

Specification
-------------
slime calls ``turn_advantages(args, rollout_data)`` inside
``compute_advantages_and_returns`` after the KL, on the last pipeline stage, and reads
``rollout_data["advantages"]`` and ``["returns"]`` back. This function sets both to
slime's own GRPO returns (``ones_like(kl[i]) * rewards[i]``, ``slime.utils.ppo_utils``)
plus, when the reward hook wrote them under ``RESCUE_ESTIMATOR=turn``, the per-token
advantages it carried in ``teacher_log_probs`` (CP-local ``[C_i]``, sliced by slime's actor
like the log-probs). Under ``RESCUE_ESTIMATOR=group`` (no channel) it is exactly slime's
grpo/gspo path. Refused: ``--use-opd`` (it reads ``teacher_log_probs`` as a teacher), an
estimator other than grpo/gspo, and ``RESCUE_ESTIMATOR=turn`` with no channel in the rollout
data (a custom ``--custom-convert-samples-to-train-data-path`` that did not carry it: every
advantage would be 0; ``rescue.slime.checks`` refuses such a converter at start already).
"""

from __future__ import annotations

from typing import Any

from rescue.errors import InputError
from rescue.turn_reward import estimator_from_env

#: This function's dotted path.
ADVANTAGE_PATH = "rescue.slime.advantages.turn_advantages"
#: The per-token channel in slime's rollout data.
CHANNEL = "teacher_log_probs"


def turn_advantages(args: Any, rollout_data: dict) -> None:
    """slime's custom advantage hook (module docstring)."""
    import torch
    from slime.utils.ppo_utils import get_grpo_returns

    if getattr(args, "use_opd", False):
        raise InputError(
            f"--custom-advantage-function-path {ADVANTAGE_PATH} with --use-opd: rescue's "
            f"per-token advantages ride {CHANNEL}, which OPD reads as teacher log-probs; "
            "remove --use-opd"
        )
    if args.advantage_estimator not in ("grpo", "gspo"):
        raise InputError(
            f"--custom-advantage-function-path {ADVANTAGE_PATH} with --advantage-estimator "
            f"{args.advantage_estimator}; allowed: grpo, gspo"
        )
    kl = rollout_data["kl"]
    rewards = torch.tensor(rollout_data["rewards"], dtype=torch.float32, device=kl[0].device)
    advantages = get_grpo_returns(rewards, kl)
    channel = rollout_data.get(CHANNEL)
    if channel is None and estimator_from_env() == "turn":
        raise InputError(
            f"RESCUE_ESTIMATOR=turn but slime's rollout data has no {CHANNEL}: the reward hook's "
            "per-token advantages did not reach the trainer (a --custom-convert-samples-to-"
            "train-data-path that drops the field?), so every advantage would be 0"
        )
    if channel is not None:
        for i, (a, c) in enumerate(zip(advantages, channel, strict=True)):
            c = c.to(device=a.device, dtype=a.dtype)
            if c.shape != a.shape:
                raise InputError(
                    f"sample {i}: per-token advantages {CHANNEL} have shape {tuple(c.shape)}, "
                    f"slime's advantages {tuple(a.shape)} (CP-local shapes must agree)"
                )
            advantages[i] = a + c
    rollout_data["advantages"] = advantages
    rollout_data["returns"] = list(advantages)
