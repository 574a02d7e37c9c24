# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# Settings derived from the checked ones: the model family's parsers and chat template
# (rescue_family) and the GPU layout with its checks (rescue_derive_layout). Sourced by
# common.sh; rescue_check_settings calls both.

# ── The model family: SGLang's parsers and Miles' chat template for TITO_MODEL ──────────

# One row per family Miles binds parsers to (miles/utils/chat_template_utils/tito_tokenizer.py;
# a test checks every row against Miles' resolve_reasoning_and_tool_call_parser and
# resolve_fixed_chat_template): tool-call parser, reasoning parser, Miles' fixed chat
# template (- for the checkpoint's own) and the chat_template_kwargs Miles' session server
# sends. Sets TOOL_CALL_PARSER, REASONING_PARSER, CHAT_TEMPLATE (a path under MILES_DIR, or
# empty) and CHAT_TEMPLATE_KWARGS (JSON).
rescue_family() {
  local row
  case $TITO_MODEL in
    qwen3) row='qwen25 qwen3 qwen3_fixed.jinja {"clear_thinking":false}' ;;
    qwen35) row='qwen3_coder qwen3 qwen3.5_fixed.jinja {"clear_thinking":false}' ;;
    qwennext) row='qwen25 qwen3 qwen3_thinking_2507_and_next_fixed.jinja {"clear_thinking":false}' ;;
    glm47) row='glm47 glm45 - {"clear_thinking":false}' ;;
    nemotron3) row='qwen3_coder nemotron_3 - {"truncate_history_thinking":false}' ;;
    kimi26) row='kimi_k2_raw_id kimi_k2 - {"preserve_thinking":true}' ;;
    minimax_m25) row='minimax-m2 minimax-append-think minimax_m25_fixed.jinja {"clear_thinking":false}' ;;
    minimax_m27) row='minimax-m2 minimax-append-think minimax_m27_fixed.jinja {"clear_thinking":false}' ;;
    deepseekv32) row='deepseekv32 deepseek-v3 - {"drop_thinking":false}' ;;
    deepseekv4) row='deepseekv4 deepseek-v4 - {"drop_thinking":false}' ;;
    inkling) row='inkling inkling inkling_fixed.jinja {}' ;;
    *) rescue_die "TITO_MODEL='$TITO_MODEL' has no parsers in rescue_family: set TITO_MODEL to one of qwen3, qwen35, qwennext, glm47, nemotron3, kimi26, minimax_m25, minimax_m27, deepseekv32, deepseekv4, inkling" ;;
  esac
  local template
  read -r TOOL_CALL_PARSER REASONING_PARSER template CHAT_TEMPLATE_KWARGS <<<"$row"
  CHAT_TEMPLATE=
  [[ $template == - ]] || CHAT_TEMPLATE=$MILES_DIR/miles/utils/chat_template_utils/templates/$template
}

# ── The layout: defaults that depend on other settings, and the GPU split ─────────────

rescue_derive_layout() {
  if [[ -z $ACTOR_GPUS_PER_NODE ]]; then
    if ((NNODES == 1)); then ACTOR_GPUS_PER_NODE=$((GPUS_PER_NODE / 2)); else ACTOR_GPUS_PER_NODE=$GPUS_PER_NODE; fi
  fi
  if [[ -z $ROLLOUT_NUM_GPUS ]]; then
    ROLLOUT_NUM_GPUS=$((NNODES * GPUS_PER_NODE - ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE))
  fi
  GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-$((ROLLOUT_BATCH_SIZE * N_SAMPLES))}
  AGENT_CONCURRENCY=${AGENT_CONCURRENCY:-$((ROLLOUT_BATCH_SIZE * N_SAMPLES))}
  HEALTH_CHECK_FIRST_WAIT=${HEALTH_CHECK_FIRST_WAIT:-$((MAX_TURNS * 60))}
  rescue_node_addr
  local training=$((ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE)) total=$((NNODES * GPUS_PER_NODE))
  if ((NNODES == 1 && GPUS_PER_NODE < 2)); then
    rescue_die "GPUS_PER_NODE=$GPUS_PER_NODE on one node leaves no GPU for training or rollout: run on a node with 2 or more GPUs (training and SGLang each need one)"
  fi
  ((ACTOR_NUM_NODES <= NNODES)) ||
    rescue_die "ACTOR_NUM_NODES=$ACTOR_NUM_NODES exceeds NNODES=$NNODES: set ACTOR_NUM_NODES <= NNODES"
  ((ACTOR_GPUS_PER_NODE >= 1 && ACTOR_GPUS_PER_NODE <= GPUS_PER_NODE)) ||
    rescue_die "ACTOR_GPUS_PER_NODE=$ACTOR_GPUS_PER_NODE is not in 1..GPUS_PER_NODE=$GPUS_PER_NODE: set ACTOR_GPUS_PER_NODE"
  ((training % (TP * CP) == 0)) ||
    rescue_die "TP=$TP x CP=$CP = $((TP * CP)) does not divide the $training training GPUs (ACTOR_NUM_NODES x ACTOR_GPUS_PER_NODE): set TP, CP or ACTOR_GPUS_PER_NODE"
  ((ROLLOUT_NUM_GPUS >= 1 && training + ROLLOUT_NUM_GPUS <= total)) ||
    rescue_die "ROLLOUT_NUM_GPUS=$ROLLOUT_NUM_GPUS with $training training GPUs does not fit $total GPUs (NNODES x GPUS_PER_NODE): set ROLLOUT_NUM_GPUS or ACTOR_GPUS_PER_NODE"
  ((ROLLOUT_NUM_GPUS % ROLLOUT_GPUS_PER_ENGINE == 0)) ||
    rescue_die "ROLLOUT_GPUS_PER_ENGINE=$ROLLOUT_GPUS_PER_ENGINE does not divide ROLLOUT_NUM_GPUS=$ROLLOUT_NUM_GPUS: set ROLLOUT_GPUS_PER_ENGINE"
  return 0
}

# NODE_ADDR, the address this node gives Ray: MASTER_ADDR on node 0, else this node's first
# address (hostname -I), unless set.
rescue_node_addr() {
  [[ -z $NODE_ADDR ]] || return 0
  if ((NODE_RANK == 0)); then NODE_ADDR=$MASTER_ADDR; else
    NODE_ADDR=$(hostname -I 2>/dev/null | awk '{ print $1 }')
    [[ -n $NODE_ADDR ]] || rescue_die "cannot tell this node's address (hostname -I): set NODE_ADDR"
  fi
}
