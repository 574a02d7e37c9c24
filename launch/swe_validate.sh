#!/usr/bin/env bash
# `make swe-validate`: the grader under load, before any training. The reference solution of
# every task of SUBSET_FILE (the pilot's subset) is graded in the training sandbox (SANDBOX_*,
# TRIAL_TIMEOUT), AGENT_CONCURRENCY tasks at once, by the grader the trials use; the fraction
# resolved is reported (expected about 100%). VALIDATE_OUT/subset.txt is the subset without
# the tasks whose reference does not resolve (listed with the reason in
# VALIDATE_OUT/summary.md); make swe-prepare then writes PROMPT_DATA from it. Settings (and
# their defaults) are in launch/config.sh.
set -euo pipefail

RESCUE_PROG=swe-validate
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_settings
[[ -s $TASKS_JSONL || $DRY_RUN == 1 ]] ||
  rescue_die "no TASKS_JSONL=$TASKS_JSONL: run make swe-prepare first"
[[ -s $SUBSET_FILE || $DRY_RUN == 1 ]] ||
  rescue_die "no SUBSET_FILE=$SUBSET_FILE: run make pilot first"

rescue_agent_vars "$AGENT_CONCURRENCY"
rescue_note_sandbox
rescue_cli "${AGENT_VARS[@]}" swe validate --tasks "$TASKS_JSONL" --subset "$SUBSET_FILE" \
  --out "$VALIDATE_OUT" --concurrency "$AGENT_CONCURRENCY"
rescue_note "next: make swe-prepare (writes PROMPT_DATA from VALIDATE_OUT/subset.txt)"
