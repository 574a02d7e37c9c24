#!/usr/bin/env bash
# `make reap`: remove the task containers trials left behind on this node (rescue swe reap;
# settings in launch/config.sh, REAP_ARGS e.g. '--older-than 7200' or '--dry-run').
set -euo pipefail

RESCUE_PROG=reap
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

read -ra reap_args <<<"$REAP_ARGS"
rescue_cli swe reap "${reap_args[@]}"
