# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# Settings of the text-game arms (make agent-prepare, agent-arm): the one table of what is
# theirs, with its defaults. It sets its own defaults, then sources rlvr_config.sh (which
# sources config.sh): the runs are single runs of Miles' synchronous train.py --colocate as
# Ray jobs on run slots, as the single-turn arms are, and every setting of those two files
# keeps its meaning there (cluster and Ray: NNODES, NODE_RANK, MASTER_ADDR, GPUS_PER_NODE,
# RAY_PORT, RAY_DASHBOARD_PORT, RAY_STOP, RAY_START, JOB_START_TIMEOUT_S, NODE_ADDR; paths:
# MILES_DIR, MEGATRON_DIR, OUTPUT_DIR, SAVE_DIR; training: MODEL_ARGS, GLOBAL_BATCH_SIZE,
# TEMPERATURE, EPS_CLIP, EPS_CLIP_HIGH, SGLANG_MEM_FRACTION, EXTRA_ARGS (refusing the
# outcome-dependent exclusions as the single-turn arms do); logging: RUN_NAME, WANDB_MODE,
# WANDB_GROUP, SUBMISSION_ID, DUMP_DIR, DUMP_STEPS, HOUSEKEEP_S, JOB_POLL_S; DRY_RUN, JOB_PYTHON,
# RESCUE_PY). The single-turn data, grader and cap calibration settings do not apply. E.g.
#
#   make agent-prepare ENV=cooking
#   make agent-arm ENV=alfworld ARM=mask SEED=2
#
# ── The environment and the arm ─────────────────────────────────────────────────────────
#   ENV          (required) alfworld | cooking. The game (rescue.envs): ALFWorld's TextWorld
#                games (two outcomes: won, or the cap) or TextWorld's cooking games (three:
#                won, lost, or the cap). Each episode is played by Miles' generate function
#                rescue.miles.textgame.generate, one step per engine request, in the public
#                ALFWorld recipe's prompt format (verl-agent).
#   ARM          (required by agent-arm) zero | mask | matched | step-control | drgrpo-mask | survivor |
#                turn: the budget-regime arm of launch/budget.sh, as in the single-turn and
#                SWE arms (every arm scores a capped episode R = 0, logs the census and dumps
#                its first steps; it adds only its own settings). ESTIMATOR, DRGRPO and
#                BASELINE belong to the arms: setting them is refused. Under turn the
#                baseline is conditioned on the step reached (each step is one sample).
#   SEED         1. Replicate seed: Miles' --seed and --rollout-seed (game order).
#   CAP          (per ENV) actions per episode (--agent-cap): 50 for alfworld, 15 for
#                cooking, the recipe's env.max_steps. For cooking it is also the walkthrough
#                bound of agent-prepare.
#   HISTORY      2. (observation, action) pairs in each prompt (--agent-history), the
#                recipe's env.history_length.
#   STEP_TOKENS  512. New tokens per step (--rollout-max-response-len), the recipe's
#                max_response_length.
#   CONTEXT_LEN  2560. Prompt + reply tokens of a step (--rollout-max-context-len): the
#                recipe's max_prompt_length 2048 + STEP_TOKENS. A prompt that leaves no room
#                ends the episode as a budget failure (context_limit).
#   KL_COEF      0.01. The recipe's KL loss (--use-kl-loss --kl-loss-type low_var_kl
#                --kl-loss-coef KL_COEF); 0 leaves it out.
#   DRGRPO_DIVISOR (empty) drgrpo-mask only: Dr. GRPO's constant (RESCUE_DRGRPO_DIVISOR);
#                empty = --rollout-max-response-len, i.e. STEP_TOKENS.
#
# ── Games (make agent-prepare) ──────────────────────────────────────────────────────────
#   GAMES        32. cooking: games per difficulty level (five levels, rescue.envs.prepare;
#                a game whose walkthrough is longer than CAP is left out and counted).
#   GAME_SEED    0. cooking: the seed the whole set of games is made from (tw-make's seed of
#                each game derives from it, its level and its number).
#   GAMES_DIR    OUTPUT_DIR/games/cooking. cooking: where tw-make writes the games.
#   ALFWORLD_DATA OUTPUT_DIR/alfworld. alfworld: where ALFWorld's own alfworld-download puts
#                its data (needs the network once); also given to every run's processes.
#   ALFWORLD_SPLIT train. alfworld: the split the rows come from.
#   PROMPT_DATA  OUTPUT_DIR/data/agent-ENV.jsonl. The prompt rows (rescue agent prepare).
#
# ── Defaults that differ from the single-turn arms' (the recipe: launch/rlvr_config.sh
#    and config.sh document the rest) ─────────────────────────────────────────────────────
#   MODEL_TYPE qwen2.5-1.5B (Miles' scripts/models/qwen2.5-1.5B.py), HF_CHECKPOINT
#   /root/models/Qwen2.5-1.5B-Instruct, REF_LOAD /root/models/Qwen2.5-1.5B-Instruct_torch_dist,
#   GPUS_PER_RUN 2 (two GPUs a run), ROLLOUT_BATCH_SIZE 16 games a step, N_SAMPLES 8 (groups
#   of 8), NUM_ROLLOUT 150 iterations, LR 1e-6, MAX_TOKENS_PER_GPU 8192, WANDB_PROJECT
#   rescue-agent. RUN_NAME agent-ENV-ARM-capCAP-seedSEED, tags env:ENV,arm:ARM,seed:SEED,cap:CAP.
#
# Errors (one line on stderr, exit status 2), besides those of rlvr_config.sh and config.sh:
#   ENV='x' is not a text game: set ENV=alfworld or ENV=cooking
#   ARM='x' is not a text-game arm: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn

AGENT_CONFIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

ENV=${ENV:-}
HISTORY=${HISTORY:-2}
STEP_TOKENS=${STEP_TOKENS:-512}
CONTEXT_LEN=${CONTEXT_LEN:-2560}
KL_COEF=${KL_COEF:-0.01}
GAMES=${GAMES:-32}
GAME_SEED=${GAME_SEED:-0}
ALFWORLD_SPLIT=${ALFWORLD_SPLIT:-train}

MODEL_TYPE=${MODEL_TYPE:-qwen2.5-1.5B}
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/models/Qwen2.5-1.5B-Instruct}
REF_LOAD=${REF_LOAD:-/root/models/Qwen2.5-1.5B-Instruct_torch_dist}
GPUS_PER_RUN=${GPUS_PER_RUN:-2}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16}
N_SAMPLES=${N_SAMPLES:-8}
NUM_ROLLOUT=${NUM_ROLLOUT:-150}
LR=${LR:-1e-6}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-8192}
WANDB_PROJECT=${WANDB_PROJECT:-rescue-agent}

# The single-turn table for every other setting; then the paths under OUTPUT_DIR (it would
# give PROMPT_DATA the single-turn prompts).
AGENT_PROMPT_DATA=${PROMPT_DATA:-}
# shellcheck source=rlvr_config.sh
source "$AGENT_CONFIG_DIR/rlvr_config.sh"
PROMPT_DATA=${AGENT_PROMPT_DATA:-$OUTPUT_DIR/data/agent-${ENV:-ENV}.jsonl}
GAMES_DIR=${GAMES_DIR:-$OUTPUT_DIR/games/cooking}
ALFWORLD_DATA=${ALFWORLD_DATA:-$OUTPUT_DIR/alfworld}
case $ENV in
  alfworld) CAP=${CAP:-50} ;;
  cooking) CAP=${CAP:-15} ;;
esac
