#!/usr/bin/env bash
# `make swe-prepare`: SWE-smith rows -> Miles prompt JSONL (settings in launch/config.sh).
#
# Writes TASKS_JSONL (every task: the pilot's input) and its reference solutions beside it,
# and, once the pilot has written SUBSET_FILE and make swe-validate VALIDATE_OUT/subset.txt,
# PROMPT_DATA (the validated subset: the training prompts). The order is
#   make swe-prepare; make pilot; make swe-validate; make swe-prepare
# With REQUIRE_VALIDATE=0 the pilot's subset is taken as it is.
set -euo pipefail

RESCUE_PROG=swe-prepare
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_numbers
prepare=(swe prepare --source "$SWE_DATASET" --split "$SWE_SPLIT"
  --image-namespace "$IMAGE_NAMESPACE")
if [[ $DRY_RUN != 1 ]]; then mkdir -p "$(dirname "$TASKS_JSONL")" "$(dirname "$PROMPT_DATA")"; fi
rescue_cli "${prepare[@]}" --out "$TASKS_JSONL"
validated=$VALIDATE_OUT/subset.txt
if [[ -s $SUBSET_FILE && $REQUIRE_VALIDATE == 1 ]]; then
  [[ -s $validated || $DRY_RUN == 1 ]] ||
    rescue_die "no validated subset at $validated: run make swe-validate (or REQUIRE_VALIDATE=0 to train on SUBSET_FILE as it is)"
  [[ ! $SUBSET_FILE -nt $validated ]] ||
    rescue_die "$validated is older than SUBSET_FILE=$SUBSET_FILE: rerun make swe-validate"
  rescue_cli "${prepare[@]}" --subset "$validated" --out "$PROMPT_DATA"
elif [[ -s $SUBSET_FILE ]]; then
  rescue_cli "${prepare[@]}" --subset "$SUBSET_FILE" --out "$PROMPT_DATA"
else
  rescue_note "no pilot subset at SUBSET_FILE=$SUBSET_FILE yet: run make pilot, then make swe-prepare again to write PROMPT_DATA=$PROMPT_DATA"
fi
