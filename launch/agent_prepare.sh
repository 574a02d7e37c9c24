#!/usr/bin/env bash
# `make agent-prepare ENV=cooking|alfworld`: the games of the text-game arms and their prompt
# rows (PROMPT_DATA). cooking: TextWorld's tw-make makes GAMES games per difficulty level
# from GAME_SEED into GAMES_DIR (offline). alfworld: ALFWorld's own alfworld-download fetches
# its data into ALFWORLD_DATA (needs the network once; existing files are kept), then the
# rows of ALFWORLD_SPLIT. Settings: launch/agent_config.sh.
set -euo pipefail

RESCUE_PROG=agent-prepare
# shellcheck source=agent_config.sh
source "$(dirname "${BASH_SOURCE[0]}")/agent_config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"
# shellcheck source=rlvr.sh
source "$LAUNCH_DIR/rlvr.sh"
# shellcheck source=agent.sh
source "$LAUNCH_DIR/agent.sh"

rescue_agent_check
case $ENV in
  cooking)
    rescue_cli agent prepare --env cooking --games-dir "$GAMES_DIR" --out "$PROMPT_DATA" \
      --games "$GAMES" --seed "$GAME_SEED" --cap "$CAP"
    ;;
  alfworld)
    download=$(dirname "$RESCUE_PY")/alfworld-download
    [[ -x $download ]] || download=alfworld-download
    rescue_run env "ALFWORLD_DATA=$ALFWORLD_DATA" "$download" --data-dir "$ALFWORLD_DATA"
    rescue_cli "ALFWORLD_DATA=$ALFWORLD_DATA" agent prepare --env alfworld \
      --data-dir "$ALFWORLD_DATA" --split "$ALFWORLD_SPLIT" --out "$PROMPT_DATA"
    ;;
esac
rescue_note "next: make agent-arm ENV=$ENV ARM=$(IFS="|" && echo "${RESCUE_AGENT_ARM_LIST[*]}")"
