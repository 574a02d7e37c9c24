# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The arms, generated from rescue/arms.py by `python -m rescue.arms > launch/arms.sh`:
# change the table there, not here (tests/test_arms.py fails when the two differ).
# Sourced by common.sh and rlvr_config.sh.

RESCUE_ARM_NAMES=(drop never-drop protect pace zero mask matched step-control drgrpo-mask survivor turn)
RESCUE_STALE_ARMS=(drop never-drop protect pace)
RESCUE_BUDGET_ARMS=(zero mask matched step-control drgrpo-mask survivor turn)
RESCUE_SWE_ARM_LIST=(drop never-drop protect pace zero mask matched step-control drgrpo-mask survivor turn)
RESCUE_RLVR_ARM_LIST=(zero mask matched step-control drgrpo-mask survivor turn)
RESCUE_AGENT_ARM_LIST=(zero mask matched step-control drgrpo-mask survivor turn)
RESCUE_SLIME_ARM_LIST=(drop never-drop protect pace)
RESCUE_STALE_ARM_WORDS="drop, never-drop, protect or pace"
RESCUE_BUDGET_ARM_WORDS="zero, mask, matched, step-control, drgrpo-mask, survivor or turn"
RESCUE_SWE_ARM_WORDS="drop, never-drop, protect, pace, zero, mask, matched, step-control, drgrpo-mask, survivor or turn"
RESCUE_RLVR_ARM_WORDS="zero, mask, matched, step-control, drgrpo-mask, survivor or turn"
RESCUE_AGENT_ARM_WORDS="zero, mask, matched, step-control, drgrpo-mask, survivor or turn"
RESCUE_SLIME_ARM_WORDS="drop, never-drop, protect or pace"

# True when ARM is a stale-handling arm / a budget-regime arm.
rescue_is_stale_arm() {
  [[ " ${RESCUE_STALE_ARMS[*]} " == *" $ARM "* ]]
}
rescue_is_budget_arm() {
  [[ " ${RESCUE_BUDGET_ARMS[*]} " == *" $ARM "* ]]
}

# rescue_arm_definition NAME: the arm's row of the table as ARM_REGIME, ARM_GATE,
# ARM_MASK (0 or 1), ARM_SCALING, ARM_BASELINE, ARM_ESTIMATOR, ARM_DRGRPO (0 or 1) and
# ARM_TAKES_A (0 or 1); status 1, nothing set, for a NAME that is not an arm.
rescue_arm_definition() {
  case $1 in
    drop) ARM_REGIME=stale ARM_GATE=drop ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    never-drop) ARM_REGIME=stale ARM_GATE=never-drop ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    protect) ARM_REGIME=stale ARM_GATE=protect ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=1 ;;
    pace) ARM_REGIME=stale ARM_GATE=pace ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    zero) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    mask) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=1 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    matched) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=1 ARM_SCALING=matched ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    step-control) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=1 ARM_SCALING=step ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    drgrpo-mask) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=1 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=group ARM_DRGRPO=1 ARM_TAKES_A=0 ;;
    survivor) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=1 ARM_SCALING=none ARM_BASELINE=survivors ARM_ESTIMATOR=group ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    turn) ARM_REGIME=budget ARM_GATE=never-drop ARM_MASK=0 ARM_SCALING=none ARM_BASELINE=all ARM_ESTIMATOR=turn ARM_DRGRPO=0 ARM_TAKES_A=0 ;;
    *) return 1 ;;
  esac
}
