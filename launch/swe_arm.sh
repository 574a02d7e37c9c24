#!/usr/bin/env bash
# One SWE arm of rescue on Miles: `launch/swe_arm.sh` with ARM=drop|never-drop|protect|pace or a
# budget-regime arm ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn (or launch/drop.sh, launch/never_drop.sh, launch/protect.sh, launch/pace.sh). Every variable and its
# default is documented in launch/config.sh.
#
# Node 0 (NODE_RANK=0): checks, pre-flight, Ray head, waits for the other nodes, submits
# Miles' train_async.py as a Ray job, and starts the housekeeper (dump window, checkpoint
# retention) detached from this shell. Other nodes: checks, then join the Ray cluster at
# MASTER_ADDR. On every node, what an earlier run of this launcher left running there is
# stopped first (RAY_STOP=1; recorded process ids only).
set -euo pipefail

RESCUE_PROG=swe-arm
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_arm
rescue_check_settings
rescue_check_miles train_async.py
rescue_check_gpus
rescue_derive_names

rescue_reap() {
  [[ $REAP == 1 ]] || return 0
  rescue_cli swe reap
}

if [[ $NODE_RANK != 0 ]]; then
  rescue_note "node $NODE_RANK of $NNODES ($NODE_ADDR): join the Ray cluster at $MASTER_ADDR:$RAY_PORT"
  rescue_reap
  rescue_ray_start
  exit 0
fi

rescue_arm_flags
rescue_shared_flags
rescue_runtime_env
rescue_env_report
SHARED_FLAGS+=(--env-report "$ENV_REPORT_JSON") # the rescue settings in the wandb config
SUBMISSION_ID=${SUBMISSION_ID:-$RUN_NAME-$(date +%Y%m%d-%H%M%S)}

rescue_note "$RUN_NAME: ARM=$ARM${A:+ A=$A}${PACE_WINDOW:+ PACE_WINDOW=$PACE_WINDOW} SEED=$SEED STALENESS=$STALENESS ESTIMATOR=$ESTIMATOR DRGRPO=$DRGRPO on $NNODES node(s)"
rescue_note_sandbox
rescue_note_watchdog
[[ $ARM != pace ]] || rescue_note "pace: a group in flight past PACE_STRAGGLER_S=$PACE_STRAGGLER_S s is abandoned without a result (0: never)"
rescue_check_versions
rescue_check_save_dir "${ARM_FLAGS[@]}" "${SHARED_FLAGS[@]}"
if [[ $PREFLIGHT == 1 ]]; then
  export DUMP_DIR SAVE_DIR # where pre-flight sizes the disk
  rescue_run "$LAUNCH_DIR/preflight.sh"
fi
rescue_reap
rescue_ray_start
rescue_ray_wait
if [[ $DRY_RUN != 1 ]]; then mkdir -p "$OUTPUT_DIR/$RUN_NAME"; fi
rescue_housekeeper housekeeper
rescue_submit_and_wait "$SUBMISSION_ID" ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" \
  --submission-id "$SUBMISSION_ID" --runtime-env-json "$RUNTIME_ENV_JSON" \
  -- "$JOB_PYTHON" "$MILES_DIR/train_async.py" "${ARM_FLAGS[@]}" "${SHARED_FLAGS[@]}"
