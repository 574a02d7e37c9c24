#!/usr/bin/env bash
# `make pilot`: PILOT_N trials per task of TASKS_JSONL with the model to be trained; writes
# the subset of tasks whose success rate lies in [PILOT_LOW, PILOT_HIGH] to SUBSET_FILE
# (settings in launch/config.sh). Interrupted, it resumes where it stopped.
#
# Without PILOT_BASE_URL it serves HF_CHECKPOINT with SGLang on this node for the pilot's
# duration and stops that server afterwards.
set -euo pipefail

RESCUE_PROG=pilot
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

[[ -s $TASKS_JSONL || $DRY_RUN == 1 ]] ||
  rescue_die "no TASKS_JSONL=$TASKS_JSONL: run make swe-prepare first"

# The agent plays the pilot with the training settings (turn cap and AGENT_ENV).
rescue_agent_vars "$PILOT_CONCURRENCY"

base_url=$PILOT_BASE_URL
if [[ -z $base_url ]]; then
  rescue_check_gpus
  base_url=http://127.0.0.1:$PILOT_PORT
  server=("$JOB_PYTHON" -m sglang.launch_server --model-path "$HF_CHECKPOINT"
    --served-model-name "$PILOT_MODEL" --host 127.0.0.1 --port "$PILOT_PORT"
    --dp-size "$GPUS_PER_NODE" --context-length "$MAX_SEQ_LEN")
  if [[ $DRY_RUN == 1 ]]; then
    rescue_print_cmd "${server[@]}"
    rescue_note "wait up to PILOT_WAIT_S=$PILOT_WAIT_S s for $base_url/health; stop the server when the pilot ends"
  else
    mkdir -p "$PILOT_OUT"
    printf '+ %s &\n' "$(rescue_print_cmd "${server[@]}")" >&2
    "${server[@]}" >"$PILOT_OUT/sglang.log" 2>&1 &
    SERVER_PID=$!
    trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
    deadline=$((SECONDS + PILOT_WAIT_S))
    until "$JOB_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
      "$base_url/health" 2>/dev/null; do
      kill -0 "$SERVER_PID" 2>/dev/null ||
        rescue_die "the SGLang server exited (log: $PILOT_OUT/sglang.log): fix it or set PILOT_BASE_URL"
      ((SECONDS < deadline)) ||
        rescue_die "the SGLang server did not answer within PILOT_WAIT_S=$PILOT_WAIT_S s (log: $PILOT_OUT/sglang.log)"
      sleep 5
    done
  fi
fi

pilot=(swe pilot --tasks "$TASKS_JSONL" --out "$PILOT_OUT"
  --base-url "$base_url" --model "$PILOT_MODEL" --n "$PILOT_N" --concurrency "$PILOT_CONCURRENCY"
  --seed "$SEED" --temperature "$TEMPERATURE" --max-tokens "$MAX_RESPONSE_LEN"
  --low "$PILOT_LOW" --high "$PILOT_HIGH")
[[ -n $PILOT_TASKS ]] && pilot+=(--max-tasks "$PILOT_TASKS")
rescue_cli "${AGENT_VARS[@]}" "${pilot[@]}"
if [[ $DRY_RUN != 1 && "$PILOT_OUT/subset.txt" != "$SUBSET_FILE" ]]; then
  cp "$PILOT_OUT/subset.txt" "$SUBSET_FILE"
fi
rescue_note "next: make swe-prepare (writes PROMPT_DATA from SUBSET_FILE=$SUBSET_FILE)"
