# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# Settings of the single-turn arms (make rlvr-prepare, rlvr-calibrate, rlvr-arm, rlvr-sweep):
# the one table of what is theirs, with its defaults. It sources config.sh after setting its
# own defaults, so these win over the SWE defaults of the same names; every other setting of
# config.sh keeps its meaning and default there (cluster and Ray: NNODES, NODE_RANK,
# MASTER_ADDR, GPUS_PER_NODE, RAY_PORT, RAY_DASHBOARD_PORT, RAY_STOP, NODE_ADDR,
# RUN_STATE_DIR; paths: MILES_DIR, MEGATRON_DIR, OUTPUT_DIR, SAVE_DIR; model and training:
# MODEL_ARGS, N_SAMPLES (8, GRPO's n), GLOBAL_BATCH_SIZE, TEMPERATURE, LR, EPS_CLIP,
# EPS_CLIP_HIGH, EXTRA_ARGS; logging: RUN_NAME, WANDB_MODE, WANDB_GROUP, SUBMISSION_ID,
# DUMP_DIR, DUMP_STEPS, HOUSEKEEP_S, JOB_POLL_S; DRY_RUN, JOB_PYTHON, RESCUE_PY). The SWE-only settings
# (STALENESS, MAX_TURNS, AGENT_*, TITO_MODEL, MAX_SEQ_LEN, MAX_RESPONSE_LEN, PILOT_*, ...)
# do not apply: the cap is CAP, and training is Miles' synchronous train.py. E.g.
#
#   make rlvr-arm ARM=mask SEED=2 CAP=1024
#   make rlvr-sweep ARMS='zero mask' SEEDS=3
#
# ── The arm ─────────────────────────────────────────────────────────────────────────────
#   ARM          (required by rlvr-arm) the budget-regime arm; every arm scores a truncated
#                response R = 0 in the reward hook (RESCUE_TRUNCATED_REWARD=zero, so all
#                arms train on the same raw rewards), logs the census and dumps its first
#                steps; an arm adds only its own settings:
#                zero:        (i)   R = 0 on the cap, nothing masked
#                mask:        (ii)  the capped responses loss-masked
#                             (--rollout-sample-filter-path filters.mask_truncated_zero_reward)
#                matched:     (iii) mask, each step rescaled to the R = 0 step's update norm
#                step-control: R = 0's step rescaled to the mask step's update norm (the
#                             step-size control P3's falsifier and q2's gate read)
#                drgrpo-mask: (iv)  mask with Dr. GRPO: --disable-grpo-std-normalization and
#                             the constant divisor (rescue.miles.drgrpo.pg_loss_reducer)
#                survivor:    (v)   mask with the survivors' baseline (RESCUE_BASELINE=survivors)
#                turn:        (vi)  R = 0 with the turn-reached baseline over TURN_TOKENS-token
#                             chunks (RESCUE_ESTIMATOR=turn)
#                ESTIMATOR, DRGRPO and BASELINE belong to the arms here: setting them is refused.
#   SEED         1. Replicate seed: Miles' --seed and --rollout-seed (prompt order).
#   CAP          (empty) The response-length cap (--rollout-max-response-len). Empty reads
#                it from CAP_FILE.
#   CAP_FILE     OUTPUT_DIR/rlvr/cap.json. Written by make rlvr-calibrate; refused when it
#                was calibrated for another HF_CHECKPOINT or PROMPT_DATA.
#   TURN_TOKENS  256. turn only: tokens per chunk of the turn-reached baseline
#                (RESCUE_TURN_TOKENS).
#   DRGRPO_DIVISOR (empty) drgrpo-mask only: Dr. GRPO's constant (RESCUE_DRGRPO_DIVISOR);
#                empty = --rollout-max-response-len, i.e. CAP.
#   RM_TYPE      math. Miles' grader (--rm-type): math (the grader of Miles' GSM8K recipes:
#                the last \boxed{} of the response), deepscaler (after </think>) or dapo.
#   OFFPOLICY    none. The off-policy correction, the same in every arm: none (Miles'
#                synchronous trainer is on-policy: each step trains on the rollouts of the
#                weights it just synced) | tis (--use-tis against the engine's numerics) |
#                tis-sc (TIS + score centering as the SWE arms: rescue.miles.sc_loss, each
#                /generate call records its top SC_TOP_K log-probs through
#                rescue.miles.topk.generate; /generate has no cap on K). RUN_NAME gets
#                -OFFPOLICY unless none. SC_TOP_K and SC_CAP as in config.sh.
#
# ── Runs on Ray ─────────────────────────────────────────────────────────────────────────
#   GPUS_PER_RUN 1. GPUs of one run: Miles' synchronous trainer with --colocate (training
#                and SGLang share them). TP x CP must divide it.
#   RAY_START    1. rlvr-arm and rlvr-sweep on node 0 start this node's Ray head (as the
#                SWE arms do, RAY_STOP=1 stopping the one an earlier run recorded); 0
#                submits to the Ray cluster already running at RAY_DASHBOARD_PORT, which must
#                have been started by these launchers (it needs the run slots).
#   JOB_START_TIMEOUT_S 31536000. Ray's RAY_JOB_START_TIMEOUT_SECONDS on the head: how long
#                a submitted run may wait for a free slot before Ray fails it (Ray's own
#                default, 900 s, would fail every run queued behind the first few).
#   Every node gives Ray GPUS_PER_NODE/GPUS_PER_RUN run slots (the resource rescue_run_slot)
#   and every run asks one, so Ray keeps a run PENDING (queued) until a node has GPUs for it,
#   and an 8-GPU node runs eight at once. Other nodes join with NODE_RANK=k MASTER_ADDR=...
#   at any time.
#   ARMS         zero mask matched step-control drgrpo-mask survivor turn. rlvr-sweep: the arms to run,
#                separated by spaces or commas (ARMS=zero,mask is ARMS='zero mask').
#   SEEDS        3. rlvr-sweep: seeds 1..SEEDS of every arm; the sweep prints what they can
#                decide (`rescue power`) and refuses fewer than 3 when a prediction compares
#                the arms (the judge decides nothing below 3 paired seeds).
#   FORCE        0. rlvr-sweep: 1 submits SEEDS below 3 anyway (with a warning).
#   SWEEP_POLL_S 60. rlvr-sweep: seconds between looks at the runs' Ray jobs.
#   SWEEP_WATCH  1. rlvr-sweep: 1 watches the runs until all end; 0 stops after submitting
#                (make q2 watches in a stage of its own, so a resumed q2 never resubmits).
#   SWEEP_DIR    OUTPUT_DIR/sweeps/rlvr-<date>-<time>. rlvr-sweep: the plan of the sweep
#                (plan.jsonl: run, Ray submission id, log path) for `rescue rlvr watch`.
#
# ── Data (make rlvr-prepare) ────────────────────────────────────────────────────────────
#   RLVR_DATASET gsm8k. gsm8k | math: the schema of the rows (rescue.rlvr.data).
#   RLVR_SOURCE  (empty) Hugging Face dataset name or local .jsonl/.json/.parquet file;
#                empty = the dataset's default (openai/gsm8k, or a MATH mirror).
#   RLVR_SPLIT   train. Dataset split.
#   PROMPT_DATA  OUTPUT_DIR/data/rlvr-RLVR_DATASET.jsonl. The prompt JSONL training reads.
#
# ── The cap calibration (make rlvr-calibrate) ───────────────────────────────────────────
#   CAL_CAPS     512 768 1024 1536 2048 3072 4096. Candidate caps; the chosen one is the
#                smallest whose truncation rate at initialization lies in [CAL_LOW, CAL_HIGH].
#   CAL_LOW      0.2.   CAL_HIGH 0.4. The window.
#   CAL_PROMPTS  256. Prompts sampled (seed SEED).   CAL_N 8. Responses per prompt.
#   CAL_BASE_URL (empty) An SGLang server serving HF_CHECKPOINT; empty starts one on this
#                node at CAL_PORT (GPUS_PER_NODE data-parallel replicas) for the calibration.
#   CAL_PORT     30000.   CAL_WAIT_S 900 s for that server to come up.
#   CAL_CONCURRENCY 256. Requests at once.
#
# ── Defaults that differ from the SWE arms' (documented in config.sh) ──────────────────
#   MODEL_TYPE qwen3-1.7B (Miles' scripts/models/qwen3-1.7B.py), HF_CHECKPOINT
#   /root/models/Qwen3-1.7B, REF_LOAD /root/models/Qwen3-1.7B_torch_dist, ROLLOUT_BATCH_SIZE
#   32, NUM_ROLLOUT 200, TP 1, CP 1, MAX_TOKENS_PER_GPU 16384 (above prompt + CAP),
#   SGLANG_MEM_FRACTION 0.7 (colocated), SAVE_INTERVAL 50, CKPT_KEEP 1, WANDB_PROJECT
#   rescue-rlvr. RUN_NAME rlvr-ARM-capCAP[-OFFPOLICY]-seedSEED, tags arm:ARM,seed:SEED,cap:CAP
#   (and offpolicy:OFFPOLICY unless none).
#
# Errors (one line on stderr, exit status 2), besides config.sh's:
#   ARM='x' is not a single-turn arm: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn
#   ESTIMATOR=turn: the single-turn arms set the estimator themselves: use ARM=turn
#   ARM=matched (or step-control) needs GLOBAL_BATCH_SIZE to divide ROLLOUT_BATCH_SIZE*N_SAMPLES=n: ...
#   CAP='x' is not a positive integer: set CAP=N, or unset it to read CAP_FILE
#   no cap file ...: run make rlvr-calibrate (writes CAP_FILE), or set CAP=N
#   EXTRA_ARGS has --dynamic-sampling-filter-path, an outcome-dependent exclusion: ...

RLVR_CONFIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The arms (rescue/arms.py's table): ARMS' default is the single-turn launcher's.
# shellcheck source=arms.sh
source "$RLVR_CONFIG_DIR/arms.sh"

ARM=${ARM:-}
CAP=${CAP:-}
TURN_TOKENS=${TURN_TOKENS:-256}
RM_TYPE=${RM_TYPE:-math}
OFFPOLICY=${OFFPOLICY:-none}
GPUS_PER_RUN=${GPUS_PER_RUN:-1}
RAY_START=${RAY_START:-1}
JOB_START_TIMEOUT_S=${JOB_START_TIMEOUT_S:-31536000}
ARMS=${ARMS:-${RESCUE_RLVR_ARM_LIST[*]}}
SEEDS=${SEEDS:-3}
FORCE=${FORCE:-0}
SWEEP_POLL_S=${SWEEP_POLL_S:-60}
SWEEP_WATCH=${SWEEP_WATCH:-1}
SWEEP_DIR=${SWEEP_DIR:-}

RLVR_DATASET=${RLVR_DATASET:-gsm8k}
RLVR_SOURCE=${RLVR_SOURCE:-}
RLVR_SPLIT=${RLVR_SPLIT:-train}

CAL_CAPS=${CAL_CAPS:-512 768 1024 1536 2048 3072 4096}
CAL_LOW=${CAL_LOW:-0.2}
CAL_HIGH=${CAL_HIGH:-0.4}
CAL_PROMPTS=${CAL_PROMPTS:-256}
CAL_N=${CAL_N:-8}
CAL_BASE_URL=${CAL_BASE_URL:-}
CAL_PORT=${CAL_PORT:-30000}
CAL_WAIT_S=${CAL_WAIT_S:-900}
CAL_CONCURRENCY=${CAL_CONCURRENCY:-256}

MODEL_TYPE=${MODEL_TYPE:-qwen3-1.7B}
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/models/Qwen3-1.7B}
REF_LOAD=${REF_LOAD:-/root/models/Qwen3-1.7B_torch_dist}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-32}
NUM_ROLLOUT=${NUM_ROLLOUT:-200}
TP=${TP:-1}
CP=${CP:-1}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-16384}
SGLANG_MEM_FRACTION=${SGLANG_MEM_FRACTION:-0.7}
SAVE_INTERVAL=${SAVE_INTERVAL:-50}
CKPT_KEEP=${CKPT_KEEP:-1}
WANDB_PROJECT=${WANDB_PROJECT:-rescue-rlvr}

# The SWE table for every other setting; then the paths under OUTPUT_DIR (config.sh would
# give PROMPT_DATA the SWE prompts).
RLVR_PROMPT_DATA=${PROMPT_DATA:-}
# shellcheck source=config.sh
source "$RLVR_CONFIG_DIR/config.sh"
PROMPT_DATA=${RLVR_PROMPT_DATA:-$OUTPUT_DIR/data/rlvr-$RLVR_DATASET.jsonl}
CAP_FILE=${CAP_FILE:-$OUTPUT_DIR/rlvr/cap.json}
