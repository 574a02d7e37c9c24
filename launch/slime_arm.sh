#!/usr/bin/env bash
# One stale-handling arm of rescue on slime: `make slime-arm ARM=drop|never-drop|protect|pace
# [A=0.5] [ESTIMATOR=turn]`. Settings and defaults: launch/slime_config.sh (and config.sh for
# the shared ones).
#
# Node 0 (NODE_RANK=0): checks, Ray head, waits for the other nodes, submits slime's
# train_async.py as a Ray job with rescue's rollout function (rescue.slime.rollout), the
# generate wrapper and the arm's hooks, the RESCUE_* settings in the job's runtime
# environment, and starts the housekeeper (dump window, checkpoint retention) detached from
# this shell. Other nodes: checks, then join the Ray cluster at MASTER_ADDR. The arm's
# settings (ARM, A, PACE_WINDOW, BASELINE, ESTIMATOR) are checked and turned into RESCUE_*
# variables by the same functions as the Miles launchers' (common.sh).
set -euo pipefail

RESCUE_PROG=slime-arm
# shellcheck source=slime_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/slime_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

RESCUE_SWITCHES+=(APPLY_CHAT_TEMPLATE)

# The arms slime runs (rescue/arms.py's launchers column); the rest of the arm table is
# common.sh's.
rescue_slime_check_arm() {
  [[ -n $ARM ]] || rescue_die "ARM is not set: set ARM to $RESCUE_SLIME_ARM_WORDS"
  if [[ " ${RESCUE_SLIME_ARM_LIST[*]} " != *" $ARM "* ]]; then
    rescue_is_budget_arm &&
      rescue_die "ARM=$ARM is a budget-regime arm, which runs on Miles (make swe-arm or make rlvr-arm): on slime set ARM to $RESCUE_SLIME_ARM_WORDS"
    rescue_die "ARM='$ARM' is not a slime arm: set ARM to $RESCUE_SLIME_ARM_WORDS"
  fi
  [[ $DRGRPO == 0 ]] ||
    rescue_die "DRGRPO=$DRGRPO runs on Miles only (rescue.miles.drgrpo is Miles' reducer): unset DRGRPO"
  [[ -z $PACE_STRAGGLER_S ]] ||
    rescue_die "PACE_STRAGGLER_S=$PACE_STRAGGLER_S runs on Miles only (slime's drain never abandons a group in flight): unset PACE_STRAGGLER_S"
  rescue_check_arm
}

rescue_check_slime() {
  [[ -f $SLIME_DIR/train_async.py ]] ||
    rescue_die "no slime checkout at SLIME_DIR=$SLIME_DIR (train_async.py missing): set SLIME_DIR to a slime checkout with train_async.py"
  local kv
  for kv in $SLIME_ENV; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
      rescue_die "SLIME_ENV entry '$kv' is not NAME=VALUE: set SLIME_ENV='NAME=VALUE ...'"
  done
}

# MODEL: the architecture flags, from MODEL_ARGS or slime's scripts/models/MODEL_TYPE.sh
# (a bash array MODEL_ARGS, read in a subshell).
rescue_slime_model() {
  MODEL=()
  if [[ -n $MODEL_ARGS ]]; then
    read -ra MODEL <<<"$MODEL_ARGS"
    return 0
  fi
  local script=$SLIME_DIR/scripts/models/$MODEL_TYPE.sh words
  [[ -f $script ]] ||
    rescue_die "no model script $script: set MODEL_TYPE to one in SLIME_DIR/scripts/models or set MODEL_ARGS"
  # shellcheck disable=SC1090,SC2154  # the script defines MODEL_ARGS
  words=$(
    set +u
    source "$script" >/dev/null
    printf '%s\n' "${MODEL_ARGS[@]}"
  ) || rescue_die "cannot read MODEL_ARGS from $script: set MODEL_ARGS"
  mapfile -t MODEL <<<"$words"
}

# FLAGS: slime's train_async.py with rescue's rollout function, the generate wrapper, the
# arm's hooks, then everything the arms share.
rescue_slime_flags() {
  rescue_slime_model
  FLAGS=(
    "${MODEL[@]}"
    # rescue's fully-async rollout (slime's worker, rescue's gate, census and drain), and the
    # record of every model call (RESCUE_GENERATE_FUNCTION is the function it wraps)
    --rollout-function-path rescue.slime.rollout.generate_rollout
    --custom-generate-function-path rescue.slime.generate.generate
  )
  if [[ $ARM == protect || $ESTIMATOR == turn ]]; then
    FLAGS+=(--custom-reward-post-process-path rescue.reward.post_process_rewards)
  fi
  if [[ $ESTIMATOR == turn ]]; then
    FLAGS+=(--custom-advantage-function-path rescue.slime.advantages.turn_advantages)
  fi
  FLAGS+=(
    # checkpoints
    --hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD"
    --load "$SAVE_DIR" --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL"
    # data and rollout: n rollouts per prompt, ROLLOUT_BATCH_SIZE prompts a step
    --prompt-data "$PROMPT_DATA" --input-key prompt --label-key "$LABEL_KEY"
    --metadata-key metadata
  )
  [[ $APPLY_CHAT_TEMPLATE == 1 ]] && FLAGS+=(--apply-chat-template)
  [[ -n $RM_TYPE ]] && FLAGS+=(--rm-type "$RM_TYPE")
  [[ -n $CUSTOM_RM_PATH ]] && FLAGS+=(--custom-rm-path "$CUSTOM_RM_PATH")
  FLAGS+=(
    --rollout-shuffle --rollout-seed "$SEED" --seed "$SEED"
    --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES" --global-batch-size "$GLOBAL_BATCH_SIZE"
    --rollout-temperature "$TEMPERATURE" --rollout-max-response-len "$MAX_RESPONSE_LEN"
    --rollout-max-context-len "$MAX_SEQ_LEN"
    # GRPO, no KL or entropy term (the 1/A weight scales the whole loss), TIS for the
    # asynchronous rollouts
    --advantage-estimator grpo --eps-clip "$EPS_CLIP" --eps-clip-high "$EPS_CLIP_HIGH"
    --use-tis
    --optimizer adam --lr "$LR" --lr-decay-style constant --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.98
    # the census: rescue's rollout function returns it as the rollout metrics
    --use-wandb --wandb-mode "$WANDB_MODE" --wandb-project "$WANDB_PROJECT"
    --wandb-group "$WANDB_GROUP" --disable-wandb-random-suffix
    --wandb-dir "$OUTPUT_DIR/$RUN_NAME/wandb"
    # placement and parallelism (fully-async: training and rollout on their own GPUs)
    --actor-num-nodes "$ACTOR_NUM_NODES" --actor-num-gpus-per-node "$ACTOR_GPUS_PER_NODE"
    --num-gpus-per-node "$GPUS_PER_NODE" --rollout-num-gpus "$ROLLOUT_NUM_GPUS"
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --tensor-model-parallel-size "$TP" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size "$CP" --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --balance-data
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
  if [[ $DUMP_STEPS != 0 ]]; then
    FLAGS+=(--save-debug-rollout-data "$DUMP_DIR/rollout_data/{rollout_id}.pt")
  fi
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  FLAGS+=("${extra[@]}")
}

# RUNTIME_ENV_JSON: rescue, slime and Megatron on PYTHONPATH, the arm's RESCUE_* settings
# (common.sh's rescue_arm_env, as on Miles), K, the estimator, the wrapped generate function.
rescue_slime_runtime_env() {
  local -a env=(
    "PYTHONPATH=$RESCUE_DIR:$SLIME_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
    PYTHONUNBUFFERED=1
    CUDA_DEVICE_MAX_CONNECTIONS=1
    "MASTER_ADDR=$MASTER_ADDR"
    "no_proxy=127.0.0.1,$MASTER_ADDR"
    "RESCUE_SEED=$SEED"
    "WANDB_TAGS=$WANDB_TAGS"
  )
  rescue_arm_env
  local -a arm_env=()
  local setting
  for setting in "${ARM_ENV[@]}"; do # slime's drain never abandons a straggler
    [[ $setting == RESCUE_PACE_STRAGGLER_S=* ]] || arm_env+=("$setting")
  done
  env+=("${arm_env[@]}" "RESCUE_MAX_STALENESS=$STALENESS" "RESCUE_ESTIMATOR=$ESTIMATOR"
    "RESCUE_GENERATE_FUNCTION=$SLIME_GENERATE")
  local -a words=()
  read -ra words <<<"$SLIME_ENV"
  env+=("${words[@]}")
  rescue_env_json "${env[@]}"
}

rescue_slime_check_arm
rescue_check_settings
rescue_check_slime
rescue_check_gpus
RUN_PREFIX=slime rescue_derive_names
WANDB_TAGS+=",framework:slime"

if [[ $NODE_RANK != 0 ]]; then
  rescue_note "node $NODE_RANK of $NNODES ($NODE_ADDR): join the Ray cluster at $MASTER_ADDR:$RAY_PORT"
  rescue_ray_start
  exit 0
fi

rescue_slime_flags
rescue_slime_runtime_env
SUBMISSION_ID=${SUBMISSION_ID:-$RUN_NAME-$(date +%Y%m%d-%H%M%S)}

rescue_note "$RUN_NAME: ARM=$ARM${A:+ A=$A}${PACE_WINDOW:+ PACE_WINDOW=$PACE_WINDOW} SEED=$SEED STALENESS=$STALENESS ESTIMATOR=$ESTIMATOR on slime, $NNODES node(s)"
rescue_ray_start
rescue_ray_wait
if [[ $DRY_RUN != 1 ]]; then mkdir -p "$OUTPUT_DIR/$RUN_NAME"; fi
rescue_housekeeper housekeeper
rescue_submit_and_wait "$SUBMISSION_ID" ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" \
  --submission-id "$SUBMISSION_ID" --runtime-env-json "$RUNTIME_ENV_JSON" \
  -- "$JOB_PYTHON" "$SLIME_DIR/train_async.py" "${FLAGS[@]}"
