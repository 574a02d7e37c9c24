# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# Settings of the stale-handling arms on slime (make slime-arm): the one table of what is
# theirs, with its defaults. It sources config.sh after setting its own defaults, so these
# win over the SWE defaults of the same names; every other setting of config.sh keeps its
# meaning and default there (the arm: ARM, A, SEED, STALENESS, PACE_WINDOW, BASELINE,
# ESTIMATOR; cluster and Ray: NNODES, NODE_RANK, MASTER_ADDR, GPUS_PER_NODE, RAY_PORT,
# RAY_DASHBOARD_PORT, RAY_WAIT_S, RAY_STOP, NODE_ADDR, RUN_STATE_DIR, ACTOR_NUM_NODES,
# ACTOR_GPUS_PER_NODE, ROLLOUT_NUM_GPUS, ROLLOUT_GPUS_PER_ENGINE; paths: MEGATRON_DIR,
# OUTPUT_DIR, HF_CHECKPOINT, REF_LOAD, SAVE_DIR; model and training: MODEL_ARGS,
# MAX_RESPONSE_LEN, MAX_SEQ_LEN (--rollout-max-context-len), ROLLOUT_BATCH_SIZE, N_SAMPLES,
# GLOBAL_BATCH_SIZE, NUM_ROLLOUT, TEMPERATURE, LR, EPS_CLIP, EPS_CLIP_HIGH, TP, CP,
# MAX_TOKENS_PER_GPU, SGLANG_MEM_FRACTION, SAVE_INTERVAL, CKPT_KEEP, EXTRA_ARGS; logging:
# RUN_NAME, WANDB_MODE, WANDB_GROUP, SUBMISSION_ID, DUMP_DIR, DUMP_STEPS, HOUSEKEEP_S, JOB_POLL_S;
# DRY_RUN, JOB_PYTHON). The Miles-only settings (MILES_DIR, PAUSE_MODE, TITO_MODEL,
# MAX_TURNS, AGENT_*, PILOT_*, DRGRPO, the budget-regime arms) do not apply. E.g.
#
#   make slime-arm ARM=protect A=0.5 SEED=2
#   make slime-arm ARM=pace ESTIMATOR=turn DRY_RUN=1
#
# ── The arm on slime ────────────────────────────────────────────────────────────────────
#   ARM          (required) drop | never-drop | protect | pace: the gate of rescue's slime
#                rollout function (--rollout-function-path
#                rescue.slime.rollout.generate_rollout with slime's train_async.py, in place
#                of slime's generate_rollout_fully_async, whose worker it reuses), set by
#                RESCUE_ARM in the Ray runtime environment; STALENESS is its K
#                (RESCUE_MAX_STALENESS: slime has no --max-weight-staleness):
#                drop:       a stale group is discarded (the next finished one takes its place)
#                never-drop: every group is trained with weight 1 (K labels stale groups)
#                protect:    a stale group is kept with probability A, weight 1/A (the
#                            reward hook rescue.reward.post_process_rewards)
#                pace:       no group is trained staler than K and none is dropped: the
#                            rollout function waits for stragglers (rescue.slime.pace)
#                The budget-regime arms and DRGRPO=1 run on Miles only (make swe-arm,
#                make rlvr-arm): refused here.
#   ESTIMATOR    group. turn: the turn-reached baseline per token (RESCUE_ESTIMATOR=turn),
#                through the reward hook and slime's --custom-advantage-function-path
#                rescue.slime.advantages.turn_advantages.
#   Every arm records which tokens each model call produced
#   (--custom-generate-function-path rescue.slime.generate.generate, wrapping
#   SLIME_GENERATE): slime aborts the requests in flight at every weight update and resumes
#   them, and the record keeps such a reply one turn whose aborted, tokenless part does not
#   count for staleness.
#
# ── slime ───────────────────────────────────────────────────────────────────────────────
#   SLIME_DIR    /root/slime. slime checkout (must hold train_async.py; its
#                scripts/models/MODEL_TYPE.sh gives MODEL_ARGS unless MODEL_ARGS is set).
#   SLIME_GENERATE slime.rollout.sglang_rollout.generate. The generate function rescue's
#                wrapper calls (RESCUE_GENERATE_FUNCTION): slime's own single-turn one, or e.g.
#                examples.coding_agent_rl.generate.generate (slime's coding-agent example;
#                SLIME_DIR is on the job's PYTHONPATH, and the example's own settings go in
#                SLIME_ENV).
#   SLIME_ENV    (empty) More variables for the job's runtime environment, as NAME=VALUE
#                words (e.g. 'SWE_AGENT=claude_code ADAPTER_PUBLIC_HOST=10.0.0.1').
#   RM_TYPE      math. slime's --rm-type (slime's rule-based graders); empty passes none (the
#                generate function, or CUSTOM_RM_PATH, scores).
#   CUSTOM_RM_PATH (empty) slime's --custom-rm-path.
#   LABEL_KEY    label. --label-key of PROMPT_DATA's rows (--input-key is prompt,
#                --metadata-key metadata).
#   APPLY_CHAT_TEMPLATE 1. --apply-chat-template (0: the prompt is used as it is).
#   MODEL_TYPE   qwen3-8B. slime's model script scripts/models/MODEL_TYPE.sh.
#   OUTPUT_DIR   /root/rescue-runs (config.sh's setting, read here first for PROMPT_DATA).
#   PROMPT_DATA  OUTPUT_DIR/data/slime_prompts.jsonl. slime's JSONL prompt data.
#   WANDB_PROJECT rescue-slime.
#   RUN_NAME     slime-ARM[-aA][-kK][-est-turn]-seedSEED (the SWE arms' names with the
#                slime- prefix; WANDB_TAGS add framework:slime).
#
# Errors (one line on stderr, exit status 2), besides config.sh's:
#   ARM='x' is not a slime arm: set ARM to drop, never-drop, protect or pace
#   ARM=mask is a budget-regime arm, which runs on Miles: ...
#   DRGRPO=1 runs on Miles only: ...
#   no slime checkout at SLIME_DIR=...: set SLIME_DIR to a slime checkout with train_async.py
#   no model script ...: set MODEL_TYPE to one in SLIME_DIR/scripts/models or set MODEL_ARGS
#   SLIME_ENV entry 'x' is not NAME=VALUE: ...

SLIME_DIR=${SLIME_DIR:-/root/slime}
SLIME_GENERATE=${SLIME_GENERATE:-slime.rollout.sglang_rollout.generate}
SLIME_ENV=${SLIME_ENV:-}
RM_TYPE=${RM_TYPE-math}
CUSTOM_RM_PATH=${CUSTOM_RM_PATH:-}
LABEL_KEY=${LABEL_KEY:-label}
APPLY_CHAT_TEMPLATE=${APPLY_CHAT_TEMPLATE:-1}
OUTPUT_DIR=${OUTPUT_DIR:-/root/rescue-runs}
PROMPT_DATA=${PROMPT_DATA:-$OUTPUT_DIR/data/slime_prompts.jsonl}
WANDB_PROJECT=${WANDB_PROJECT:-rescue-slime}

# shellcheck source=config.sh
source "$(dirname "${BASH_SOURCE[0]}")/config.sh"
