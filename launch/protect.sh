#!/usr/bin/env bash
# The protect arm: launch/swe_arm.sh with ARM=protect (settings in launch/config.sh).
set -euo pipefail
ARM=protect exec "$(dirname "${BASH_SOURCE[0]}")/swe_arm.sh" "$@"
