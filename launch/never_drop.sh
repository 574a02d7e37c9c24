#!/usr/bin/env bash
# The never-drop arm: launch/swe_arm.sh with ARM=never-drop (settings in launch/config.sh).
set -euo pipefail
ARM=never-drop exec "$(dirname "${BASH_SOURCE[0]}")/swe_arm.sh" "$@"
