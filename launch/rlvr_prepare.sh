#!/usr/bin/env bash
# `make rlvr-prepare`: GSM8K or MATH rows -> the prompt JSONL of the single-turn arms
# (PROMPT_DATA), from RLVR_SOURCE (a Hugging Face dataset name or a local file; empty: the
# dataset's default) in RLVR_DATASET's schema. Settings: launch/rlvr_config.sh.
set -euo pipefail

RESCUE_PROG=rlvr-prepare
# shellcheck source=rlvr_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/rlvr_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"
# shellcheck source=rlvr.sh
source "$LAUNCH_DIR/rlvr.sh"

rescue_rlvr_check
prepare=(rlvr prepare --dataset "$RLVR_DATASET" --split "$RLVR_SPLIT" --out "$PROMPT_DATA")
[[ -n $RLVR_SOURCE ]] && prepare+=(--source "$RLVR_SOURCE")
rescue_cli "${prepare[@]}"
rescue_note "graded with --rm-type $RM_TYPE; next: make rlvr-calibrate (writes CAP_FILE=$CAP_FILE)"
