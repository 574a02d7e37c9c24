"""What distinguishes the budget-regime arms in a launcher's command, derived from each
arm's entry in ``rescue.arms``: the mask's sample filter, the matched and step-size controls'
conversions, Dr. GRPO's flags, and the reward hook's estimator and baseline population. The SWE,
single-turn and text-game launchers' tests hold their commands to it."""

from __future__ import annotations

from rescue import arms

#: The budget-regime arms, in the registry's order.
BUDGET_ARMS: tuple[str, ...] = arms.names(regime="budget")
MASK = {"--rollout-sample-filter-path": ["filters.mask_truncated_zero_reward"]}
MATCHED = {
    "--custom-convert-samples-to-train-data-path": [
        "rescue.miles.matched.convert_samples_to_train_data"
    ]
}
STEP = {
    "--custom-convert-samples-to-train-data-path": [
        "rescue.miles.matched.convert_samples_to_train_data_step_control"
    ]
}
DRGRPO = {
    "--disable-grpo-std-normalization": [],
    "--custom-pg-loss-reducer-function-path": ["rescue.miles.drgrpo.pg_loss_reducer"],
}


def budget_flags(arm: str) -> dict[str, list[str]]:
    """The Miles flags of a budget arm's own: the mask's filter, the matched control's
    conversion, Dr. GRPO's flags."""
    d = arms.ARMS[arm]
    return {
        **(MASK if d.mask else {}),
        **(MATCHED if d.scaling is arms.Scaling.MATCHED else {}),
        **(STEP if d.scaling is arms.Scaling.STEP else {}),
        **(DRGRPO if d.drgrpo else {}),
    }


def budget_env(arm: str) -> dict[str, str]:
    """The reward hook's settings of a budget arm: its estimator and baseline population."""
    d = arms.ARMS[arm]
    return {"RESCUE_ESTIMATOR": d.estimator, "RESCUE_BASELINE": d.population}
