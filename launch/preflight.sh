#!/usr/bin/env bash
# Pre-flight of an SWE arm: checks and reports, one line each, before anything is
# submitted. Settings (and their defaults) are in launch/config.sh.
#
#   gpus      GPUS_PER_NODE GPUs visible
#   docker    the Docker engine answers (`docker info`)
#   data      PROMPT_DATA exists (written by `make swe-prepare`)
#   images    every task image of PROMPT_DATA is present locally; the missing ones are
#             listed, with the pulls needed written to OUTPUT_DIR/pulls-needed.txt
#             (PULL_IMAGES=1 pulls them now)
#   wandb     WANDB_MODE, and a key for online mode
#   disk      DUMP_STEPS * DUMP_MB_PER_STEP MB free where the dumps go
#   context   HF_CHECKPOINT's position limit covers MAX_SEQ_LEN
#   imports   JOB_PYTHON imports miles, rescue.miles and swe_smith_tasks.agent
#
# Exit status 1 when any check fails; warnings do not fail.
set -euo pipefail

RESCUE_PROG=preflight
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

read -ra DOCKER <<<"$RESCUE_DOCKER"
FAILED=0

ok() { printf 'ok    %-8s %s\n' "$1" "$2"; }
warn() { printf 'WARN  %-8s %s\n' "$1" "$2"; }
fail() {
  printf 'FAIL  %-8s %s\n' "$1" "$2"
  FAILED=1
}

# gpus
n=$(rescue_gpu_count)
if ((n >= GPUS_PER_NODE)); then ok gpus "$n visible (GPUS_PER_NODE=$GPUS_PER_NODE)"; else
  fail gpus "$n visible, need GPUS_PER_NODE=$GPUS_PER_NODE: run on a GPU node"
fi

# docker
docker_ok=0
if ! command -v "${DOCKER[0]}" >/dev/null 2>&1; then
  fail docker "no docker client on PATH: install Docker"
elif version=$(timeout 20 "${DOCKER[@]}" info --format '{{.ServerVersion}}' 2>/dev/null) && [[ -n $version ]]; then
  ok docker "engine $version reachable"
  docker_ok=1
else
  fail docker "the Docker engine does not answer (docker info): start dockerd or set DOCKER_HOST"
fi

# data and images
if [[ ! -s $PROMPT_DATA ]]; then
  fail data "no PROMPT_DATA=$PROMPT_DATA: run make swe-prepare (after make pilot)"
else
  ok data "$PROMPT_DATA ($(wc -l <"$PROMPT_DATA") tasks)"
  images=$("$JOB_PYTHON" - "$PROMPT_DATA" <<'PY'
import json
import sys

seen = {}
with open(sys.argv[1]) as f:
    for line in f:
        if line.strip():
            meta = json.loads(line).get("metadata") or {}
            image = meta.get("image") or meta.get("image_name")
            if image:
                seen.setdefault(image, None)
print("\n".join(seen))
PY
  ) || images=""
  if [[ -z $images ]]; then
    fail images "no metadata.image in $PROMPT_DATA: rerun make swe-prepare"
  elif [[ $docker_ok == 1 ]]; then
    missing=()
    while IFS= read -r image; do
      "${DOCKER[@]}" image inspect "$image" >/dev/null 2>&1 || missing+=("$image")
    done <<<"$images"
    total=$(grep -c . <<<"$images")
    if ((${#missing[@]} == 0)); then
      ok images "all $total task images present locally"
    elif [[ $PULL_IMAGES == 1 ]]; then
      for image in "${missing[@]}"; do "${DOCKER[@]}" pull "$image" >/dev/null || fail images "docker pull $image failed"; done
      ok images "pulled ${#missing[@]} of $total task images"
    else
      mkdir -p "$OUTPUT_DIR"
      printf 'docker pull %s\n' "${missing[@]}" >"$OUTPUT_DIR/pulls-needed.txt"
      fail images "${#missing[@]} of $total task images missing; pulls needed in $OUTPUT_DIR/pulls-needed.txt (or PULL_IMAGES=1):"
      printf '        docker pull %s\n' "${missing[@]}"
    fi
  else
    warn images "not checked: the Docker engine does not answer"
  fi
fi

# wandb
case $WANDB_MODE in
  online)
    if [[ -n ${WANDB_API_KEY:-} ]] || grep -qs 'api.wandb.ai' "$HOME/.netrc"; then
      ok wandb "online, project $WANDB_PROJECT"
    else
      fail wandb "WANDB_MODE=online but no WANDB_API_KEY (or ~/.netrc login): export WANDB_API_KEY or set WANDB_MODE=offline"
    fi
    ;;
  offline) ok wandb "offline: sync later with wandb sync $OUTPUT_DIR/<run>/wandb" ;;
  disabled) warn wandb "disabled: the census reaches no dashboard" ;;
  *) fail wandb "WANDB_MODE='$WANDB_MODE': set WANDB_MODE=online, offline or disabled" ;;
esac

# disk
if [[ $DUMP_STEPS == 0 ]]; then
  ok disk "no rollout dumps (DUMP_STEPS=0)"
else
  dir=$OUTPUT_DIR
  while [[ ! -d $dir ]]; do dir=$(dirname "$dir"); done
  free_mb=$(df -Pm "$dir" | awk 'NR == 2 { print $4 }')
  if [[ $DUMP_STEPS == all ]]; then
    need_mb=$((NUM_ROLLOUT * DUMP_MB_PER_STEP))
  else
    need_mb=$((DUMP_STEPS * DUMP_MB_PER_STEP))
  fi
  if ((free_mb >= need_mb)); then ok disk "$free_mb MB free at $dir, dumps need about $need_mb MB"; else
    fail disk "$free_mb MB free at $dir, dumps need about $need_mb MB: free space, move OUTPUT_DIR or lower DUMP_STEPS"
  fi
fi

# context
if [[ -f $HF_CHECKPOINT/config.json ]]; then
  positions=$("$JOB_PYTHON" - "$HF_CHECKPOINT/config.json" <<'PY'
import json
import sys

c = json.load(open(sys.argv[1]))
rope = c.get("rope_scaling") or {}
base = rope.get("original_max_position_embeddings") or c.get("max_position_embeddings") or 0
print(int(max(c.get("max_position_embeddings") or 0, base * float(rope.get("factor") or 1))))
PY
  ) || positions=0
  if ((positions >= MAX_SEQ_LEN)); then ok context "$positions positions >= MAX_SEQ_LEN=$MAX_SEQ_LEN"; else
    fail context "$HF_CHECKPOINT allows $positions positions < MAX_SEQ_LEN=$MAX_SEQ_LEN: add YaRN rope_scaling to its config.json or lower MAX_SEQ_LEN"
  fi
else
  fail context "no $HF_CHECKPOINT/config.json: set HF_CHECKPOINT to the Hugging Face checkpoint"
fi

# imports
if PYTHONPATH="$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  "$JOB_PYTHON" -c 'import miles, rescue.miles, swe_smith_tasks.agent' 2>/dev/null; then
  ok imports "$JOB_PYTHON imports miles, rescue.miles, swe_smith_tasks.agent"
else
  fail imports "$JOB_PYTHON cannot import miles, rescue.miles and swe_smith_tasks.agent: pip install -e ${RESCUE_DIR}'[swe]' into it, or set JOB_PYTHON"
fi

if ((FAILED)); then
  printf '%s: failed; fix the FAIL lines above (or skip with PREFLIGHT=0)\n' "$RESCUE_PROG" >&2
  exit 1
fi
