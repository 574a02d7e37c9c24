# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The common part of the launchers: checks with one-line errors, the dry-run printer,
# the Ray start, and the train_async.py command of an arm. Sourced after config.sh.

RESCUE_PROG=${RESCUE_PROG:-$(basename "$0" .sh)}

# One line on stderr, exit status 2.
rescue_die() {
  printf '%s: error: %s\n' "$RESCUE_PROG" "$*" >&2
  exit 2
}

rescue_warn() {
  printf '%s: warning: %s\n' "$RESCUE_PROG" "$*" >&2
}

# POSIX-shell quoting that `sh` and Python's shlex.split read back unchanged.
rescue_quote() {
  local s=$1 q="'"
  if [[ -n $s && $s =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$s"
  else
    printf "'%s'" "${s//$q/$q\\$q$q}"
  fi
}

rescue_print_cmd() {
  local out="" word
  for word in "$@"; do out+="$(rescue_quote "$word") "; done
  printf '%s\n' "${out% }"
}

# Run a command, or with DRY_RUN=1 print it on stdout and run nothing.
rescue_run() {
  if [[ $DRY_RUN == 1 ]]; then
    rescue_print_cmd "$@"
    return 0
  fi
  printf '+ %s\n' "$(rescue_print_cmd "$@")" >&2
  "$@"
}

# `rescue ...` with RESCUE_PY, this checkout first on its path (rescue_run rules apply);
# leading NAME=VALUE words are set in its environment.
rescue_cli() {
  local -a vars=()
  while (($#)) && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    vars+=("$1")
    shift
  done
  rescue_run env "PYTHONPATH=$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "${vars[@]}" "$RESCUE_PY" -m rescue "$@"
}

# A line that says what would happen next without being a command (dry run), or nothing.
rescue_note() {
  if [[ $DRY_RUN == 1 ]]; then printf '# %s\n' "$*"; else printf '%s: %s\n' "$RESCUE_PROG" "$*" >&2; fi
}

# ── Checks ──────────────────────────────────────────────────────────────────────────────

rescue_check_arm() {
  case $ARM in
    drop | never-drop | protect) ;;
    "") rescue_die "ARM is not set: set ARM=drop, ARM=never-drop or ARM=protect" ;;
    *) rescue_die "ARM='$ARM' is not an arm: set ARM=drop, ARM=never-drop or ARM=protect" ;;
  esac
  if [[ $ARM == protect ]]; then
    [[ -n $A ]] || rescue_die "ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5"
    if ! [[ $A =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      ! awk -v a="$A" 'BEGIN { exit !(a + 0 > 0 && a + 0 <= 1) }'; then
      rescue_die "A='$A' is outside (0, 1]: set A with 0 < A <= 1"
    fi
  elif [[ -n $A ]]; then
    rescue_die "A=$A applies only to ARM=protect: unset A or set ARM=protect"
  fi
  if [[ $ARM == never-drop && -n $STALENESS_SET && $CENSUS_BUFFER != 1 ]]; then
    rescue_die "STALENESS applies only to ARM=drop and ARM=protect (or CENSUS_BUFFER=1): unset STALENESS"
  fi
  case $CENSUS_BUFFER in
    0 | 1) ;;
    *) rescue_die "CENSUS_BUFFER='$CENSUS_BUFFER': set CENSUS_BUFFER=0 or CENSUS_BUFFER=1" ;;
  esac
  [[ $STALENESS =~ ^[0-9]+$ ]] ||
    rescue_die "STALENESS='$STALENESS' is not a non-negative integer: set STALENESS=K"
  [[ $SEED =~ ^-?[0-9]+$ ]] || rescue_die "SEED='$SEED' is not an integer: set SEED to an integer"
  case $BASELINE in
    all | survivors) ;;
    *) rescue_die "BASELINE='$BASELINE' is not a baseline population: set BASELINE=all or BASELINE=survivors" ;;
  esac
  case $ESTIMATOR in
    group | turn) ;;
    *) rescue_die "ESTIMATOR='$ESTIMATOR' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn" ;;
  esac
  case $DRGRPO in
    0 | 1) ;;
    *) rescue_die "DRGRPO='$DRGRPO': set DRGRPO=0 or DRGRPO=1" ;;
  esac
  if [[ -n $DRGRPO_DIVISOR ]]; then
    [[ $DRGRPO == 1 ]] ||
      rescue_die "DRGRPO_DIVISOR applies only to DRGRPO=1: unset DRGRPO_DIVISOR or set DRGRPO=1"
    if ! [[ $DRGRPO_DIVISOR =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      ! awk -v d="$DRGRPO_DIVISOR" 'BEGIN { exit !(d + 0 > 0) }'; then
      rescue_die "DRGRPO_DIVISOR='$DRGRPO_DIVISOR' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty"
    fi
  fi
  [[ $NNODES =~ ^[1-9][0-9]*$ ]] || rescue_die "NNODES='$NNODES' is not a node count: set NNODES=1 or more"
  if ! [[ $NODE_RANK =~ ^[0-9]+$ ]] || ((NODE_RANK >= NNODES)); then
    rescue_die "NODE_RANK='$NODE_RANK' is not in 0..$((NNODES - 1)): set NODE_RANK for this node"
  fi
  if ((NNODES > 1)) && [[ $MASTER_ADDR == 127.0.0.1 || $MASTER_ADDR == localhost ]]; then
    rescue_die "NNODES=$NNODES needs MASTER_ADDR: set MASTER_ADDR to node 0's address on every node"
  fi
  case $DUMP_STEPS in
    all | [0-9] | [1-9][0-9]*) ;;
    *) rescue_die "DUMP_STEPS='$DUMP_STEPS' is not a step count: set DUMP_STEPS=N, 0 or all" ;;
  esac
}

rescue_check_miles() {
  [[ -f $MILES_DIR/train_async.py ]] ||
    rescue_die "no Miles checkout at MILES_DIR=$MILES_DIR (train_async.py missing): set MILES_DIR to a Miles checkout with train_async.py"
}

# GPUs this node can use: nvidia-smi's list, narrowed by CUDA_VISIBLE_DEVICES when set.
rescue_gpu_count() {
  local n
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo 0
    return
  fi
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || n=0
  if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
    local visible
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]') || visible=0
    ((visible < n)) && n=$visible
  fi
  echo "$n"
}

# Dies without enough GPUs; with DRY_RUN=1 it only warns, so commands can be read anywhere.
rescue_check_gpus() {
  local n
  n=$(rescue_gpu_count)
  if ((n < GPUS_PER_NODE)); then
    local msg="no GPUs visible (found $n, need GPUS_PER_NODE=$GPUS_PER_NODE): run on a GPU node or set GPUS_PER_NODE / CUDA_VISIBLE_DEVICES"
    ((n > 0)) && msg="too few GPUs visible (found $n, need GPUS_PER_NODE=$GPUS_PER_NODE): run on a GPU node or set GPUS_PER_NODE / CUDA_VISIBLE_DEVICES"
    if [[ $DRY_RUN == 1 ]]; then rescue_warn "$msg (dry run continues)"; else rescue_die "$msg"; fi
  fi
}

# ── Names derived from the arm ──────────────────────────────────────────────────────────

rescue_derive_names() {
  local name="swe-$ARM"
  [[ $ARM == protect ]] && name+="-a$A"
  [[ $ARM != never-drop ]] && name+="-k$STALENESS"
  name+="-seed$SEED"
  RUN_NAME=${RUN_NAME:-$name}
  WANDB_GROUP=${WANDB_GROUP:-$RUN_NAME}
  SAVE_DIR=${SAVE_DIR:-$OUTPUT_DIR/$RUN_NAME/checkpoints}
  DUMP_DIR=${DUMP_DIR:-$OUTPUT_DIR/$RUN_NAME/dumps}
  WANDB_TAGS="arm:$ARM,seed:$SEED"
  [[ $ARM == protect ]] && WANDB_TAGS+=",a:$A"
  [[ $ARM != never-drop ]] && WANDB_TAGS+=",k:$STALENESS"
  return 0
}

# ── Model arguments from Miles' own model script ────────────────────────────────────────

rescue_model_args() {
  if [[ -n $MODEL_ARGS ]]; then
    printf '%s\n' "$MODEL_ARGS"
    return
  fi
  local script=$MILES_DIR/scripts/models/$MODEL_TYPE.py
  [[ -f $script ]] ||
    rescue_die "no model script $script: set MODEL_TYPE to one in MILES_DIR/scripts/models or set MODEL_ARGS"
  "$JOB_PYTHON" - "$script" "$MILES_DIR/miles/utils/external_utils" <<'PY' ||
import importlib.util
import sys

script, helpers = sys.argv[1:3]
sys.path.insert(0, helpers)  # model scripts may import Miles' model_args_utils
spec = importlib.util.spec_from_file_location("rescue_model_script", script)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(" ".join(module.model_args().split()))
PY
    rescue_die "cannot read model args from $script with JOB_PYTHON=$JOB_PYTHON: set MODEL_ARGS"
}

# ── The arm's flags, and the flags every arm shares ─────────────────────────────────────

# ARM_FLAGS: what distinguishes the arms, and nothing else.
rescue_arm_flags() {
  ARM_FLAGS=()
  local buffer=(--custom-async-data-buffer-path rescue.miles.buffer.RescueDataBuffer)
  case $ARM in
    drop) ARM_FLAGS=(--max-weight-staleness "$STALENESS") ;;
    never-drop) ;;
    protect)
      ARM_FLAGS=(--max-weight-staleness "$STALENESS" "${buffer[@]}")
      # With ESTIMATOR=turn every arm has the reward hook (a shared flag).
      [[ $ESTIMATOR == turn ]] ||
        ARM_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
      ;;
  esac
  # CENSUS_BUFFER=1: drop and never-drop run through rescue's buffer too (RESCUE_ARM decides,
  # weights stay 1), so their census also counts the stale groups and their outcomes.
  if [[ $CENSUS_BUFFER == 1 && $ARM != protect ]]; then
    ARM_FLAGS=(--max-weight-staleness "$STALENESS" "${buffer[@]}")
  fi
}

# SHARED_FLAGS: identical in every arm except for the names derived from the arm.
rescue_shared_flags() {
  local model_args
  model_args=$(rescue_model_args)
  local -a model=()
  read -ra model <<<"$model_args"
  SHARED_FLAGS=(
    "${model[@]}"
    # checkpoints
    --hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD"
    --load "$SAVE_DIR" --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL"
    # data: the pilot's task subset, n rollouts per prompt, ROLLOUT_BATCH_SIZE prompts a step
    --prompt-data "$PROMPT_DATA" --input-key prompt --metadata-key metadata
    --rollout-shuffle --rollout-seed "$SEED" --seed "$SEED"
    --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES" --global-batch-size "$GLOBAL_BATCH_SIZE"
    --rollout-temperature "$TEMPERATURE" --rollout-max-response-len "$MAX_RESPONSE_LEN"
    --max-seq-len "$MAX_SEQ_LEN" --rollout-max-context-len "$MAX_SEQ_LEN"
    # fully asynchronous rollout
    --fully-async --pause-generation-mode "$PAUSE_MODE"
    # the SWE-smith agent behind Miles' session server
    --custom-generate-function-path miles.rollout.generate_hub.agentic_tool_call.generate
    --custom-agent-function-path swe_smith_tasks.agent.run
    --custom-rm-path swe_smith_tasks.agent.reward_func
    --use-session-server --tito-model "$TITO_MODEL"
    # GRPO, one off-policy correction for every arm
    --advantage-estimator grpo --eps-clip "$EPS_CLIP" --eps-clip-high "$EPS_CLIP_HIGH" --use-tis
    --optimizer adam --lr "$LR" --lr-decay-style constant --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.98
    # the outcome census, and the train-side logging contract (update norm, trained advantages)
    --custom-rollout-log-function-path rescue.miles.log.log_rollout
    --loss-type custom_loss --custom-loss-function-path rescue.miles.loss.policy_loss
    --custom-megatron-before-train-step-hook-path rescue.miles.train_step.before_train_step
    --use-wandb --wandb-mode "$WANDB_MODE" --wandb-project "$WANDB_PROJECT"
    --wandb-group "$WANDB_GROUP" --disable-wandb-random-suffix
    --wandb-dir "$OUTPUT_DIR/$RUN_NAME/wandb"
    # placement and parallelism
    --actor-num-nodes "$ACTOR_NUM_NODES" --actor-num-gpus-per-node "$ACTOR_GPUS_PER_NODE"
    --num-gpus-per-node "$GPUS_PER_NODE" --rollout-num-gpus "$ROLLOUT_NUM_GPUS"
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --tensor-model-parallel-size "$TP" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size "$CP" --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --balance-data --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
  # The estimator, identical in every arm.
  if [[ $ESTIMATOR == turn ]]; then
    SHARED_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  fi
  if [[ $DRGRPO == 1 ]]; then
    SHARED_FLAGS+=(
      --disable-grpo-std-normalization
      --custom-pg-loss-reducer-function-path rescue.miles.drgrpo.pg_loss_reducer
    )
  fi
  if [[ $DUMP_STEPS != 0 ]]; then
    SHARED_FLAGS+=(--save-debug-rollout-data "$DUMP_DIR/rollout_data/{rollout_id}.pt")
  fi
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  SHARED_FLAGS+=("${extra[@]}")
}

# AGENT_VARS: the SWE agent's settings as NAME=VALUE words, the same for training and the
# pilot: the turn cap, $1 trials at once, then AGENT_ENV's words (which win).
rescue_agent_vars() {
  AGENT_VARS=("RESCUE_SWE_STEP_LIMIT=$MAX_TURNS" "RESCUE_SWE_MAX_CONCURRENCY=$1")
  local -a words=()
  read -ra words <<<"$AGENT_ENV"
  local kv
  for kv in "${words[@]}"; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || rescue_die "AGENT_ENV entry '$kv' is not NAME=VALUE: set AGENT_ENV='RESCUE_SWE_TRIAL_TIMEOUT=5400 ...'"
    AGENT_VARS+=("$kv")
  done
}

# RUNTIME_ENV_JSON: what the Ray job's processes see (rescue on PYTHONPATH, the gate, the agent).
rescue_runtime_env() {
  local pythonpath="$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
  local -a env=(
    "PYTHONPATH=$pythonpath"
    PYTHONUNBUFFERED=1
    CUDA_DEVICE_MAX_CONNECTIONS=1
    "MASTER_ADDR=$MASTER_ADDR"
    "no_proxy=127.0.0.1,$MASTER_ADDR"
    "RESCUE_ARM=$ARM"
    "RESCUE_SEED=$SEED"
    "WANDB_TAGS=$WANDB_TAGS"
  )
  [[ $ARM == protect ]] && env+=("RESCUE_A=$A" "RESCUE_BASELINE=$BASELINE")
  env+=("RESCUE_ESTIMATOR=$ESTIMATOR")
  [[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
  rescue_agent_vars "$AGENT_CONCURRENCY"
  env+=("${AGENT_VARS[@]}")
  RUNTIME_ENV_JSON=$("$JOB_PYTHON" -c '
import json, sys
print(json.dumps({"env_vars": dict(kv.split("=", 1) for kv in sys.argv[1:])}, separators=(",", ":")))
' "${env[@]}") || rescue_die "JOB_PYTHON=$JOB_PYTHON cannot run: set JOB_PYTHON to a Python 3 interpreter"
}

# ── Ray ─────────────────────────────────────────────────────────────────────────────────

rescue_ray_start() {
  if [[ $RAY_STOP == 1 ]]; then rescue_run ray stop --force; fi
  if [[ $NODE_RANK == 0 ]]; then
    rescue_run ray start --head --node-ip-address "$MASTER_ADDR" --port "$RAY_PORT" \
      --dashboard-port "$RAY_DASHBOARD_PORT" --num-gpus "$GPUS_PER_NODE" --disable-usage-stats
  else
    rescue_run ray start --address "$MASTER_ADDR:$RAY_PORT" --num-gpus "$GPUS_PER_NODE" \
      --disable-usage-stats
  fi
}

# Node 0 waits until the cluster holds NNODES * GPUS_PER_NODE GPUs.
rescue_ray_wait() {
  local want=$((NNODES * GPUS_PER_NODE))
  ((NNODES > 1)) || return 0
  rescue_note "wait up to RAY_WAIT_S=$RAY_WAIT_S s until Ray holds $want GPUs ($NNODES nodes)"
  [[ $DRY_RUN == 1 ]] && return 0
  local deadline=$((SECONDS + RAY_WAIT_S)) have
  while :; do
    have=$("$JOB_PYTHON" -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(int(ray.cluster_resources().get("GPU", 0)))' 2>/dev/null) || have=0
    ((have >= want)) && return 0
    ((SECONDS >= deadline)) &&
      rescue_die "Ray holds $have of $want GPUs after RAY_WAIT_S=$RAY_WAIT_S s: start the other nodes (NODE_RANK=1..$((NNODES - 1)), MASTER_ADDR=$MASTER_ADDR) or raise RAY_WAIT_S"
    sleep 10
  done
}

# ── The dump window ─────────────────────────────────────────────────────────────────────

# Deletes the dumps of steps >= DUMP_STEPS (Miles' --save-debug-rollout-data has no limit).
rescue_prune_dumps() {
  local f id
  for f in "$DUMP_DIR"/rollout_data/*.pt "$DUMP_DIR"/dashboard_columns/rollout_*.parquet; do
    [[ -e $f ]] || continue
    id=${f##*/}
    id=${id#rollout_}
    id=${id%.*}
    if [[ $id =~ ^[0-9]+$ ]] && ((10#$id >= DUMP_STEPS)); then rm -f -- "$f"; fi
  done
}

rescue_dump_window() {
  [[ $DUMP_STEPS == 0 || $DUMP_STEPS == all ]] && return 0
  rescue_note "while the job runs: delete rollout dumps of steps >= DUMP_STEPS=$DUMP_STEPS in $DUMP_DIR every 60 s"
  [[ $DRY_RUN == 1 ]] && return 0
  (while sleep 60; do rescue_prune_dumps; done) &
  PRUNER_PID=$!
  trap 'kill "$PRUNER_PID" 2>/dev/null || true; rescue_prune_dumps' EXIT
}
