#!/usr/bin/env bash
# `make rlvr-calibrate`: the length cap of the single-turn arms. Samples the initial policy
# (HF_CHECKPOINT) CAL_N times on CAL_PROMPTS prompts of PROMPT_DATA through SGLang at the
# largest of CAL_CAPS, and writes to CAP_FILE the smallest candidate cap whose truncation
# rate lies in [CAL_LOW, CAL_HIGH]; when none does it writes nothing and shows every rate.
# Settings: launch/rlvr_config.sh.
#
# Without CAL_BASE_URL it serves HF_CHECKPOINT with SGLang on this node for the calibration
# (GPUS_PER_NODE data-parallel replicas at CAL_PORT); a server an earlier calibration left
# running is stopped first (its recorded session only).
set -euo pipefail

RESCUE_PROG=rlvr-calibrate
# shellcheck source=rlvr_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/rlvr_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"
# shellcheck source=rlvr.sh
source "$LAUNCH_DIR/rlvr.sh"

rescue_rlvr_check
[[ -s $PROMPT_DATA || $DRY_RUN == 1 ]] || rescue_die "no PROMPT_DATA=$PROMPT_DATA: run make rlvr-prepare first"

base_url=$CAL_BASE_URL
if [[ -z $base_url ]]; then
  rescue_check_gpus
  base_url=http://127.0.0.1:$CAL_PORT
  log=$(dirname "$CAP_FILE")/sglang.log
  server=("$JOB_PYTHON" -m sglang.launch_server --model-path "$HF_CHECKPOINT"
    --host 127.0.0.1 --port "$CAL_PORT" --dp-size "$GPUS_PER_NODE")
  [[ $RAY_STOP == 1 ]] && rescue_stop_recorded calibrate-sglang
  if [[ $DRY_RUN == 1 ]]; then
    rescue_spawn calibrate-sglang background "${server[@]}"
    rescue_note "wait up to CAL_WAIT_S=$CAL_WAIT_S s for $base_url/health; stop the server when the calibration ends"
  else
    mkdir -p "$(dirname "$log")"
    rescue_spawn calibrate-sglang background "${server[@]}" >"$log" 2>&1
    SERVER_SID=$SPAWNED_SID
    trap 'rescue_stop_recorded calibrate-sglang' EXIT
    deadline=$((SECONDS + CAL_WAIT_S))
    until "$JOB_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
      "$base_url/health" 2>/dev/null; do
      kill -0 "$SERVER_SID" 2>/dev/null ||
        rescue_die "the SGLang server exited (log: $log): fix it or set CAL_BASE_URL"
      ((SECONDS < deadline)) ||
        rescue_die "the SGLang server did not answer within CAL_WAIT_S=$CAL_WAIT_S s (log: $log)"
      sleep 5
    done
  fi
fi

rescue_cli rlvr calibrate --data "$PROMPT_DATA" --model "$HF_CHECKPOINT" --base-url "$base_url" \
  --caps "$CAL_CAPS" --out "$CAP_FILE" --prompts "$CAL_PROMPTS" --n "$CAL_N" \
  --low "$CAL_LOW" --high "$CAL_HIGH" --temperature "$TEMPERATURE" --seed "$SEED" \
  --concurrency "$CAL_CONCURRENCY"
rescue_note "next: make rlvr-arm ARM=... (reads CAP_FILE=$CAP_FILE) or make rlvr-sweep"
