#!/usr/bin/env bash
# `make pilot`: PILOT_N trials per task of TASKS_JSONL with the model to be trained; writes
# the subset of tasks whose success rate lies in [PILOT_LOW, PILOT_HIGH], with at most
# PILOT_MAX_INFRA of infrastructure faults, to SUBSET_FILE (settings in launch/config.sh).
# Interrupted, it resumes where it stopped.
#
# First (PILOT_PULL=1) the images of the pilot's tasks are pulled; a task whose pull fails is
# reported and skipped, never tried. Without PILOT_BASE_URL it serves HF_CHECKPOINT with
# SGLang on this node for the pilot's duration, as training serves it: the same context
# (MAX_SEQ_LEN), tool-call and reasoning parsers, chat template (TITO_MODEL) and sampling
# defaults (--sampling-defaults openai). A server an earlier pilot left running is stopped
# first (its recorded session only). Before any trial, `rescue swe probe` checks that the
# endpoint returns the agent's tool calls in tool_calls (naming the missing flag if not) and
# fills omitted sampling parameters as training's engines do. The trials sample with
# training's settings (TEMPERATURE, TOP_P, TOP_K, MAX_RESPONSE_LEN, the family's
# chat_template_kwargs) in training's sandbox (SANDBOX_*, TIME_BUDGET, TRIAL_TIMEOUT).
set -euo pipefail

RESCUE_PROG=pilot
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_settings
[[ -s $TASKS_JSONL || $DRY_RUN == 1 ]] ||
  rescue_die "no TASKS_JSONL=$TASKS_JSONL: run make swe-prepare first"
[[ -n $PILOT_TASKS || $PILOT_ALL == 1 ]] ||
  rescue_die "PILOT_TASKS is empty: set PILOT_TASKS=N to pilot a random sample of N tasks, or PILOT_ALL=1 to pilot every task of TASKS_JSONL"

# The agent plays the pilot with the training settings (turn cap, sandbox, AGENT_ENV).
rescue_agent_vars "$PILOT_CONCURRENCY"
rescue_note_sandbox

# The images first: a pull that fails is reported per task, not booked as a trial's fault.
if [[ $PILOT_PULL == 1 ]]; then
  pull=(swe pull --tasks "$TASKS_JSONL" --out "$PILOT_OUT" --seed "$SEED")
  [[ -n $PILOT_TASKS ]] && pull+=(--max-tasks "$PILOT_TASKS")
  [[ $DRY_RUN == 1 ]] || mkdir -p "$PILOT_OUT"
  rescue_cli "RESCUE_DOCKER=$RESCUE_DOCKER" "${pull[@]}" ||
    rescue_die "no task image could be pulled (above): check Docker and IMAGE_NAMESPACE"
fi

base_url=$PILOT_BASE_URL
if [[ -z $base_url ]]; then
  rescue_check_gpus
  if [[ -n $CHAT_TEMPLATE && ! -f $CHAT_TEMPLATE ]]; then
    rescue_die "no chat template $CHAT_TEMPLATE for TITO_MODEL=$TITO_MODEL: set MILES_DIR to the Miles checkout training uses"
  fi
  base_url=http://127.0.0.1:$PILOT_PORT
  server=("$JOB_PYTHON" -m sglang.launch_server --model-path "$HF_CHECKPOINT"
    --served-model-name "$PILOT_MODEL" --host 127.0.0.1 --port "$PILOT_PORT"
    --dp-size "$GPUS_PER_NODE" --context-length "$MAX_SEQ_LEN"
    --tool-call-parser "$TOOL_CALL_PARSER" --reasoning-parser "$REASONING_PARSER"
    --sampling-defaults openai)
  [[ -n $CHAT_TEMPLATE ]] && server+=(--chat-template "$CHAT_TEMPLATE")
  [[ $EXTEND_CONTEXT == 1 ]] && server=(env SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 "${server[@]}")
  [[ $RAY_STOP == 1 ]] && rescue_stop_recorded pilot-sglang
  if [[ $DRY_RUN == 1 ]]; then
    rescue_spawn pilot-sglang background "${server[@]}"
    rescue_note "wait up to PILOT_WAIT_S=$PILOT_WAIT_S s for $base_url/health; stop the server when the pilot ends"
  else
    mkdir -p "$PILOT_OUT"
    rescue_spawn pilot-sglang background "${server[@]}" >"$PILOT_OUT/sglang.log" 2>&1
    SERVER_SID=$SPAWNED_SID
    trap 'rescue_stop_recorded pilot-sglang' EXIT
    deadline=$((SECONDS + PILOT_WAIT_S))
    until "$JOB_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
      "$base_url/health" 2>/dev/null; do
      kill -0 "$SERVER_SID" 2>/dev/null ||
        rescue_die "the SGLang server exited (log: $PILOT_OUT/sglang.log): fix it or set PILOT_BASE_URL"
      ((SECONDS < deadline)) ||
        rescue_die "the SGLang server did not answer within PILOT_WAIT_S=$PILOT_WAIT_S s (log: $PILOT_OUT/sglang.log)"
      sleep 5
    done
  fi
fi

# The endpoint must return tool calls where mini-swe-agent reads them, and fill what a
# request omits as training's engines do.
rescue_cli swe probe --base-url "$base_url" --model "$PILOT_MODEL" \
  --tool-call-parser "$TOOL_CALL_PARSER" --reasoning-parser "$REASONING_PARSER" \
  --chat-template-kwargs "$CHAT_TEMPLATE_KWARGS" --check-sampling ||
  rescue_die "the endpoint $base_url fails the tool-call probe or the sampling check (above): fix the server's flags, then rerun"

pilot=(swe pilot --tasks "$TASKS_JSONL" --out "$PILOT_OUT"
  --base-url "$base_url" --model "$PILOT_MODEL" --n "$PILOT_N" --concurrency "$PILOT_CONCURRENCY"
  --seed "$SEED" --temperature "$TEMPERATURE" --top-p "$TOP_P" --top-k "$TOP_K"
  --max-tokens "$MAX_RESPONSE_LEN" --chat-template-kwargs "$CHAT_TEMPLATE_KWARGS"
  --low "$PILOT_LOW" --high "$PILOT_HIGH" --max-infra-fraction "$PILOT_MAX_INFRA")
[[ -n $PILOT_TASKS ]] && pilot+=(--max-tasks "$PILOT_TASKS")
[[ $PILOT_RETRY_INFRA == 1 ]] && pilot+=(--retry-infra)
rescue_cli "${AGENT_VARS[@]}" "${pilot[@]}"
if [[ $DRY_RUN != 1 && "$PILOT_OUT/subset.txt" != "$SUBSET_FILE" ]]; then
  cp "$PILOT_OUT/subset.txt" "$SUBSET_FILE"
fi
rescue_note "next: make swe-validate (the subset's reference solutions under the grader), then make swe-prepare"
