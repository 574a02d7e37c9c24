# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The single-turn arms on Miles' synchronous colocated trainer (train.py --colocate): checks,
# the cap, names, the flags of an arm and the `ray job submit` of one run. Sourced by the
# rlvr launchers after rlvr_config.sh (which sources config.sh) and common.sh.

RESCUE_RLVR_POSITIVE=(TURN_TOKENS GPUS_PER_RUN JOB_START_TIMEOUT_S SEEDS SWEEP_POLL_S CAL_PROMPTS
  CAL_N CAL_PORT CAL_WAIT_S CAL_CONCURRENCY)
RESCUE_RLVR_SWITCHES=(RAY_START SWEEP_WATCH FORCE)
RESCUE_RLVR_GRADERS=(math deepscaler dapo)
RESCUE_RLVR_DATASETS=(gsm8k math)
# Flags of EXTRA_ARGS that would select groups or samples by their outcome or their length
# (the dynamic filter, over-sampling and sample-level submission keep the first groups to
# finish, partial rollout recycles the unfinished ones): refused in every arm.
RESCUE_RLVR_EXCLUSIONS=(--dynamic-sampling-filter-path --over-sampling-batch-size
  --rollout-submission-granularity --partial-rollout)
# The run slots: one per GPUS_PER_RUN GPUs of a node, one per run.
RESCUE_RUN_SLOT=rescue_run_slot

# Every setting the single-turn launchers read (the arm excepted): one line naming the first
# bad one.
rescue_rlvr_check() {
  rescue_check_numbers
  local name value
  for name in "${RESCUE_RLVR_POSITIVE[@]}"; do
    value=${!name}
    [[ $value =~ ^[1-9][0-9]*$ ]] || rescue_die "$name='$value' is not a positive integer: set $name=N"
  done
  for name in "${RESCUE_RLVR_SWITCHES[@]}"; do
    value=${!name}
    [[ $value == 0 || $value == 1 ]] || rescue_die "$name='$value': set $name=0 or $name=1"
  done
  if [[ -n $CAP && ! $CAP =~ ^[1-9][0-9]*$ ]]; then
    rescue_die "CAP='$CAP' is not a positive integer: set CAP=N, or unset it to read CAP_FILE"
  fi
  [[ " ${RESCUE_RLVR_GRADERS[*]} " == *" $RM_TYPE "* ]] ||
    rescue_die "RM_TYPE='$RM_TYPE' is not a grader of the single-turn arms: set RM_TYPE=math, deepscaler or dapo"
  [[ " ${RESCUE_RLVR_DATASETS[*]} " == *" $RLVR_DATASET "* ]] ||
    rescue_die "RLVR_DATASET='$RLVR_DATASET' is not a dataset: set RLVR_DATASET=gsm8k or RLVR_DATASET=math"
  for name in CAL_LOW CAL_HIGH; do
    value=${!name}
    if ! [[ $value =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || ! awk -v v="$value" 'BEGIN { exit !(v + 0 <= 1) }'; then
      rescue_die "$name='$value' is not a rate in [0, 1]: set $name to a number between 0 and 1"
    fi
  done
  awk -v lo="$CAL_LOW" -v hi="$CAL_HIGH" 'BEGIN { exit !(lo + 0 <= hi + 0) }' ||
    rescue_die "CAL_LOW=$CAL_LOW is above CAL_HIGH=$CAL_HIGH: set CAL_LOW <= CAL_HIGH"
  ((GPUS_PER_RUN <= GPUS_PER_NODE)) ||
    rescue_die "GPUS_PER_RUN=$GPUS_PER_RUN exceeds GPUS_PER_NODE=$GPUS_PER_NODE: a run is placed on one node"
  ((GPUS_PER_RUN % (TP * CP) == 0)) ||
    rescue_die "TP=$TP x CP=$CP = $((TP * CP)) does not divide GPUS_PER_RUN=$GPUS_PER_RUN: set TP, CP or GPUS_PER_RUN"
  rescue_check_offpolicy generate none tis tis-sc
  GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-$((ROLLOUT_BATCH_SIZE * N_SAMPLES))}
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  local word flag
  for word in "${extra[@]}"; do
    for flag in "${RESCUE_RLVR_EXCLUSIONS[@]}"; do
      [[ $word == "$flag" || $word == "$flag="* ]] &&
        rescue_die "EXTRA_ARGS has $flag, an outcome-dependent exclusion no single-turn arm may have: remove it from EXTRA_ARGS"
    done
  done
  return 0
}

# The single-turn arm ARM and its settings (budget.sh).
rescue_rlvr_check_arm() {
  rescue_budget_check_arm single-turn
}

# CAP: as set, else from CAP_FILE (checked against HF_CHECKPOINT and PROMPT_DATA).
rescue_rlvr_cap() {
  if [[ -z $CAP ]]; then
    CAP=$("$RESCUE_PY" -m rescue rlvr cap "$CAP_FILE" --model "$HF_CHECKPOINT" --data "$PROMPT_DATA" 2>&1) ||
      rescue_die "${CAP#rescue rlvr: error: }"
  fi
  ((CAP < MAX_TOKENS_PER_GPU)) ||
    rescue_die "CAP=$CAP is not below MAX_TOKENS_PER_GPU=$MAX_TOKENS_PER_GPU: one response would not fit a micro-batch; raise MAX_TOKENS_PER_GPU"
  return 0
}

rescue_rlvr_check_miles() {
  rescue_not_slime MILES_DIR
  [[ -f $MILES_DIR/train.py ]] ||
    rescue_die "no Miles checkout at MILES_DIR=$MILES_DIR (train.py missing): set MILES_DIR to a Miles checkout with train.py"
}

# RUN_NAME, WANDB_GROUP, SAVE_DIR, DUMP_DIR, SUBMISSION_ID (each unless set) and WANDB_TAGS:
# rlvr-ARM-capCAP[-OFFPOLICY]-seedSEED (OFFPOLICY named unless none: another cohort).
rescue_rlvr_names() {
  local setting=""
  [[ $OFFPOLICY == none ]] || setting="-$OFFPOLICY"
  RUN_NAME=${RUN_NAME:-rlvr-$ARM-cap$CAP$setting-seed$SEED}
  WANDB_GROUP=${WANDB_GROUP:-$RUN_NAME}
  SAVE_DIR=${SAVE_DIR:-$OUTPUT_DIR/$RUN_NAME/checkpoints}
  DUMP_DIR=${DUMP_DIR:-$OUTPUT_DIR/$RUN_NAME/dumps}
  SUBMISSION_ID=${SUBMISSION_ID:-$RUN_NAME-$(date +%Y%m%d-%H%M%S)}
  WANDB_TAGS="arm:$ARM,seed:$SEED,cap:$CAP"
  [[ $OFFPOLICY == none ]] || WANDB_TAGS+=",offpolicy:$OFFPOLICY"
}

# Ray on node 0 (head) or another node (joins MASTER_ADDR), with the run slots; the head gets
# Ray's job-start timeout, so queued runs wait for a slot instead of failing.
rescue_rlvr_ray_start() {
  RAY_START_EXTRA=(--resources "{\"$RESCUE_RUN_SLOT\": $((GPUS_PER_NODE / GPUS_PER_RUN))}")
  RAY_START_ENV=()
  [[ $NODE_RANK == 0 ]] && RAY_START_ENV=("RAY_JOB_START_TIMEOUT_SECONDS=$JOB_START_TIMEOUT_S")
  rescue_ray_start
}

# With RAY_START=0, the running cluster must have the run slots (else every run would wait
# for ever); checked before anything is submitted.
rescue_rlvr_check_cluster() {
  [[ $DRY_RUN == 1 ]] && return 0
  local slots
  slots=$("$JOB_PYTHON" -c 'import ray, sys; ray.init(address="auto", logging_level="ERROR"); print(int(ray.cluster_resources().get(sys.argv[1], 0)))' "$RESCUE_RUN_SLOT" 2>/dev/null) ||
    rescue_die "no Ray cluster answers on this node (RAY_START=0): start one with RAY_START=1"
  ((slots > 0)) ||
    rescue_die "the Ray cluster has no $RESCUE_RUN_SLOT resource (it was not started by rlvr-arm or rlvr-sweep): restart it with RAY_START=1"
}

# ── What the single-turn and text-game runs share: Miles' synchronous colocated trainer ──

# SYNC_MODEL_FLAGS: the model (Miles' model script) and its checkpoints, a run's first flags.
rescue_sync_model_flags() {
  local model_args
  model_args=$(rescue_model_args)
  local -a model=()
  read -ra model <<<"$model_args"
  SYNC_MODEL_FLAGS=(
    "${model[@]}"
    --hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD"
    --load "$SAVE_DIR" --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL"
  )
}

# SYNC_RUN_FLAGS: the optimizer, the census and its wandb run, and one run's layout, after
# the launcher's data flags.
rescue_sync_run_flags() {
  SYNC_RUN_FLAGS=(
    --optimizer adam --lr "$LR" --lr-decay-style constant --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.98
    # the census
    --custom-rollout-log-function-path rescue.miles.log.log_rollout
    --use-wandb --wandb-mode "$WANDB_MODE" --wandb-project "$WANDB_PROJECT"
    --wandb-group "$WANDB_GROUP" --disable-wandb-random-suffix
    --wandb-dir "$OUTPUT_DIR/$RUN_NAME/wandb"
    # one run: training and SGLang colocated on GPUS_PER_RUN GPUs
    --colocate --actor-num-nodes 1 --actor-num-gpus-per-node "$GPUS_PER_RUN"
    --num-gpus-per-node "$GPUS_PER_RUN" --rollout-num-gpus-per-engine 1
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --tensor-model-parallel-size "$TP" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size "$CP" --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
}

# SYNC_ARM_FLAGS: the flags that follow: GRPO, the estimator, Dr. GRPO, the off-policy
# correction ($1: none, tis or tis-sc) and the train-side logging contract, as in the SWE
# arms; the reward hook (under ESTIMATOR=turn the loss flags carry it), which scores a
# capped response 0 in every arm; the budget arm's own flags; the dumps; EXTRA_ARGS.
rescue_sync_arm_flags() {
  rescue_loss_flags "$1"
  SYNC_ARM_FLAGS=("${LOSS_FLAGS[@]}")
  [[ $1 != tis-sc ]] ||
    SYNC_ARM_FLAGS+=(--custom-generate-function-path rescue.miles.topk.generate)
  [[ $ESTIMATOR == turn ]] ||
    SYNC_ARM_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  rescue_budget_flags
  SYNC_ARM_FLAGS+=("${BUDGET_FLAGS[@]}")
  if [[ $DUMP_STEPS != 0 ]]; then
    SYNC_ARM_FLAGS+=(--save-debug-rollout-data "$DUMP_DIR/rollout_data/{rollout_id}.pt")
  fi
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  SYNC_ARM_FLAGS+=("${extra[@]}")
}

# SYNC_ENV: the runtime-env settings every synchronous run has: rescue on the path, the
# coins' seed, the tags, the estimator and the reward hook's settings of the budget arm.
rescue_sync_env() {
  SYNC_ENV=(
    "PYTHONPATH=$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
    PYTHONUNBUFFERED=1
    CUDA_DEVICE_MAX_CONNECTIONS=1
    "RESCUE_SEED=$SEED"
    "WANDB_TAGS=$WANDB_TAGS"
    "RESCUE_ESTIMATOR=$ESTIMATOR"
  )
  rescue_budget_env
  SYNC_ENV+=("${BUDGET_ENV[@]}")
}

# RLVR_FLAGS: train.py's flags of the arm; identical in every arm except the arm's own
# (the mask filter, Dr. GRPO's two flags, the matched control) and the names.
rescue_rlvr_flags() {
  rescue_sync_model_flags
  rescue_sync_run_flags
  rescue_sync_arm_flags "$OFFPOLICY"
  RLVR_FLAGS=(
    "${SYNC_MODEL_FLAGS[@]}"
    # data: chat prompts, the grader, n responses per prompt, ROLLOUT_BATCH_SIZE prompts a step
    --prompt-data "$PROMPT_DATA" --input-key prompt --label-key label --metadata-key metadata
    --apply-chat-template --rm-type "$RM_TYPE"
    --rollout-shuffle --rollout-seed "$SEED" --seed "$SEED"
    --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES" --global-batch-size "$GLOBAL_BATCH_SIZE"
    --rollout-temperature "$TEMPERATURE" --rollout-max-response-len "$CAP"
    "${SYNC_RUN_FLAGS[@]}"
    "${SYNC_ARM_FLAGS[@]}"
  )
}

# RUNTIME_ENV_JSON: rescue on the path and the reward hook's settings of the arm.
rescue_rlvr_runtime_env() {
  rescue_sync_env
  local -a env=("${SYNC_ENV[@]}")
  [[ $ARM == turn ]] && env+=("RESCUE_TURN_TOKENS=$TURN_TOKENS")
  [[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
  rescue_offpolicy_env
  env+=("${OFFPOLICY_ENV[@]}")
  rescue_env_json "${env[@]}"
}

# SUBMIT: the `ray job submit` of the run ARM, SEED (names derived); $1 = --no-wait or empty.
rescue_rlvr_submit_cmd() {
  rescue_rlvr_names
  rescue_rlvr_flags
  rescue_rlvr_runtime_env
  rescue_sync_submit "${1:-}" "${RLVR_FLAGS[@]}"
}

# SUBMIT: the `ray job submit` of a synchronous run on one run slot, with RUNTIME_ENV_JSON;
# $1 = --no-wait or empty, the rest train.py's flags.
rescue_sync_submit() {
  local wait=$1
  shift
  SUBMIT=(ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT"
    --submission-id "$SUBMISSION_ID" --entrypoint-num-cpus 1
    --entrypoint-resources "{\"$RESCUE_RUN_SLOT\": 1}" --runtime-env-json "$RUNTIME_ENV_JSON")
  [[ -n $wait ]] && SUBMIT+=("$wait")
  SUBMIT+=(-- "$JOB_PYTHON" "$MILES_DIR/train.py" "$@")
}
