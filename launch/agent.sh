# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The text-game arms on Miles' synchronous colocated trainer (train.py --colocate): checks,
# names, the flags of an arm and the `ray job submit` of one run. Sourced by the agent
# launchers after agent_config.sh, common.sh and rlvr.sh (whose checks of the shared
# numbers, Ray start with run slots and cluster check they use).

RESCUE_AGENT_ENVS=(alfworld cooking)
RESCUE_AGENT_POSITIVE=(CAP STEP_TOKENS CONTEXT_LEN GAMES)

# ENV and the settings of the text games: one line naming the first bad one.
rescue_agent_check() {
  [[ -n $ENV ]] || rescue_die "ENV is not set: set ENV=alfworld or ENV=cooking"
  [[ " ${RESCUE_AGENT_ENVS[*]} " == *" $ENV "* ]] ||
    rescue_die "ENV='$ENV' is not a text game: set ENV=alfworld or ENV=cooking"
  rescue_rlvr_check
  [[ $HISTORY =~ ^[0-9]+$ ]] || rescue_die "HISTORY='$HISTORY' is not a non-negative integer: set HISTORY=N"
  local name value
  for name in "${RESCUE_AGENT_POSITIVE[@]}"; do
    value=${!name}
    [[ $value =~ ^[1-9][0-9]*$ ]] || rescue_die "$name='$value' is not a positive integer: set $name=N"
  done
  [[ $GAME_SEED =~ ^-?[0-9]+$ ]] || rescue_die "GAME_SEED='$GAME_SEED' is not an integer: set GAME_SEED to an integer"
  ((STEP_TOKENS < CONTEXT_LEN)) ||
    rescue_die "STEP_TOKENS=$STEP_TOKENS is not below CONTEXT_LEN=$CONTEXT_LEN: no prompt would fit; raise CONTEXT_LEN"
  ((CONTEXT_LEN <= MAX_TOKENS_PER_GPU)) ||
    rescue_die "CONTEXT_LEN=$CONTEXT_LEN is above MAX_TOKENS_PER_GPU=$MAX_TOKENS_PER_GPU: one step would not fit a micro-batch; raise MAX_TOKENS_PER_GPU"
  if ! [[ $KL_COEF =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; then
    rescue_die "KL_COEF='$KL_COEF' is not a number >= 0: set KL_COEF=0.01, or 0 for no KL loss"
  fi
  return 0
}

# The text-game arm ARM and its own settings (budget.sh).
rescue_agent_check_arm() {
  rescue_budget_check_arm text-game
}

# The prompt rows must exist (make agent-prepare writes them); a dry run only warns.
rescue_agent_check_data() {
  [[ -f $PROMPT_DATA ]] && return 0
  local msg="no PROMPT_DATA=$PROMPT_DATA: run make agent-prepare ENV=$ENV first"
  if [[ $DRY_RUN == 1 ]]; then rescue_warn "$msg (dry run continues)"; else rescue_die "$msg"; fi
}

# RUN_NAME, WANDB_GROUP, SAVE_DIR, DUMP_DIR, SUBMISSION_ID (each unless set) and WANDB_TAGS:
# agent-ENV-ARM-capCAP-seedSEED.
rescue_agent_names() {
  RUN_NAME=${RUN_NAME:-agent-$ENV-$ARM-cap$CAP-seed$SEED}
  WANDB_GROUP=${WANDB_GROUP:-$RUN_NAME}
  SAVE_DIR=${SAVE_DIR:-$OUTPUT_DIR/$RUN_NAME/checkpoints}
  DUMP_DIR=${DUMP_DIR:-$OUTPUT_DIR/$RUN_NAME/dumps}
  SUBMISSION_ID=${SUBMISSION_ID:-$RUN_NAME-$(date +%Y%m%d-%H%M%S)}
  WANDB_TAGS="env:$ENV,arm:$ARM,seed:$SEED,cap:$CAP"
}

# AGENT_FLAGS: train.py's flags of the arm; identical in every arm except the arm's own
# (the mask filter, Dr. GRPO's two flags, the matched control) and the names.
rescue_agent_flags() {
  local model_args
  model_args=$(rescue_model_args)
  local -a model=()
  read -ra model <<<"$model_args"
  AGENT_FLAGS=(
    "${model[@]}"
    --hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD"
    --load "$SAVE_DIR" --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL"
    # data: one game per row, groups of N_SAMPLES episodes, ROLLOUT_BATCH_SIZE games a step
    --prompt-data "$PROMPT_DATA" --input-key prompt --metadata-key metadata
    --rollout-shuffle --rollout-seed "$SEED" --seed "$SEED"
    --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES" --global-batch-size "$GLOBAL_BATCH_SIZE"
    --rollout-temperature "$TEMPERATURE"
    # the episode: one engine request a step (rescue.miles.textgame), the cap, the history
    --custom-generate-function-path rescue.miles.textgame.generate
    --agent-cap "$CAP" --agent-history "$HISTORY"
    --rollout-max-response-len "$STEP_TOKENS" --rollout-max-context-len "$CONTEXT_LEN"
    # a game without a result (the game or the engine failed) never trains: its group is
    # dropped, counted by reason, and Miles draws another
    --dynamic-sampling-filter-path rescue.miles.textgame.drop_no_result
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
  if awk -v k="$KL_COEF" 'BEGIN { exit !(k + 0 > 0) }'; then
    AGENT_FLAGS+=(--use-kl-loss --kl-loss-type low_var_kl --kl-loss-coef "$KL_COEF")
  fi
  # GRPO, the estimator, Dr. GRPO and the train-side logging contract, as in every arm
  # (no --use-tis: on-policy); the reward hook scores a capped episode 0 in every arm.
  rescue_loss_flags
  AGENT_FLAGS+=("${LOSS_FLAGS[@]}")
  [[ $ESTIMATOR == turn ]] ||
    AGENT_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  rescue_budget_flags
  AGENT_FLAGS+=("${BUDGET_FLAGS[@]}")
  if [[ $DUMP_STEPS != 0 ]]; then
    AGENT_FLAGS+=(--save-debug-rollout-data "$DUMP_DIR/rollout_data/{rollout_id}.pt")
  fi
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  AGENT_FLAGS+=("${extra[@]}")
}

# RUNTIME_ENV_JSON: rescue on the path, the reward hook's settings of the arm, the game data.
rescue_agent_runtime_env() {
  local -a env=(
    "PYTHONPATH=$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
    PYTHONUNBUFFERED=1
    CUDA_DEVICE_MAX_CONNECTIONS=1
    "RESCUE_SEED=$SEED"
    "WANDB_TAGS=$WANDB_TAGS"
    "RESCUE_ESTIMATOR=$ESTIMATOR"
  )
  rescue_budget_env
  env+=("${BUDGET_ENV[@]}")
  [[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
  [[ $ENV == alfworld ]] && env+=("ALFWORLD_DATA=$ALFWORLD_DATA")
  rescue_env_json "${env[@]}"
}

# SUBMIT: the `ray job submit` of the run ENV, ARM, SEED (names derived).
rescue_agent_submit_cmd() {
  rescue_agent_names
  rescue_agent_flags
  rescue_agent_runtime_env
  SUBMIT=(ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT"
    --submission-id "$SUBMISSION_ID" --entrypoint-num-cpus 1
    --entrypoint-resources "{\"$RESCUE_RUN_SLOT\": 1}" --runtime-env-json "$RUNTIME_ENV_JSON"
    -- "$JOB_PYTHON" "$MILES_DIR/train.py" "${AGENT_FLAGS[@]}")
}
