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
# (the mask filter, Dr. GRPO's two flags, the matched control) and the names. The flags it
# shares with the single-turn runs are rlvr.sh's (rescue_sync_*); no --use-tis: on-policy.
rescue_agent_flags() {
  rescue_sync_model_flags
  rescue_sync_run_flags
  AGENT_FLAGS=(
    "${SYNC_MODEL_FLAGS[@]}"
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
    "${SYNC_RUN_FLAGS[@]}"
  )
  if awk -v k="$KL_COEF" 'BEGIN { exit !(k + 0 > 0) }'; then
    AGENT_FLAGS+=(--use-kl-loss --kl-loss-type low_var_kl --kl-loss-coef "$KL_COEF")
  fi
  rescue_sync_arm_flags none
  AGENT_FLAGS+=("${SYNC_ARM_FLAGS[@]}")
}

# RUNTIME_ENV_JSON: rescue on the path, the reward hook's settings of the arm, the game data.
rescue_agent_runtime_env() {
  rescue_sync_env
  local -a env=("${SYNC_ENV[@]}")
  [[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
  [[ $ENV == alfworld ]] && env+=("ALFWORLD_DATA=$ALFWORLD_DATA")
  rescue_env_json "${env[@]}"
}

# SUBMIT: the `ray job submit` of the run ENV, ARM, SEED (names derived).
rescue_agent_submit_cmd() {
  rescue_agent_names
  rescue_agent_flags
  rescue_agent_runtime_env
  rescue_sync_submit "" "${AGENT_FLAGS[@]}"
}
