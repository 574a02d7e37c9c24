# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# The common part of the launchers: checks with one-line errors, the dry-run printer, the
# model family, the GPU layout, the Ray start, and the train_async.py command of an arm.
# Sourced after config.sh; sources arms.sh (the arms), budget.sh (the budget-regime arms'
# settings), derive.sh (the model family, the GPU layout) and node.sh (processes and the
# housekeeper's pruning).

RESCUE_PROG=${RESCUE_PROG:-$(basename "$0" .sh)}

# The arms (rescue/arms.py's table): their names and each one's settings.
# shellcheck source=arms.sh
source "$LAUNCH_DIR/arms.sh"

# One line on stderr, exit status 2.
rescue_die() {
  printf '%s: error: %s\n' "$RESCUE_PROG" "$*" >&2
  exit 2
}

# rescue_not_slime NAME: refuse a checkout variable (MILES_DIR) that names a slime checkout,
# which has a train.py and a train_async.py too.
rescue_not_slime() {
  local dir=${!1}
  if [[ -d $dir/slime && ! -d $dir/miles ]]; then
    rescue_die "$1=$dir is a slime checkout (it holds slime/, not miles/): set $1 to a Miles checkout (radixark/miles)"
  fi
  return 0
}

# rescue_list NAME ARRAY: the words of variable NAME, separated by commas and/or spaces, into
# the array ARRAY (`ARMS=zero,mask` and `ARMS='zero mask'` are the same list).
rescue_list() {
  local value=${!1}
  read -ra "$2" <<<"${value//,/ }"
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

# rescue_job_state ID: the state of the Ray job ID as the job server reports it (`ray job
# status`), in RESCUE_JOB_STATE: succeeded, failed, stopped, running (pending or running) or
# silent (Ray did not answer); what it printed in RESCUE_JOB_STATUS.
rescue_job_state() {
  if ! RESCUE_JOB_STATUS=$(ray job status --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" "$1" 2>&1); then
    RESCUE_JOB_STATE=silent
  elif grep -q "' succeeded" <<<"$RESCUE_JOB_STATUS"; then
    RESCUE_JOB_STATE=succeeded
  elif grep -q "' failed" <<<"$RESCUE_JOB_STATUS"; then
    RESCUE_JOB_STATE=failed
  elif grep -q "' was stopped" <<<"$RESCUE_JOB_STATUS"; then
    RESCUE_JOB_STATE=stopped
  else
    RESCUE_JOB_STATE=running
  fi
}

# rescue_submit_and_wait ID SUBMIT...: the `ray job submit ... --submission-id ID` command
# SUBMIT (which follows the job's log), then, when it exits 0, `ray job status ID` every
# JOB_POLL_S s until the job has ended. `ray job submit` exits 1 only for a failed job and 0
# also when its log stream ends while the job still runs (Ray's dashboard/modules/job/cli.py,
# `submit`), which would let what follows (the next arm of a chain, the oracle's comparison)
# start beside a running job. Returns 0 only when the job succeeded; 1 when it failed or was
# stopped, or Ray did not answer 10 times in a row.
rescue_submit_and_wait() {
  local id=$1 said=0 silent=0
  shift
  rescue_run "$@" || return $?
  [[ $DRY_RUN != 1 ]] || return 0
  while :; do
    rescue_job_state "$id"
    case $RESCUE_JOB_STATE in
      succeeded) return 0 ;;
      failed | stopped)
        printf '%s: job %s %s: %s\n' "$RESCUE_PROG" "$id" "$RESCUE_JOB_STATE" \
          "$(tail -n 1 <<<"$RESCUE_JOB_STATUS")" >&2
        return 1
        ;;
      silent)
        silent=$((silent + 1))
        if ((silent >= 10)); then
          printf '%s: Ray did not answer about job %s 10 times in a row: %s\n' "$RESCUE_PROG" \
            "$id" "$RESCUE_JOB_STATUS" >&2
          return 1
        fi
        ;;
      *)
        silent=0
        if ((!said)); then
          said=1
          printf '%s: ray job submit stopped following job %s, which is still running (%s); waiting for it to end, asking every JOB_POLL_S=%s s\n' \
            "$RESCUE_PROG" "$id" "$(tail -n 1 <<<"$RESCUE_JOB_STATUS")" "$JOB_POLL_S" >&2
        fi
        ;;
    esac
    sleep "$JOB_POLL_S"
  done
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

# Settings that are counts, sizes, ports or waits: checked before any arithmetic uses them.
RESCUE_POSITIVE=(NNODES GPUS_PER_NODE RAY_PORT RAY_DASHBOARD_PORT ACTOR_NUM_NODES
  ROLLOUT_GPUS_PER_ENGINE MAX_TURNS MAX_SEQ_LEN MAX_RESPONSE_LEN ROLLOUT_BATCH_SIZE N_SAMPLES
  NUM_ROLLOUT TP CP MAX_TOKENS_PER_GPU SAVE_INTERVAL CKPT_GB DUMP_MB_PER_STEP HOUSEKEEP_S
  JOB_POLL_S PILOT_PORT PILOT_WAIT_S PILOT_N PILOT_CONCURRENCY TIME_BUDGET TRIAL_TIMEOUT SC_TOP_K)
RESCUE_NON_NEGATIVE=(STALENESS NODE_RANK RAY_WAIT_S CKPT_KEEP SANDBOX_PIDS WATCHDOG_WINDOW)
# Empty means derived (rescue_derive_layout, rescue_derive_swe) or unset.
RESCUE_OPTIONAL_POSITIVE=(ACTOR_GPUS_PER_NODE ROLLOUT_NUM_GPUS GLOBAL_BATCH_SIZE AGENT_CONCURRENCY
  PILOT_TASKS PACE_WINDOW)
RESCUE_OPTIONAL_NON_NEGATIVE=(HEALTH_CHECK_FIRST_WAIT CKPT_STEP WATCHDOG_IDLE_S PACE_STRAGGLER_S)
RESCUE_SWITCHES=(RAY_STOP DRY_RUN PREFLIGHT REAP PULL_IMAGES EXTEND_CONTEXT PILOT_ALL
  PILOT_RETRY_INFRA DRGRPO ORACLE_STREAM ORACLE_FORCE RESUME PILOT_PULL REQUIRE_VALIDATE)
# Agent settings that have launcher settings of their own (AGENT_ENV refuses them).
RESCUE_AGENT_OWN=(RESCUE_SWE_STEP_LIMIT RESCUE_SWE_MAX_CONCURRENCY RESCUE_SWE_CONTAINER_CPUS
  RESCUE_SWE_CONTAINER_MEMORY RESCUE_SWE_CONTAINER_PIDS RESCUE_SWE_TIME_BUDGET
  RESCUE_SWE_TRIAL_TIMEOUT RESCUE_SWE_OUTER_TIMEOUT)

# Every setting every launcher reads: one line naming the first bad one, never a shell error.
rescue_check_settings() {
  rescue_check_values
  rescue_check_offpolicy chat tis tis-sc
  rescue_family
  rescue_derive_layout
  rescue_derive_swe
  if [[ ${ARM:-} == matched || ${ARM:-} == step-control ]]; then rescue_check_matched; fi
}

# The SWE settings derived from the trial timeout: the watchdog's idle limit and pace's
# straggler deadline (each unless set).
rescue_derive_swe() {
  WATCHDOG_IDLE_S=${WATCHDOG_IDLE_S:-$((2 * TRIAL_TIMEOUT))}
  PACE_STRAGGLER_S=${PACE_STRAGGLER_S:-$((TRIAL_TIMEOUT + 1800))}
}

# $1 (a name) holds a number in [$2, $3] ($3 may be empty: no upper bound); else one line.
rescue_check_number() {
  local name=$1 low=$2 high=$3 value=${!1}
  if ! [[ $value =~ ^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
    ! awk -v x="$value" -v lo="$low" -v hi="$high" 'BEGIN { exit !(x + 0 >= lo + 0 && (hi == "" || x + 0 <= hi + 0)) }'; then
    rescue_die "$name='$value' is not a number in [$low, ${high:-inf}]: set $name"
  fi
}

# The off-policy correction: OFFPOLICY among $2.. (this launcher's values), SC_CAP (SC_TOP_K
# is checked with the counts), and what score centering refuses before anything runs.
# $1: chat (the SWE agent's requests pass SGLang's router, which caps top_logprobs at 20
# unless --use-miles-router replaces it) or generate (the single-turn /generate path, no cap).
rescue_check_offpolicy() {
  local path=$1
  shift
  [[ " $* " == *" $OFFPOLICY "* ]] ||
    rescue_die "OFFPOLICY='$OFFPOLICY' is not an off-policy correction of these arms: set OFFPOLICY to one of: $*"
  if ! [[ $SC_CAP =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
    ! awk -v c="$SC_CAP" 'BEGIN { exit !(c + 0 > 0) }'; then
    rescue_die "SC_CAP='$SC_CAP' is not a number > 0: set SC_CAP=C"
  fi
  [[ $OFFPOLICY == tis-sc ]] || return 0
  awk -v p="${TOP_P:-1}" 'BEGIN { exit !(p + 0 == 1) }' ||
    rescue_die "TOP_P=$TOP_P truncates the sampler's distribution, which score centering cannot use: set TOP_P=1 or OFFPOLICY=tis"
  [[ ${TOP_K:--1} == -1 || ${TOP_K:--1} == 0 ]] ||
    rescue_die "TOP_K=$TOP_K truncates the sampler's distribution, which score centering cannot use: set TOP_K=-1 or OFFPOLICY=tis"
  if [[ $path == chat ]] && ((SC_TOP_K > 20)) && [[ " $EXTRA_ARGS " != *" --use-miles-router "* ]]; then
    rescue_die "SC_TOP_K=$SC_TOP_K on the SWE agent's chat requests: SGLang's router refuses top_logprobs above 20; set SC_TOP_K<=20 or add --use-miles-router to EXTRA_ARGS"
  fi
  case ${SGLANG_RETURN_ORIGINAL_LOGPROB:-} in
    "" | 0 | false | False) ;;
    *) rescue_die "SGLANG_RETURN_ORIGINAL_LOGPROB=$SGLANG_RETURN_ORIGINAL_LOGPROB makes SGLang return log-probs before the temperature, which score centering cannot use: unset it or set OFFPOLICY=tis" ;;
  esac
  local word
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  for word in "${extra[@]}"; do
    case $word in
      --use-tis | --custom-tis-function-path | --rollout-top-p | --rollout-top-k | --sglang-speculative-algorithm | --partial-rollout)
        rescue_die "EXTRA_ARGS has $word, which OFFPOLICY=tis-sc refuses (rescue.miles.sc_flags): remove it or set OFFPOLICY=tis" ;;
    esac
  done
}

# The values themselves (numbers, switches, seed, dump window, nodes, pause mode, pace
# window, lengths), before any arithmetic or derivation uses them.
rescue_check_values() {
  rescue_check_numbers
  case $PAUSE_MODE in
    in_place | retract) ;;
    abort) rescue_die "PAUSE_MODE=abort would abort every group in flight at each weight update (Miles' fully-async rollout and pace refuse it): set PAUSE_MODE=in_place or PAUSE_MODE=retract" ;;
    *) rescue_die "PAUSE_MODE='$PAUSE_MODE' is not a pause mode: set PAUSE_MODE=in_place or PAUSE_MODE=retract" ;;
  esac
  if [[ -n $PACE_WINDOW ]] &&
    ((PACE_WINDOW < ROLLOUT_BATCH_SIZE || PACE_WINDOW > (STALENESS + 1) * ROLLOUT_BATCH_SIZE)); then
    rescue_die "PACE_WINDOW=$PACE_WINDOW is outside ROLLOUT_BATCH_SIZE..(STALENESS + 1) * ROLLOUT_BATCH_SIZE = $ROLLOUT_BATCH_SIZE..$(((STALENESS + 1) * ROLLOUT_BATCH_SIZE)): set PACE_WINDOW in that range or leave it empty"
  fi
  ((MAX_RESPONSE_LEN < MAX_SEQ_LEN)) ||
    rescue_die "MAX_RESPONSE_LEN=$MAX_RESPONSE_LEN is not below MAX_SEQ_LEN=$MAX_SEQ_LEN: SGLang would refuse every request; set MAX_RESPONSE_LEN below MAX_SEQ_LEN"
  rescue_check_number TEMPERATURE 0 ""
  rescue_check_number TOP_P 0 1
  [[ $TOP_K =~ ^(-1|0|[1-9][0-9]*)$ ]] || rescue_die "TOP_K='$TOP_K' is not -1 (off) or a count: set TOP_K=-1 or TOP_K=N"
  rescue_check_number SANDBOX_CPUS 0 ""
  [[ $SANDBOX_MEMORY =~ ^[0-9]+[bkmgBKMG]?$ ]] || rescue_die "SANDBOX_MEMORY='$SANDBOX_MEMORY' is not a docker --memory size: set SANDBOX_MEMORY=10g (0: no limit)"
  rescue_check_number WATCHDOG_MAX_NO_RESULT 0 1
  rescue_check_number PILOT_MAX_INFRA 0 1
  return 0
}

# The counts, switches, seed and node rank of every launcher (the SWE and single-turn ones).
rescue_check_numbers() {
  local name value
  for name in "${RESCUE_POSITIVE[@]}" "${RESCUE_OPTIONAL_POSITIVE[@]}"; do
    value=${!name}
    [[ -z $value && " ${RESCUE_OPTIONAL_POSITIVE[*]} " == *" $name "* ]] && continue
    [[ $value =~ ^[1-9][0-9]*$ ]] || rescue_die "$name='$value' is not a positive integer: set $name=N"
  done
  for name in "${RESCUE_NON_NEGATIVE[@]}" "${RESCUE_OPTIONAL_NON_NEGATIVE[@]}"; do
    value=${!name}
    [[ -z $value && " ${RESCUE_OPTIONAL_NON_NEGATIVE[*]} " == *" $name "* ]] && continue
    [[ $value =~ ^[0-9]+$ ]] || rescue_die "$name='$value' is not a non-negative integer: set $name=N"
  done
  for name in "${RESCUE_SWITCHES[@]}"; do
    value=${!name}
    [[ $value == 0 || $value == 1 ]] || rescue_die "$name='$value': set $name=0 or $name=1"
  done
  [[ $SEED =~ ^[0-9]+$ ]] ||
    rescue_die "SEED='$SEED' is not a non-negative integer (run names end in -seedSEED, which the judge reads): set SEED=N"
  case $DUMP_STEPS in
    all | [0-9] | [1-9][0-9]*) ;;
    *) rescue_die "DUMP_STEPS='$DUMP_STEPS' is not a step count: set DUMP_STEPS=N, 0 or all" ;;
  esac
  if ((NODE_RANK >= NNODES)); then
    rescue_die "NODE_RANK='$NODE_RANK' is not in 0..$((NNODES - 1)): set NODE_RANK for this node"
  fi
  if ((NNODES > 1)) && [[ $MASTER_ADDR == 127.0.0.1 || $MASTER_ADDR == localhost ]]; then
    rescue_die "NNODES=$NNODES needs MASTER_ADDR: set MASTER_ADDR to node 0's address on every node"
  fi
  return 0
}

# The arm's own settings (ARM, A, PACE_WINDOW, BASELINE); rescue_check_settings checks the
# rest (PACE_WINDOW's range among them). A budget-regime arm (budget.sh) runs with never-drop
# for staleness and sets its estimator, Dr. GRPO and baseline population itself.
RESCUE_SWE_ARMS="$RESCUE_STALE_ARM_WORDS (stale handling), or $RESCUE_BUDGET_ARM_WORDS (budget regime, with never-drop)"
rescue_check_arm() {
  [[ -n $ARM ]] || rescue_die "ARM is not set: set ARM to $RESCUE_SWE_ARMS"
  rescue_is_stale_arm || rescue_is_budget_arm || rescue_die "ARM='$ARM' is not an arm: set ARM to $RESCUE_SWE_ARMS"
  if rescue_is_budget_arm; then rescue_budget_arm; fi
  # (a PACE_WINDOW that is not a number gets rescue_check_settings' message instead)
  if [[ $PACE_WINDOW =~ ^[1-9][0-9]*$ && $ARM != pace ]]; then
    rescue_die "PACE_WINDOW=$PACE_WINDOW applies only to ARM=pace: unset PACE_WINDOW or set ARM=pace"
  fi
  if [[ $PACE_STRAGGLER_S =~ ^[0-9]+$ && $ARM != pace ]]; then
    rescue_die "PACE_STRAGGLER_S=$PACE_STRAGGLER_S applies only to ARM=pace: unset PACE_STRAGGLER_S or set ARM=pace"
  fi
  if [[ $ARM == protect ]]; then
    [[ -n $A ]] || rescue_die "ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5"
    if ! [[ $A =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      ! awk -v a="$A" 'BEGIN { exit !(a + 0 > 0 && a + 0 <= 1) }'; then
      rescue_die "A='$A' is outside (0, 1]: set A with 0 < A <= 1"
    fi
  elif [[ -n $A ]]; then
    rescue_die "A=$A applies only to ARM=protect: unset A or set ARM=protect"
  fi
  rescue_check_estimator
}

# How a batch becomes a gradient (BASELINE, ESTIMATOR, DRGRPO_DIVISOR): an arm's, and the
# oracle replay's of its recording.
rescue_check_estimator() {
  case $BASELINE in
    all | survivors) ;;
    *) rescue_die "BASELINE='$BASELINE' is not a baseline population: set BASELINE=all or BASELINE=survivors" ;;
  esac
  case $ESTIMATOR in
    group | turn) ;;
    *) rescue_die "ESTIMATOR='$ESTIMATOR' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn" ;;
  esac
  if [[ -n $DRGRPO_DIVISOR ]]; then
    [[ $DRGRPO == 1 ]] ||
      rescue_die "DRGRPO_DIVISOR applies only to DRGRPO=1: unset DRGRPO_DIVISOR or set DRGRPO=1"
    if ! [[ $DRGRPO_DIVISOR =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      ! awk -v d="$DRGRPO_DIVISOR" 'BEGIN { exit !(d + 0 > 0) }'; then
      rescue_die "DRGRPO_DIVISOR='$DRGRPO_DIVISOR' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty"
    fi
  fi
}

# $1: the Miles entry point the launcher submits.
rescue_check_miles() {
  local script=$1
  rescue_not_slime MILES_DIR
  [[ -f $MILES_DIR/$script ]] ||
    rescue_die "no Miles checkout at MILES_DIR=$MILES_DIR ($script missing): set MILES_DIR to a Miles checkout with $script"
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

# RUN_NAME, WANDB_GROUP, SAVE_DIR, DUMP_DIR (each unless set) and WANDB_TAGS of the arm:
# swe-ARM[-aA][-kK][-est-turn][-drgrpo][-tis]-seedSEED. K names the stale-handling arms that
# drop or protect; the never-drop and budget-regime arms train every group, so K only labels
# the census. -est-turn / -drgrpo: a stale-handling arm with ESTIMATOR=turn / DRGRPO=1; -tis:
# any arm with OFFPOLICY=tis (TIS without score centering).
# RUN_PREFIX (default swe) is the first word: the slime launcher's runs are slime-ARM-...
rescue_derive_names() {
  local name="${RUN_PREFIX:-swe}-$ARM" with_k=1
  [[ $ARM == never-drop ]] || rescue_is_budget_arm && with_k=0
  [[ $ARM == protect ]] && name+="-a$A"
  [[ $with_k == 1 ]] && name+="-k$STALENESS"
  # A stale-handling arm under another estimator or Dr. GRPO is another cohort: its own
  # names, so it never resumes from (or is judged with) the default's checkpoints and runs.
  local setting=""
  if ! rescue_is_budget_arm; then
    [[ $ESTIMATOR == turn ]] && setting+="-est-turn"
    [[ $DRGRPO == 1 ]] && setting+="-drgrpo"
  fi
  # every SWE arm: TIS without score centering is another cohort
  [[ $OFFPOLICY == tis ]] && setting+="-tis"
  name+="$setting-seed$SEED"
  RUN_NAME=${RUN_NAME:-$name}
  WANDB_GROUP=${WANDB_GROUP:-$RUN_NAME}
  SAVE_DIR=${SAVE_DIR:-$OUTPUT_DIR/$RUN_NAME/checkpoints}
  DUMP_DIR=${DUMP_DIR:-$OUTPUT_DIR/$RUN_NAME/dumps}
  WANDB_TAGS="arm:$ARM,seed:$SEED"
  [[ $ARM == protect ]] && WANDB_TAGS+=",a:$A"
  [[ $with_k == 1 ]] && WANDB_TAGS+=",k:$STALENESS"
  [[ $setting == *est-turn* ]] && WANDB_TAGS+=",estimator:turn"
  [[ $setting == *drgrpo* ]] && WANDB_TAGS+=",drgrpo:1"
  [[ $OFFPOLICY == tis ]] && WANDB_TAGS+=",offpolicy:tis"
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

# ARM_FLAGS: the Miles flags of the arm. Every arm runs through rescue's buffer with the
# staleness limit (the gate reads RESCUE_ARM, rescue_runtime_env), so every arm has the same
# census and the same exclusion of groups without a result; an arm adds its own flags here,
# its rollout function first: Miles' fully-async one, or for pace rescue's subclass of it
# (Miles refuses --fully-async together with --rollout-function-path).
rescue_arm_flags() {
  ARM_FLAGS=(
    --custom-async-data-buffer-path rescue.miles.buffer.RescueDataBuffer
    --max-weight-staleness "$STALENESS"
  )
  case $ARM in
    pace) ARM_FLAGS+=(--rollout-function-path rescue.miles.pace.PaceRolloutFn) ;;
    *) ARM_FLAGS+=(--fully-async) ;;
  esac
  if rescue_is_budget_arm; then
    rescue_budget_flags
    ARM_FLAGS+=("${BUDGET_FLAGS[@]}")
  fi
}

# ARM_ENV: the runtime-env settings of the arm (the gate's, the reward hook's, pace's window).
# The budget arms' gate is never-drop.
rescue_arm_env() {
  rescue_arm_definition "$ARM" || rescue_die "ARM='$ARM' is not an arm: set ARM to $RESCUE_SWE_ARMS"
  ARM_ENV=("RESCUE_ARM=$ARM_GATE")
  case $ARM in
    protect) ARM_ENV+=("RESCUE_A=$A" "RESCUE_BASELINE=$BASELINE") ;;
    pace)
      [[ -z $PACE_WINDOW ]] || ARM_ENV+=("RESCUE_PACE_WINDOW=$PACE_WINDOW")
      ARM_ENV+=("RESCUE_PACE_STRAGGLER_S=$PACE_STRAGGLER_S")
      ;;
  esac
  if rescue_is_budget_arm; then
    rescue_budget_env
    ARM_ENV+=("${BUDGET_ENV[@]}")
  fi
}

# SHARED_FLAGS: identical in every arm except for the names derived from the arm.
rescue_shared_flags() {
  local model_args generate=rescue.miles.generate.generate
  [[ $OFFPOLICY == tis-sc ]] && generate=rescue.miles.topk.agentic_generate
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
    # sampling: the settings the pilot samples with (swe_smith_tasks/sampling.py); what the
    # request omits (min_p, repetition_penalty) is SGLang's OpenAI default, never the
    # checkpoint's generation_config
    --rollout-temperature "$TEMPERATURE" --rollout-top-p "$TOP_P" --rollout-top-k "$TOP_K"
    --rollout-max-response-len "$MAX_RESPONSE_LEN" --sglang-sampling-defaults openai
    --max-seq-len "$MAX_SEQ_LEN" --rollout-max-context-len "$MAX_SEQ_LEN"
    # weights update while generation goes on (the rollout function is the arm's)
    --pause-generation-mode "$PAUSE_MODE"
    # the SWE-smith agent behind Miles' session server: Miles' agentic generate function with
    # a refused sample assembly turned into a no-result (rescue.miles.generate), under
    # OFFPOLICY=tis-sc through rescue's recorder of every call's top-K head (rescue.miles.topk)
    --custom-generate-function-path "$generate"
    --custom-agent-function-path swe_smith_tasks.agent.run
    --custom-rm-path swe_smith_tasks.agent.reward_func
    --use-session-server --tito-model "$TITO_MODEL"
    # SGLang must parse the family's tool calls (and thinking) out of the text, and hold the
    # whole trajectory: Miles does not derive these from --tito-model
    --sglang-tool-call-parser "$TOOL_CALL_PARSER" --sglang-reasoning-parser "$REASONING_PARSER"
    --sglang-context-length "$MAX_SEQ_LEN"
    --optimizer adam --lr "$LR" --lr-decay-style constant --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.98
    # the outcome census
    --custom-rollout-log-function-path rescue.miles.log.log_rollout
    --use-wandb --wandb-mode "$WANDB_MODE" --wandb-project "$WANDB_PROJECT"
    --wandb-group "$WANDB_GROUP" --disable-wandb-random-suffix
    --wandb-dir "$OUTPUT_DIR/$RUN_NAME/wandb"
    # placement and parallelism
    --actor-num-nodes "$ACTOR_NUM_NODES" --actor-num-gpus-per-node "$ACTOR_GPUS_PER_NODE"
    --num-gpus-per-node "$GPUS_PER_NODE" --rollout-num-gpus "$ROLLOUT_NUM_GPUS"
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --pin-rollout-manager-to-head
    --use-fault-tolerance --rollout-health-check-first-wait "$HEALTH_CHECK_FIRST_WAIT"
    --tensor-model-parallel-size "$TP" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size "$CP" --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --balance-data --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
  rescue_loss_flags "$OFFPOLICY"
  SHARED_FLAGS+=("${LOSS_FLAGS[@]}")
  # every arm's rewards take one path: rescue's hook (its normalization, and the weights of
  # protect; with ESTIMATOR=turn LOSS_FLAGS has it)
  [[ $ESTIMATOR == turn ]] ||
    SHARED_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  if [[ $DUMP_STEPS != 0 ]]; then
    SHARED_FLAGS+=(--save-debug-rollout-data "$DUMP_DIR/rollout_data/{rollout_id}.pt")
  fi
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  SHARED_FLAGS+=("${extra[@]}")
}

# LOSS_FLAGS: how a batch becomes a gradient, identical in every arm (SWE and single-turn)
# and in the gradient oracle's replay: GRPO, the estimator, Dr. GRPO, the off-policy
# correction $1 (OFFPOLICY) and the train-side logging contract (update norm, trained
# advantages). none: Miles' PPO loss on-policy; tis: Miles' PPO loss with --use-tis; tis-sc:
# rescue's TIS + score-centering loss (rescue.miles.sc_loss), never with --use-tis.
rescue_loss_flags() {
  local loss=rescue.miles.loss.policy_loss
  LOSS_FLAGS=(--advantage-estimator grpo --eps-clip "$EPS_CLIP" --eps-clip-high "$EPS_CLIP_HIGH")
  case ${1:-none} in
    tis) LOSS_FLAGS+=(--use-tis) ;;
    tis-sc) loss=rescue.miles.sc_loss.policy_loss ;;
  esac
  LOSS_FLAGS+=(
    --loss-type custom_loss --custom-loss-function-path "$loss"
    --custom-megatron-before-train-step-hook-path rescue.miles.train_step.before_train_step
  )
  if [[ $ESTIMATOR == turn ]]; then
    LOSS_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  fi
  if [[ $DRGRPO == 1 ]]; then
    LOSS_FLAGS+=(
      --disable-grpo-std-normalization
      --custom-pg-loss-reducer-function-path rescue.miles.drgrpo.pg_loss_reducer
    )
  fi
}

# AGENT_VARS: the SWE agent's settings as NAME=VALUE words, the same for training and the
# pilot: the turn cap, $1 trials at once, the sandbox and the timeouts, then AGENT_ENV's words
# (which may not repeat those). The settings are checked as the agent will read them.
rescue_agent_vars() {
  AGENT_VARS=("RESCUE_SWE_STEP_LIMIT=$MAX_TURNS" "RESCUE_SWE_MAX_CONCURRENCY=$1"
    "RESCUE_SWE_CONTAINER_CPUS=$SANDBOX_CPUS" "RESCUE_SWE_CONTAINER_MEMORY=$SANDBOX_MEMORY"
    "RESCUE_SWE_CONTAINER_PIDS=$SANDBOX_PIDS" "RESCUE_SWE_TIME_BUDGET=$TIME_BUDGET"
    "RESCUE_SWE_TRIAL_TIMEOUT=$TRIAL_TIMEOUT" "RESCUE_SWE_OUTER_TIMEOUT=$((TRIAL_TIMEOUT + 1800))")
  local -a words=()
  read -ra words <<<"$AGENT_ENV"
  local kv
  for kv in "${words[@]}"; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || rescue_die "AGENT_ENV entry '$kv' is not NAME=VALUE: set AGENT_ENV='RESCUE_SWE_COMMAND_TIMEOUT=120 ...'"
    [[ " ${RESCUE_AGENT_OWN[*]} " != *" ${kv%%=*} "* ]] ||
      rescue_die "AGENT_ENV sets ${kv%%=*}, which has a setting of its own (MAX_TURNS, AGENT_CONCURRENCY, SANDBOX_CPUS, SANDBOX_MEMORY, SANDBOX_PIDS, TIME_BUDGET, TRIAL_TIMEOUT): set that instead"
    AGENT_VARS+=("$kv")
  done
  local why
  why=$(env "PYTHONPATH=$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "${AGENT_VARS[@]}" "$RESCUE_PY" -c '
from rescue.errors import InputError
from swe_smith_tasks.agent_settings import AgentSettings
try:
    AgentSettings.from_env()
except InputError as e:
    print(e)
' 2>&1) || why="RESCUE_PY=$RESCUE_PY cannot run: $why"
  [[ -z $why ]] || rescue_die "the agent's settings are refused: $why"
}

# The sandbox of the trials and the watchdog of a run, one line each (what dry runs show).
rescue_note_sandbox() {
  rescue_note "sandbox: --cpus $SANDBOX_CPUS --memory $SANDBOX_MEMORY --pids-limit $SANDBOX_PIDS, cut from the network after checkout; the agent's own time $TIME_BUDGET s, a trial $TRIAL_TIMEOUT s; $MAX_TURNS turns"
}

rescue_note_watchdog() {
  rescue_note "watchdog: stop when more than $WATCHDOG_MAX_NO_RESULT of the last $WATCHDOG_WINDOW groups have no result, or no group finishes for $WATCHDOG_IDLE_S s (0: off)"
}

# RUNTIME_ENV_JSON: what the Ray job's processes see (rescue on PYTHONPATH, the gate, the agent,
# and the wandb run id recorded for SAVE_DIR, so every life of a resumed run logs to one run).
rescue_runtime_env() {
  local pythonpath="$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}" wandb_id
  wandb_id=$(PYTHONPATH="$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$RESCUE_PY" -m swe_smith_tasks.run_record \
    wandb-id --save-dir "$SAVE_DIR" 2>&1) || rescue_die "$wandb_id"
  local -a env=(
    "PYTHONPATH=$pythonpath"
    PYTHONUNBUFFERED=1
    CUDA_DEVICE_MAX_CONNECTIONS=1
    "MASTER_ADDR=$MASTER_ADDR"
    "no_proxy=127.0.0.1,$MASTER_ADDR"
    "RESCUE_SEED=$SEED"
    "WANDB_TAGS=$WANDB_TAGS"
    "WANDB_RUN_ID=$wandb_id"
    WANDB_RESUME=allow
  )
  rescue_arm_env
  env+=("${ARM_ENV[@]}" "RESCUE_ESTIMATOR=$ESTIMATOR")
  env+=("RESCUE_WATCHDOG_WINDOW=$WATCHDOG_WINDOW" "RESCUE_WATCHDOG_MAX_NO_RESULT=$WATCHDOG_MAX_NO_RESULT"
    "RESCUE_WATCHDOG_IDLE_S=$WATCHDOG_IDLE_S")
  [[ -n $DRGRPO_DIVISOR ]] && env+=("RESCUE_DRGRPO_DIVISOR=$DRGRPO_DIVISOR")
  rescue_offpolicy_env
  env+=("${OFFPOLICY_ENV[@]}")
  [[ $EXTEND_CONTEXT == 1 ]] && env+=(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)
  rescue_agent_vars "$AGENT_CONCURRENCY"
  env+=("${AGENT_VARS[@]}")
  rescue_env_json "${env[@]}"
  RUNTIME_ENV_WORDS=("${env[@]}")
}

# ENV_REPORT_JSON: the run's rescue settings (the arm, the agent and its sandbox, the
# watchdog) for Miles' --env-report, which puts them in the wandb config
# (launcher_env_report).
rescue_env_report() {
  ENV_REPORT_JSON=$("$JOB_PYTHON" -c '
import json, sys
kv = dict(w.split("=", 1) for w in sys.argv[1:])
print(json.dumps({"rescue": {k: v for k, v in sorted(kv.items()) if k.startswith("RESCUE_")}}, separators=(",", ":")))
' "${RUNTIME_ENV_WORDS[@]}") || rescue_die "JOB_PYTHON=$JOB_PYTHON cannot run: set JOB_PYTHON to a Python 3 interpreter"
}

# The save directory against this run's settings (swe_smith_tasks/run_record.py): a run
# there is refused unless RESUME=1, and then refused when its recorded settings differ;
# a new run's settings are recorded there. $@: the trainer's flags.
rescue_check_save_dir() {
  local -a opts=(--save-dir "$SAVE_DIR" --data "$PROMPT_DATA" --env-json "$RUNTIME_ENV_JSON"
    --miles-dir "$MILES_DIR")
  [[ $RESUME == 1 ]] && opts+=(--resume)
  [[ $DRY_RUN == 1 ]] && opts+=(--dry-run)
  local out
  out=$(PYTHONPATH="$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$RESCUE_PY" -m swe_smith_tasks.run_record \
    check "${opts[@]}" -- "$@" 2>&1) || rescue_die "$out"
  rescue_note "$out"
}

# Warn, naming both, when the Miles checkout or the job's SGLang differ from the versions
# rescue is tested against (rescue/frameworks.py).
rescue_check_versions() {
  local line
  while IFS= read -r line; do
    [[ -z $line ]] || rescue_warn "$line"
  done < <(PYTHONPATH="$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$RESCUE_PY" -m swe_smith_tasks.run_record \
    versions --miles-dir "$MILES_DIR" --python "$JOB_PYTHON" 2>&1)
}

# OFFPOLICY_ENV: score centering's settings for every process (rescue.miles.sc_flags), or none.
rescue_offpolicy_env() {
  OFFPOLICY_ENV=()
  [[ $OFFPOLICY == tis-sc ]] || return 0
  awk -v p="${TOP_P:-1}" 'BEGIN { exit !(p + 0 == 1) }' ||
    rescue_die "TOP_P=$TOP_P truncates the sampler's distribution, which score centering cannot use: set TOP_P=1 or OFFPOLICY=tis"
  [[ ${TOP_K:--1} == -1 || ${TOP_K:--1} == 0 ]] ||
    rescue_die "TOP_K=$TOP_K truncates the sampler's distribution, which score centering cannot use: set TOP_K=-1 or OFFPOLICY=tis"
  OFFPOLICY_ENV=("RESCUE_SC_TOP_K=$SC_TOP_K" "RESCUE_SC_CAP=$SC_CAP")
}

# RUNTIME_ENV_JSON from NAME=VALUE words: Ray's runtime env with these variables.
rescue_env_json() {
  RUNTIME_ENV_JSON=$("$JOB_PYTHON" -c '
import json, sys
print(json.dumps({"env_vars": dict(kv.split("=", 1) for kv in sys.argv[1:])}, separators=(",", ":")))
' "$@") || rescue_die "JOB_PYTHON=$JOB_PYTHON cannot run: set JOB_PYTHON to a Python 3 interpreter"
}

# ── The gradient oracle (launch/oracle.sh) ──────────────────────────────────────────────

# The oracle's own settings and layout (one node, every GPU trains, no rollout engines);
# rescue_check_values checks the values they share with the arms.
rescue_check_oracle() {
  ((NNODES == 1)) || rescue_die "the oracle replays on one node: set NNODES=1"
  ((GPUS_PER_NODE % (TP * CP) == 0)) ||
    rescue_die "TP=$TP x CP=$CP = $((TP * CP)) does not divide GPUS_PER_NODE=$GPUS_PER_NODE (the oracle trains on every GPU): set TP, CP or GPUS_PER_NODE"
  NODE_ADDR=${NODE_ADDR:-$MASTER_ADDR}
  [[ -n $CKPT ]] || rescue_die "CKPT is not set: set CKPT to the recording run's Megatron checkpoint directory"
  if [[ ! -d $CKPT ]]; then
    local msg="CKPT=$CKPT is not a directory: set CKPT to the recording run's Megatron checkpoint directory"
    if [[ $DRY_RUN == 1 ]]; then rescue_warn "$msg (dry run continues)"; else rescue_die "$msg"; fi
  fi
  [[ -n $DUMPS ]] || rescue_die "DUMPS is not set: set DUMPS to the recording run's dump directory"
  rescue_check_estimator
  rescue_check_offpolicy chat tis tis-sc
}

# ORACLE_ROLLOUTS: replay rollouts `rescue oracle build` writes (dumped steps x arms), asked of
# rescue itself, which also validates DUMPS, ORACLE_ARMS and ORACLE_A.
rescue_oracle_rollouts() {
  ORACLE_ROLLOUTS=$(PYTHONPATH="$RESCUE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$RESCUE_PY" -W ignore - \
    "$DUMPS" "$ORACLE_ARMS" "$ORACLE_A" 2>&1 <<'PY'
import sys

from rescue.errors import InputError
from rescue.oracle.build import arm_names, dump_files

dumps, arms, a = sys.argv[1:4]
try:
    values = [float(x) for x in a.split(",") if x.strip()]
except ValueError:
    sys.exit(f"ORACLE_A='{a}' is not a comma-separated list of numbers: set ORACLE_A=0.5")
try:
    names = arm_names([x.strip() for x in arms.split(",") if x.strip()], values)
    print(len(dump_files([dumps])) * len(names))
except InputError as e:
    sys.exit(f"{e} (ORACLE_ARMS={arms}, ORACLE_A={a}, DUMPS={dumps})")
PY
  ) || rescue_die "$ORACLE_ROLLOUTS"
}

# ORACLE_FLAGS: Miles' train.py replaying the arms at CKPT without an optimizer, with the
# recording run's model, batch and loss (LOSS_FLAGS); one optimizer step (one gradient) per
# replayed arm. The reward hook is always on: the protect arms' 1/a weights need it.
rescue_oracle_flags() {
  local model_args
  model_args=$(rescue_model_args)
  local -a model=()
  read -ra model <<<"$model_args"
  rescue_loss_flags "$OFFPOLICY"
  ORACLE_FLAGS=(
    "${model[@]}"
    --hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD" --load "$CKPT"
  )
  [[ -z $CKPT_STEP ]] || ORACLE_FLAGS+=(--ckpt-step "$CKPT_STEP")
  ORACLE_FLAGS+=(
    # the replay: every arm of every dumped step, at the checkpoint's weights
    --load-debug-rollout-data "$ORACLE_DIR/rollout_data/{rollout_id}.pt"
    --start-rollout-id 0 --num-rollout "$ORACLE_ROLLOUTS" --debug-disable-optimizer
    --prompt-data "$PROMPT_DATA" --input-key prompt --metadata-key metadata --seed "$SEED"
    --rollout-batch-size "$ROLLOUT_BATCH_SIZE" --n-samples-per-prompt "$N_SAMPLES"
    --global-batch-size "$((ROLLOUT_BATCH_SIZE * N_SAMPLES))"
    --rollout-max-response-len "$MAX_RESPONSE_LEN" --max-seq-len "$MAX_SEQ_LEN"
    --rollout-max-context-len "$MAX_SEQ_LEN"
    # the temperature the recording sampled at: the loss divides the logits by it
    --rollout-temperature "$TEMPERATURE"
    "${LOSS_FLAGS[@]}"
  )
  [[ $ESTIMATOR == turn ]] ||
    ORACLE_FLAGS+=(--custom-reward-post-process-path rescue.miles.reward.post_process_rewards)
  # score centering: the replay publishes the heads its dumps kept (rescue.miles.log)
  [[ $OFFPOLICY != tis-sc ]] ||
    ORACLE_FLAGS+=(--custom-rollout-log-function-path rescue.miles.log.log_rollout)
  ORACLE_FLAGS+=(
    # one node, every GPU trains
    --actor-num-nodes 1 --actor-num-gpus-per-node "$GPUS_PER_NODE" --num-gpus-per-node "$GPUS_PER_NODE"
    --tensor-model-parallel-size "$TP" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size "$CP" --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
  local -a extra=()
  read -ra extra <<<"$EXTRA_ARGS"
  ORACLE_FLAGS+=("${extra[@]}")
}


# ── Ray ─────────────────────────────────────────────────────────────────────────────────

# More words of `ray start` (RAY_START_EXTRA) and its environment (RAY_START_ENV); the
# single-turn launchers add their run slots and Ray's job-start timeout.
RAY_START_EXTRA=()
RAY_START_ENV=()

# Ray on this node, started as its own session: every process Ray starts (GCS, raylet,
# workers, Miles' session server and SGLang engines) keeps that session id, which is
# recorded, so a later run stops exactly these (RAY_STOP=1) and nothing else on the node.
rescue_ray_start() {
  [[ $RAY_STOP == 1 ]] && rescue_stop_recorded ray
  local -a cmd=(ray start)
  if [[ $NODE_RANK == 0 ]]; then
    cmd+=(--head --node-ip-address "$NODE_ADDR" --port "$RAY_PORT" --dashboard-port "$RAY_DASHBOARD_PORT")
  else
    cmd+=(--address "$MASTER_ADDR:$RAY_PORT" --node-ip-address "$NODE_ADDR")
  fi
  cmd+=(--num-gpus "$GPUS_PER_NODE" "${RAY_START_EXTRA[@]}" --disable-usage-stats)
  ((${#RAY_START_ENV[@]} == 0)) || cmd=(env "${RAY_START_ENV[@]}" "${cmd[@]}")
  rescue_spawn ray wait "${cmd[@]}"
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

# The budget-regime arms' settings, shared with the single-turn launchers.
# shellcheck source=budget.sh
source "$LAUNCH_DIR/budget.sh"
# The model family and the GPU layout, derived from the checked settings.
# shellcheck source=derive.sh
source "$LAUNCH_DIR/derive.sh"
# The processes a launcher starts and stops on a node, and the housekeeper's pruning.
# shellcheck source=node.sh
source "$LAUNCH_DIR/node.sh"
