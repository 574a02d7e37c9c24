# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The budget-regime arms, one table for the single-turn launchers (rlvr.sh) and the SWE arms
# (common.sh): each arm is a setting of the mask, the baseline population, the estimator and
# Dr. GRPO; the launchers turn those settings into flags the same way for every arm.
# The arms themselves (RESCUE_BUDGET_ARMS, each arm's settings) are the table of
# rescue/arms.py, generated into arms.sh. Sourced by common.sh, after arms.sh.

# The settings of the budget arm ARM. ESTIMATOR, DRGRPO and BASELINE are the arm's own here,
# so a value other than their default is refused rather than silently replaced. Sets
# BUDGET_MASK (1: capped responses are loss-masked), BUDGET_SCALING (the arm's step size:
# none, matched (the mask's direction at R = 0's update norm) or step (R = 0's direction at
# the mask's update norm)), ESTIMATOR, DRGRPO and BASELINE.
rescue_budget_arm() {
  [[ $ESTIMATOR == group ]] ||
    rescue_die "ESTIMATOR=$ESTIMATOR: the budget-regime arms set the estimator themselves: use ARM=turn, or unset ESTIMATOR"
  [[ $DRGRPO == 0 ]] ||
    rescue_die "DRGRPO=$DRGRPO: the budget-regime arms set Dr. GRPO themselves: use ARM=drgrpo-mask, or unset DRGRPO"
  [[ $BASELINE == all ]] ||
    rescue_die "BASELINE=$BASELINE: the budget-regime arms set the baseline population themselves: use ARM=survivor, or unset BASELINE"
  if ! rescue_is_budget_arm || ! rescue_arm_definition "$ARM"; then
    rescue_die "ARM='$ARM' is not a budget-regime arm: set ARM=$RESCUE_BUDGET_ARM_WORDS"
  fi
  BUDGET_MASK=$ARM_MASK
  BUDGET_SCALING=$ARM_SCALING
  ESTIMATOR=$ARM_ESTIMATOR DRGRPO=$ARM_DRGRPO BASELINE=$ARM_BASELINE
  return 0
}

# rescue_budget_check_arm KIND: the budget arm ARM of a synchronous launcher (KIND:
# single-turn, text-game) and its own settings, after the layout is derived (matched checks
# GLOBAL_BATCH_SIZE).
rescue_budget_check_arm() {
  [[ -n $ARM ]] || rescue_die "ARM is not set: set ARM=$RESCUE_BUDGET_ARM_WORDS"
  rescue_is_budget_arm ||
    rescue_die "ARM='$ARM' is not a $1 arm: set ARM=$RESCUE_BUDGET_ARM_WORDS"
  [[ -z $A ]] || rescue_die "A=$A applies only to the SWE arm ARM=protect: unset A"
  rescue_budget_arm
  [[ $BUDGET_SCALING == none ]] || rescue_check_matched
  if [[ -n $DRGRPO_DIVISOR && $ARM != drgrpo-mask ]]; then
    rescue_die "DRGRPO_DIVISOR applies only to ARM=drgrpo-mask: unset DRGRPO_DIVISOR or set ARM=drgrpo-mask"
  fi
  if [[ -n $DRGRPO_DIVISOR ]]; then
    if ! [[ $DRGRPO_DIVISOR =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      ! awk -v d="$DRGRPO_DIVISOR" 'BEGIN { exit !(d + 0 > 0) }'; then
      rescue_die "DRGRPO_DIVISOR='$DRGRPO_DIVISOR' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty"
    fi
  fi
  return 0
}

# BUDGET_FLAGS: the Miles flags that only some budget arms have (the mask, the two controls
# of the update's size); Dr. GRPO's flags and the reward hook come from each launcher's
# shared code.
rescue_budget_flags() {
  BUDGET_FLAGS=()
  if [[ $BUDGET_MASK == 1 ]]; then
    BUDGET_FLAGS+=(--rollout-sample-filter-path filters.mask_truncated_zero_reward)
  fi
  # The matched-update control: each step taken on the R = 0 copy (measured, not applied)
  # and on the mask copy (applied, rescaled to the first's update norm), rescue.miles.matched;
  # the step-size control the other way round (the mask copy measured, the R = 0 copy
  # applied at its norm). Both need rescue's before-train-step hook, which every launcher's
  # loss flags carry.
  case $BUDGET_SCALING in
    matched) BUDGET_FLAGS+=(--custom-convert-samples-to-train-data-path
      rescue.miles.matched.convert_samples_to_train_data) ;;
    step) BUDGET_FLAGS+=(--custom-convert-samples-to-train-data-path
      rescue.miles.matched.convert_samples_to_train_data_step_control) ;;
  esac
  return 0
}

# A rollout's batch must be whole steps of GLOBAL_BATCH_SIZE under ARM=matched and
# ARM=step-control: each step is taken on two copies (the launchers call this once the
# layout is derived).
rescue_check_matched() {
  local batch=$((ROLLOUT_BATCH_SIZE * N_SAMPLES))
  if ((batch % GLOBAL_BATCH_SIZE)); then
    rescue_die "ARM=$ARM needs GLOBAL_BATCH_SIZE to divide ROLLOUT_BATCH_SIZE*N_SAMPLES=$batch (got $GLOBAL_BATCH_SIZE): set GLOBAL_BATCH_SIZE=$batch"
  fi
}

# BUDGET_ENV: the reward hook's settings of a budget arm. Every arm scores a budget failure
# R = 0 (the same raw rewards in every arm); the population is the arm's.
rescue_budget_env() {
  BUDGET_ENV=(RESCUE_TRUNCATED_REWARD=zero "RESCUE_BASELINE=$BASELINE")
}
