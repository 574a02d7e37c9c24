#!/usr/bin/env bash
# The drop arm: launch/swe_arm.sh with ARM=drop (settings in launch/config.sh).
set -euo pipefail
ARM=drop exec "$(dirname "${BASH_SOURCE[0]}")/swe_arm.sh" "$@"
