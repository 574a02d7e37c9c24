#!/usr/bin/env bash
# `make swe-prepare`: SWE-smith rows -> Miles prompt JSONL (settings in launch/config.sh).
#
# Writes TASKS_JSONL (every task: the pilot's input) and, once the pilot has written
# SUBSET_FILE, PROMPT_DATA (the pilot's subset: the training prompts). The order is
#   make swe-prepare; make pilot; make swe-prepare
set -euo pipefail

RESCUE_PROG=swe-prepare
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

prepare=(swe prepare --source "$SWE_DATASET" --split "$SWE_SPLIT"
  --image-namespace "$IMAGE_NAMESPACE")
if [[ $DRY_RUN != 1 ]]; then mkdir -p "$(dirname "$TASKS_JSONL")" "$(dirname "$PROMPT_DATA")"; fi
rescue_cli "${prepare[@]}" --out "$TASKS_JSONL"
if [[ -s $SUBSET_FILE ]]; then
  rescue_cli "${prepare[@]}" --subset "$SUBSET_FILE" --out "$PROMPT_DATA"
else
  rescue_note "no pilot subset at SUBSET_FILE=$SUBSET_FILE yet: run make pilot, then make swe-prepare again to write PROMPT_DATA=$PROMPT_DATA"
fi
