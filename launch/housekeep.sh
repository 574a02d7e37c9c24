#!/usr/bin/env bash
# The housekeeper of one SWE run on node 0 (started by launch/swe_arm.sh as its own
# session, its id recorded in RUN_STATE_DIR/housekeeper.sid): every HOUSEKEEP_S seconds it
# deletes the rollout dumps of steps >= DUMP_STEPS and the checkpoints beyond the CKPT_KEEP
# newest, until the Ray job SUBMISSION_ID has ended (succeeded, failed or stopped), or Ray
# has not answered ten times in a row. It depends on nothing but the Ray cluster: the shell
# that submitted the job may go away. Settings in launch/config.sh.
set -uo pipefail

RESCUE_PROG=housekeeper
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

: "${DUMP_DIR:?set DUMP_DIR}" "${SAVE_DIR:?set SAVE_DIR}" "${SUBMISSION_ID:?set SUBMISSION_ID}"
rescue_check_settings

silent=0
while :; do
  rescue_prune_dumps
  rescue_prune_checkpoints
  rescue_job_state "$SUBMISSION_ID"
  case $RESCUE_JOB_STATE in
    succeeded | failed | stopped)
      printf '%s: job %s ended: %s\n' "$RESCUE_PROG" "$SUBMISSION_ID" "$(tail -n 1 <<<"$RESCUE_JOB_STATUS")"
      break
      ;;
    silent) silent=$((silent + 1)) ;;
    *) silent=0 ;;
  esac
  if ((silent >= 10)); then
    printf '%s: Ray did not answer 10 times in a row, stopping: %s\n' "$RESCUE_PROG" "$RESCUE_JOB_STATUS"
    break
  fi
  sleep "$HOUSEKEEP_S"
done
rescue_prune_dumps
rescue_prune_checkpoints
