#!/usr/bin/env bash
# The pace arm: launch/swe_arm.sh with ARM=pace (settings in launch/config.sh).
set -euo pipefail
ARM=pace exec "$(dirname "${BASH_SOURCE[0]}")/swe_arm.sh" "$@"
