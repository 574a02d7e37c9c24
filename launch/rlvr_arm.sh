#!/usr/bin/env bash
# One single-turn arm of the budget-regime experiment on Miles: `make rlvr-arm` with
# ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn [SEED=] [CAP=]. Settings and defaults:
# launch/rlvr_config.sh (and config.sh for the shared ones).
#
# Node 0 (NODE_RANK=0): checks, the cap (CAP, else CAP_FILE), Ray head with the run slots
# (RAY_START=1; 0 submits to the cluster running here), the housekeeper (dump window,
# checkpoint retention) detached from this shell, and Miles' train.py --colocate as a Ray
# job on GPUS_PER_RUN GPUs; the command follows the job's log until it ends. Other nodes
# join the cluster at MASTER_ADDR with their run slots.
set -euo pipefail

RESCUE_PROG=rlvr-arm
# shellcheck source=rlvr_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/rlvr_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"
# shellcheck source=rlvr.sh
source "$LAUNCH_DIR/rlvr.sh"

rescue_rlvr_check
rescue_rlvr_check_arm
rescue_rlvr_check_miles
[[ $NODE_RANK != 0 ]] || rescue_rlvr_cap
rescue_check_gpus
rescue_node_addr

if [[ $NODE_RANK != 0 ]]; then
  rescue_note "node $NODE_RANK ($NODE_ADDR): join the Ray cluster at $MASTER_ADDR:$RAY_PORT with $((GPUS_PER_NODE / GPUS_PER_RUN)) run slots"
  rescue_rlvr_ray_start
  exit 0
fi

rescue_rlvr_submit_cmd ""
rescue_note "$RUN_NAME: ARM=$ARM SEED=$SEED CAP=$CAP on $GPUS_PER_RUN GPU(s), data $PROMPT_DATA"
if [[ $RAY_START == 1 ]]; then rescue_rlvr_ray_start; else rescue_rlvr_check_cluster; fi
if [[ $DRY_RUN != 1 ]]; then mkdir -p "$OUTPUT_DIR/$RUN_NAME"; fi
rescue_housekeeper "housekeeper-$RUN_NAME"
rescue_submit_and_wait "$SUBMISSION_ID" "${SUBMIT[@]}"
