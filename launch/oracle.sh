#!/usr/bin/env bash
# The gradient oracle on one node: `make oracle CKPT=... DUMPS=...` (every variable and its
# default: launch/config.sh).
#
# 1. `rescue oracle build DUMPS --out ORACLE_DIR`: per dumped step of a never-drop recording
#    run, the replay input of each arm (all groups, stale-excluded, the stale groups alone,
#    protected with 1/a) and the manifest;
# 2. Ray head, then `ray job submit` of Miles' train.py replaying them at CKPT with no
#    optimizer (--load-debug-rollout-data, --debug-disable-optimizer), while rescue's
#    before-train-step hook captures each arm's reduced gradient (RESCUE_ORACLE_DIR);
# 3. `rescue oracle compare ORACLE_DIR`: cosines and norm ratios per step and in total
#    (ORACLE_DIR/compare.md and compare.json).
set -euo pipefail

RESCUE_PROG=oracle
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_values
rescue_check_oracle
rescue_check_miles train.py
rescue_check_gpus
rescue_oracle_rollouts
rescue_oracle_flags

env=(
  "PYTHONPATH=$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
  PYTHONUNBUFFERED=1
  CUDA_DEVICE_MAX_CONNECTIONS=1
  "MASTER_ADDR=$MASTER_ADDR"
  "no_proxy=127.0.0.1,$MASTER_ADDR"
  "RESCUE_ORACLE_DIR=$ORACLE_DIR"
  "RESCUE_ORACLE_STREAM=$ORACLE_STREAM"
  "RESCUE_SEED=$SEED"
  "RESCUE_BASELINE=$BASELINE"
  "RESCUE_ESTIMATOR=$ESTIMATOR"
)
[[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
rescue_offpolicy_env
env+=("${OFFPOLICY_ENV[@]}")
rescue_env_json "${env[@]}"

rescue_note "oracle: $ORACLE_ROLLOUTS replay rollouts (dumped steps x arms $ORACLE_ARMS, a=$ORACLE_A) at $CKPT"
build=(oracle build "$DUMPS" --out "$ORACLE_DIR" --arms "$ORACLE_ARMS" --a "$ORACLE_A")
[[ $ORACLE_FORCE == 1 ]] && build+=(--force)
rescue_cli "${build[@]}"
if [[ $DRY_RUN != 1 ]]; then
  built=$("$RESCUE_PY" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["entries"]))' \
    "$ORACLE_DIR/oracle.json")
  [[ $built == "$ORACLE_ROLLOUTS" ]] ||
    rescue_die "ORACLE_DIR=$ORACLE_DIR holds $built replay rollouts, expected $ORACLE_ROLLOUTS: set ORACLE_FORCE=1 to rebuild it"
fi
rescue_ray_start
# the comparison reads what the job wrote: it starts once Ray reports the job succeeded
SUBMISSION_ID=${SUBMISSION_ID:-oracle-$(date +%Y%m%d-%H%M%S)}
rescue_submit_and_wait "$SUBMISSION_ID" ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" \
  --submission-id "$SUBMISSION_ID" --runtime-env-json "$RUNTIME_ENV_JSON" \
  -- "$JOB_PYTHON" "$MILES_DIR/train.py" "${ORACLE_FLAGS[@]}"
rescue_cli oracle compare "$ORACLE_DIR"
