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
#   remote    a container of the first task's image reaches the task repositories' remote
#             (`git ls-remote origin`): an instance branch missing from an image is fetched
#             at checkout. Unreachable is a warning when the image holds the branch, a
#             failure when it does not.
#   wandb     WANDB_MODE, and a key for online mode
#   disk      room for the dumps (DUMP_STEPS * DUMP_MB_PER_STEP MB) and the checkpoints kept
#             (CKPT_KEEP + 1, one being written, of CKPT_GB GB), per filesystem
#   context   HF_CHECKPOINT's config.json has no rope_scaling (SGLang would apply it, Miles'
#             Megatron would not: two different models) and its max_position_embeddings
#             covers MAX_SEQ_LEN, or EXTEND_CONTEXT=1 says to go past it
#   imports   JOB_PYTHON imports what a trial needs: Miles' agentic generate function,
#             rescue's hooks, the agent, mini-swe-agent, litellm, swesmith (with the docker
#             SDK it imports) and swebench
#
# Exit status 1 when any check fails; warnings do not fail.
set -euo pipefail

RESCUE_PROG=preflight
# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
# shellcheck source=common.sh
source "$LAUNCH_DIR/common.sh"

rescue_check_settings
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
  tasks=$("$JOB_PYTHON" - "$PROMPT_DATA" <<'PY'
import json
import sys

seen = {}
with open(sys.argv[1]) as f:
    for line in f:
        if line.strip():
            meta = json.loads(line).get("metadata") or {}
            image = meta.get("image") or meta.get("image_name")
            if image:
                seen.setdefault(image, meta.get("instance_id", ""))
print("\n".join(f"{image} {iid}" for image, iid in seen.items()))
PY
  ) || tasks=""
  images=$(awk '{ print $1 }' <<<"$tasks")
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
    # remote: a container of the first task's image, as the agent's sandbox runs it
    read -r image iid <<<"$(head -n 1 <<<"$tasks")"
    if "${DOCKER[@]}" image inspect "$image" >/dev/null 2>&1; then
      # shellcheck disable=SC2016  # $1 is the container shell's
      probe='cd /testbed && { git rev-parse -q --verify "refs/heads/$1" >/dev/null && echo branch; timeout 60 git ls-remote --exit-code origin >/dev/null 2>&1 && echo remote; true; }'
      if ! reach=$(timeout 180 "${DOCKER[@]}" run --rm --entrypoint bash "$image" -c "$probe" bash "$iid" 2>&1); then
        fail remote "cannot run a container of $image: $(tail -n 1 <<<"$reach")"
      elif grep -qx remote <<<"$reach"; then
        ok remote "a container of $image reaches the task repositories' remote"
      elif grep -qx branch <<<"$reach"; then
        warn remote "a container of $image cannot reach origin (git ls-remote); its image holds branch $iid, but a task whose branch is missing fails its checkout (infra_no_result): give the containers network access or use images with every branch"
      else
        fail remote "a container of $image cannot reach origin (git ls-remote) and its image lacks branch $iid: checkouts will fail (infra_no_result); give the containers network access to fetch the instance branches, or use images that hold them"
      fi
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

# disk: dumps and checkpoints, summed per filesystem
dump_dir=${DUMP_DIR:-$OUTPUT_DIR}
save_dir=${SAVE_DIR:-$OUTPUT_DIR}
if [[ $DUMP_STEPS == all ]]; then dump_mb=$((NUM_ROLLOUT * DUMP_MB_PER_STEP)); else dump_mb=$((DUMP_STEPS * DUMP_MB_PER_STEP)); fi
if ((CKPT_KEEP > 0)); then saves=$((CKPT_KEEP + 1)); else saves=$((NUM_ROLLOUT / SAVE_INTERVAL + 1)); fi
ckpt_mb=$((saves * CKPT_GB * 1024))
declare -A need_mb=() free_mb=() where=()
for entry in "$dump_dir $dump_mb" "$save_dir $ckpt_mb"; do
  dir=${entry% *}
  while [[ ! -d $dir ]]; do dir=$(dirname "$dir"); done
  read -r fs avail < <(df -Pm "$dir" | awk 'NR == 2 { print $1, $4 }')
  need_mb[$fs]=$((${need_mb[$fs]:-0} + ${entry##* }))
  free_mb[$fs]=$avail
  where[$fs]=$dir
done
what="dumps $dump_mb MB (DUMP_STEPS=$DUMP_STEPS) and checkpoints $ckpt_mb MB ($saves x CKPT_GB=$CKPT_GB)"
for fs in "${!need_mb[@]}"; do
  if ((free_mb[$fs] >= need_mb[$fs])); then
    ok disk "${free_mb[$fs]} MB free at ${where[$fs]}, need ${need_mb[$fs]} MB: $what"
  else
    fail disk "${free_mb[$fs]} MB free at ${where[$fs]}, need ${need_mb[$fs]} MB for $what: free space, move OUTPUT_DIR, or lower DUMP_STEPS or CKPT_KEEP"
  fi
done

# context
if [[ -f $HF_CHECKPOINT/config.json ]]; then
  read -r positions rope < <("$JOB_PYTHON" - "$HF_CHECKPOINT/config.json" <<'PY' || echo "0 unreadable"
import json
import sys

c = json.load(open(sys.argv[1]))
c = c.get("text_config", c)
rope = c.get("rope_scaling") or {}
kind = rope.get("rope_type") or rope.get("type") or ("present" if rope else "none")
print(int(c.get("max_position_embeddings") or 0), kind)
PY
  )
  if [[ $rope != none ]]; then
    fail context "$HF_CHECKPOINT/config.json has rope_scaling ($rope): SGLang would apply it and Miles' Megatron trains plain RoPE, so rollout and training would be different models: remove rope_scaling from config.json"
  elif ((positions >= MAX_SEQ_LEN)); then
    ok context "MAX_SEQ_LEN=$MAX_SEQ_LEN within the checkpoint's $positions positions, plain RoPE"
  elif [[ $EXTEND_CONTEXT == 1 ]]; then
    warn context "MAX_SEQ_LEN=$MAX_SEQ_LEN beyond the checkpoint's $positions positions (EXTEND_CONTEXT=1): plain RoPE past the trained range in rollout and training alike"
  else
    fail context "MAX_SEQ_LEN=$MAX_SEQ_LEN exceeds the checkpoint's $positions positions: set MAX_SEQ_LEN=$positions, or EXTEND_CONTEXT=1 for plain RoPE past the trained range (launch/config.sh)"
  fi
else
  fail context "no $HF_CHECKPOINT/config.json: set HF_CHECKPOINT to the Hugging Face checkpoint"
fi

# imports: what one trial imports, in the Python the trainer runs
modules=(miles.rollout.generate_hub.agentic_tool_call rescue.miles.generate rescue.miles.buffer rescue.miles.reward
  rescue.miles.log swe_smith_tasks.agent minisweagent.agents.default
  minisweagent.models.litellm_model minisweagent.environments.docker litellm docker
  swesmith.profiles swesmith.harness.grading swebench.harness.constants)
unimportable=$(PYTHONPATH="$RESCUE_DIR:$MILES_DIR:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}" \
  MSWEA_SILENT_STARTUP=1 LITELLM_LOCAL_MODEL_COST_MAP=True \
  "$JOB_PYTHON" - "${modules[@]}" 2>/dev/null <<'PY'
import importlib
import sys

for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:  # every module that does not import, and why
        print(f"{name} ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")
PY
) || unimportable="JOB_PYTHON=$JOB_PYTHON (it does not run)"
if [[ -z $unimportable ]]; then
  ok imports "$JOB_PYTHON imports the ${#modules[@]} modules a trial needs"
else
  fail imports "$JOB_PYTHON cannot import $(paste -sd ';' <<<"$unimportable" | sed 's/;/; /g'): pip install -e ${RESCUE_DIR}'[swe]' into it (and Miles' requirements), or set JOB_PYTHON"
fi

if ((FAILED)); then
  printf '%s: failed; fix the FAIL lines above (or skip with PREFLIGHT=0)\n' "$RESCUE_PROG" >&2
  exit 1
fi
