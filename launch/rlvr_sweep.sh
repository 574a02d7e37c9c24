#!/usr/bin/env bash
# Every (arm, seed) of the single-turn experiment as a Ray job on one cluster: `make
# rlvr-sweep ARMS='zero mask ...' SEEDS=3`. Settings and defaults: launch/rlvr_config.sh.
#
# Node 0 (NODE_RANK=0): checks every run first (arm, cap, flags), starts the Ray head with
# its run slots (RAY_START=1), submits every run with `ray job submit --no-wait` (a run waits
# PENDING until a node has a free slot, i.e. GPUS_PER_RUN free GPUs), starts each run's
# housekeeper, and writes the plan (SWEEP_DIR/plan.jsonl). Then `rescue rlvr watch` prints
# the runs queued / running / done / failed as they change, reports a failed run with its log
# (fetched into OUTPUT_DIR/RUN_NAME/ray-job.log), and exits 1 unless every run succeeded.
# A submission Ray refuses is a failed run too, its output in that log; nothing is skipped.
# Interrupted, the watch resumes with: rescue rlvr watch --plan SWEEP_DIR/plan.jsonl
# --address http://127.0.0.1:RAY_DASHBOARD_PORT. Other nodes (NODE_RANK=k, MASTER_ADDR=...)
# join the cluster with their run slots, at any time.
set -euo pipefail

RESCUE_PROG=rlvr-sweep
# shellcheck source=rlvr_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/rlvr_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"
# shellcheck source=rlvr.sh
source "$LAUNCH_DIR/rlvr.sh"

rescue_rlvr_check
rescue_rlvr_check_miles
for name in RUN_NAME WANDB_GROUP SAVE_DIR DUMP_DIR SUBMISSION_ID; do
  [[ -z ${!name:-} ]] || rescue_die "$name is set, but every run of a sweep has its own: unset $name"
done
rescue_list ARMS SWEEP_ARMS
((${#SWEEP_ARMS[@]} > 0)) || rescue_die "ARMS is empty: set ARMS to some of ${RESCUE_RLVR_ARM_LIST[*]}"
for arm in "${SWEEP_ARMS[@]}"; do
  [[ " ${RESCUE_RLVR_ARM_LIST[*]} " == *" $arm "* ]] ||
    rescue_die "ARMS='$ARMS' names '$arm', which is not a single-turn arm: set ARMS to some of ${RESCUE_RLVR_ARM_LIST[*]} (commas or spaces between them)"
  (ARM=$arm rescue_rlvr_check_arm) || exit $?
done
[[ $(printf '%s\n' "${SWEEP_ARMS[@]}" | sort | uniq -d) == "" ]] ||
  rescue_die "ARMS='$ARMS' names an arm twice: list each arm once"

# What SEEDS can decide, before anything is submitted (`rescue power`, through the judge's own
# code): refused, naming the prediction, when the judge would decide nothing on these arms
# (fewer than 3 seeds per arm) unless FORCE=1. Read-only: it runs in a dry run too.
if [[ $NODE_RANK == 0 ]]; then
  power=(--arms "$(IFS=,; echo "${SWEEP_ARMS[*]}")" --seeds "$SEEDS" --line --gate --no-progress)
  [[ $FORCE == 1 ]] && power+=(--force)
  if ! said=$(PYTHONPATH="$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$RESCUE_PY" -m rescue power "${power[@]}" 2>&1); then
    rescue_die "${said#rescue power: error: }"
  fi
  while read -r line; do rescue_note "power of this sweep's report: ${line#power: }"; done <<<"$said"
fi

[[ $NODE_RANK != 0 ]] || rescue_rlvr_cap
rescue_check_gpus
rescue_node_addr

if [[ $NODE_RANK != 0 ]]; then
  rescue_note "node $NODE_RANK ($NODE_ADDR): join the Ray cluster at $MASTER_ADDR:$RAY_PORT with $((GPUS_PER_NODE / GPUS_PER_RUN)) run slots"
  rescue_rlvr_ray_start
  exit 0
fi

STAMP=$(date +%Y%m%d-%H%M%S)
SWEEP_DIR=${SWEEP_DIR:-$OUTPUT_DIR/sweeps/rlvr-$STAMP}
PLAN=$SWEEP_DIR/plan.jsonl
ADDRESS=http://127.0.0.1:$RAY_DASHBOARD_PORT

# Every run's command first: a bad setting stops the sweep before anything is submitted.
runs=()
for arm in "${SWEEP_ARMS[@]}"; do
  for ((seed = 1; seed <= SEEDS; seed++)); do
    (ARM=$arm SEED=$seed && rescue_rlvr_check_arm && SUBMISSION_ID=rlvr-$arm-cap$CAP-seed$seed-$STAMP &&
      rescue_rlvr_submit_cmd --no-wait) || exit $?
    runs+=("$arm $seed")
  done
done
rescue_note "${#runs[@]} runs (${#SWEEP_ARMS[@]} arms x $SEEDS seeds) at CAP=$CAP on $GPUS_PER_RUN GPU(s) each; plan $PLAN"

if [[ $RAY_START == 1 ]]; then rescue_rlvr_ray_start; else rescue_rlvr_check_cluster; fi
[[ $DRY_RUN == 1 ]] || { mkdir -p "$SWEEP_DIR" && : >"$PLAN"; }

# One run: submit (no wait), its housekeeper, its plan line.
rescue_rlvr_sweep_run() {
  ARM=$1 SEED=$2
  rescue_rlvr_check_arm
  SUBMISSION_ID=rlvr-$ARM-cap$CAP-seed$SEED-$STAMP
  rescue_rlvr_submit_cmd --no-wait
  local log=$OUTPUT_DIR/$RUN_NAME/ray-job.log submitted=true output=""
  if [[ $DRY_RUN == 1 ]]; then
    rescue_run "${SUBMIT[@]}"
  else
    mkdir -p "$OUTPUT_DIR/$RUN_NAME"
    printf '+ %s\n' "$(rescue_print_cmd "${SUBMIT[@]}")" >&2
    if ! output=$("${SUBMIT[@]}" 2>&1); then
      submitted=false
      printf '%s\n' "$output" >"$log"
    fi
  fi
  [[ $submitted == true ]] && rescue_housekeeper "housekeeper-$RUN_NAME"
  [[ $DRY_RUN == 1 ]] && return 0
  "$JOB_PYTHON" -c '
import json, sys
run, sid, log, submitted, error = sys.argv[1:]
print(json.dumps({"run": run, "submission_id": sid, "log": log, "submitted": submitted == "true", "error": error}))
' "$RUN_NAME" "$SUBMISSION_ID" "$log" "$submitted" "$output" >>"$PLAN"
}

for run in "${runs[@]}"; do
  read -r arm seed <<<"$run"
  (rescue_rlvr_sweep_run "$arm" "$seed") || exit $?
done
if [[ $SWEEP_WATCH == 0 ]]; then
  rescue_note "submitted; watch with: rescue rlvr watch --plan $PLAN --address $ADDRESS"
  exit 0
fi
rescue_cli rlvr watch --plan "$PLAN" --address "$ADDRESS" --poll-s "$SWEEP_POLL_S"
