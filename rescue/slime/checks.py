"""What a slime run is refused at start: the settings that would fail hours later, or never.

Specification
-------------
``check_slime_run(args, gate)`` runs when the rollout function builds its drain (before
any group is generated) and raises ``rescue.errors.InputError`` with one line naming the
setting for each of:

- ``RESCUE_ARM=drop`` (the default) or ``protect`` without ``RESCUE_MAX_STALENESS``: slime
  has no staleness limit, so no group would ever be stale and the arm would be slime's own
  behaviour under another name (never-drop needs no limit; pace needs one, below);
- ``RESCUE_ARM=pace`` without ``RESCUE_MAX_STALENESS`` or with a ``RESCUE_PACE_WINDOW``
  outside ``B..(K + 1)·B`` (``rescue.pace.PaceSettings``);
- an unknown ``RESCUE_ESTIMATOR``, ``RESCUE_BASELINE``, ``RESCUE_KAPPA`` or
  ``RESCUE_TURN_TOKENS`` (the reward hook would stop at the first step);
- ``protect`` or ``RESCUE_ESTIMATOR=turn`` without ``--custom-reward-post-process-path
  rescue.reward.post_process_rewards`` (the weights would silently be 1; the
  per-token advantages would never be computed);
- ``protect`` or ``turn`` with ``--normalize-advantages`` (it re-centers and rescales the
  advantages across the batch, undoing the weights and the per-token baseline), or with
  an ``--advantage-estimator`` other than grpo/gspo;
- ``turn`` without ``--custom-advantage-function-path
  rescue.slime.advantages.turn_advantages``, or with ``--use-opd``
  (``rescue.turn_reward.check_turn_supported``);
- ``turn`` with ``--custom-convert-samples-to-train-data-path``: slime's own conversion
  carries the per-token channel (``teacher_log_probs``) to the trainer, a custom one may
  not, and then every advantage would be 0;
- ``turn`` without ``--custom-generate-function-path rescue.slime.generate.generate``:
  slime aborts the requests in flight at every weight update and resumes them, and
  without the record of the calls a resumed reply counts as two turns, which stops the run
  at the first update.

Without the generate wrapper the other arms only warn (``start_warnings`` returns the lines):
a reply aborted before its first token then counts for staleness, so a group can look one
version staler than its tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rescue.errors import InputError
from rescue.gate import ENV_ARM, Arm, Gate
from rescue.pace import PaceSettings
from rescue.reward import WEIGHTED_ESTIMATORS, baseline_from_env
from rescue.slime.generate import GENERATE_PATH, generate_path_from_env
from rescue.turn_reward import (
    ENV_ESTIMATOR,
    check_turn_supported,
    estimator_from_env,
    kappa_from_env,
    turn_tokens_from_env,
)

#: The reward hook protect and the turn estimator need (the core's; Miles' path to the same
#: function, which slime runs started before it had one recorded, is accepted too).
REWARD_PATH = "rescue.reward.post_process_rewards"
REWARD_PATHS = (REWARD_PATH, "rescue.miles.reward.post_process_rewards")
#: Environment variable holding the staleness limit K (slime has no flag for it).
ENV_MAX_STALENESS = "RESCUE_MAX_STALENESS"


def check_slime_run(
    args: Any, gate: Gate, env: Mapping[str, str] | None = None
) -> PaceSettings | None:
    """Every refusal of the module docstring; the pace settings under ``pace``."""
    env = os.environ if env is None else env
    estimator = estimator_from_env(env)
    baseline_from_env(env)
    kappa_from_env(env)
    turn_tokens_from_env(env)
    arm, k = gate.arm, gate.max_staleness
    if arm in (Arm.DROP, Arm.PROTECT) and k is None:
        raise InputError(
            f"{ENV_ARM}={arm.value} needs {ENV_MAX_STALENESS}=K: slime has no staleness limit, "
            f"so no group would ever be stale (for slime's own behaviour set {ENV_ARM}=never-drop)"
        )
    pace = None
    if arm is Arm.PACE:
        if k is None:
            raise InputError(
                f"{ENV_ARM}=pace needs {ENV_MAX_STALENESS}=K: the staleness it keeps by waiting"
            )
        pace = PaceSettings.from_env(env, max_staleness=k, batch=int(args.rollout_batch_size))
    turn = estimator == "turn"
    weighted = arm is Arm.PROTECT
    what = f"{ENV_ARM}=protect" if weighted else f"{ENV_ESTIMATOR}=turn"
    if weighted or turn:
        path = getattr(args, "custom_reward_post_process_path", None)
        if path not in REWARD_PATHS:
            raise InputError(
                f"{what} needs --custom-reward-post-process-path {REWARD_PATH} (got {path}): "
                + (
                    "without it every protected group trains with weight 1"
                    if weighted
                    else "it computes the per-token advantages"
                )
            )
        if getattr(args, "normalize_advantages", False):
            raise InputError(
                f"{what} with --normalize-advantages: it re-centers and rescales the "
                "advantages across the batch, undoing the weights and the per-token baseline; "
                "remove the flag"
            )
        estimator_flag = getattr(args, "advantage_estimator", None)
        if estimator_flag not in WEIGHTED_ESTIMATORS:
            raise InputError(
                f"{what} with --advantage-estimator {estimator_flag}; allowed: "
                f"{', '.join(sorted(WEIGHTED_ESTIMATORS))}"
            )
    if turn:
        check_turn_supported(args, slime=True)
        converter = getattr(args, "custom_convert_samples_to_train_data_path", None)
        if converter:
            raise InputError(
                f"{ENV_ESTIMATOR}=turn with --custom-convert-samples-to-train-data-path "
                f"{converter}: the per-token advantages ride teacher_log_probs, which only "
                "slime's own conversion is known to carry to the trainer (else every advantage "
                "is 0); remove the flag"
            )
        generate = getattr(args, "custom_generate_function_path", None)
        if generate != GENERATE_PATH:
            raise InputError(
                f"{ENV_ESTIMATOR}=turn needs --custom-generate-function-path {GENERATE_PATH} "
                f"(got {generate}; the function to wrap goes in RESCUE_GENERATE_FUNCTION): "
                "slime aborts and resumes the requests in flight at every weight update, and "
                "without the record of the calls a resumed reply counts as two turns"
            )
    if getattr(args, "custom_generate_function_path", None) == GENERATE_PATH:
        generate_path_from_env(env)
    return pace


def start_warnings(args: Any) -> list[str]:
    """The lines logged at start for settings that are allowed but cost accuracy."""
    generate = getattr(args, "custom_generate_function_path", None)
    if generate == GENERATE_PATH:
        return []
    return [
        f"--custom-generate-function-path is {generate}, not {GENERATE_PATH}: a reply slime "
        "aborts at a weight update before its first token still counts for staleness, so its "
        "group can look one version staler than its tokens (set the wrapper, and the function "
        "to wrap in RESCUE_GENERATE_FUNCTION)"
    ]
