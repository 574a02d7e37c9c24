# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# Settings of the SWE arms: the one place where every variable is documented with its
# default. Any of them can be set in the environment or on the make command line, e.g.
#
#   make swe-arm ARM=protect A=0.5 SEED=2 STALENESS=3 NUM_ROLLOUT=100
#
# ── The arm ─────────────────────────────────────────────────────────────────────────────
#   ARM                (required) drop | never-drop | protect | pace, or a budget-regime arm
#                      (below). Every arm runs through rescue's buffer
#                      (rescue.miles.buffer.RescueDataBuffer) with
#                      --max-weight-staleness K, so every arm has the same group census
#                      and the same exclusion of groups without a result; the arm is its
#                      gate (RESCUE_ARM) and its rollout function (--fully-async, Miles'
#                      own, except for pace):
#                      drop:       a stale group goes to the unused handler (Miles' behaviour)
#                      never-drop: every group is trained with weight 1 (K only labels
#                                  groups stale in the census, and on every sample, which
#                                  the gradient oracle reads from its dumps)
#                      protect:    a stale group is kept with probability A, weight 1/A
#                                  (the reward hook rescue.miles.reward.post_process_rewards
#                                  applies the weights)
#                      pace:       no group is trained staler than K and none is dropped:
#                                  the trainer waits for stragglers
#                                  (--rollout-function-path rescue.miles.pace.PaceRolloutFn,
#                                  Miles' fully-async rollout with rescue's schedule)
#                      or a budget-regime arm (launch/budget.sh, as for the single-turn
#                      arms of launch/rlvr_config.sh), all with the never-drop gate, the reward
#                      hook and R = 0 for budget failures (RESCUE_TRUNCATED_REWARD=zero):
#                      zero (nothing masked), mask (capped trajectories loss-masked:
#                      --rollout-sample-filter-path filters.mask_truncated_zero_reward),
#                      matched (the mask arm with each step rescaled to the update norm
#                      the zero arm takes on the same batch from the same state:
#                      rescue.miles.matched; every step's forward and backward work doubles,
#                      and GLOBAL_BATCH_SIZE must divide ROLLOUT_BATCH_SIZE*N_SAMPLES),
#                      step-control (the zero arm's step rescaled to the update norm the
#                      mask arm takes on the same batch: the same two-copy schedule, the
#                      copies' roles swapped; the same costs and constraint), drgrpo-mask
#                      (mask with DRGRPO=1), survivor (mask with BASELINE=survivors), turn
#                      (ESTIMATOR=turn). Their RUN_NAME has no K (swe-ARM-seedSEED); they
#                      set ESTIMATOR, DRGRPO and BASELINE themselves and refuse other values.
#   A                  (protect only, required there) keep probability of a stale group,
#                      0 < A <= 1 (RESCUE_A). A=1 is never-drop with protect's hook.
#   SEED               1. Replicate seed, an integer >= 0: the protect coin (RESCUE_SEED), Miles'
#                      --seed and --rollout-seed (prompt order). Equal seeds give the arms the
#                      same prompts.
#   STALENESS          2. K of --max-weight-staleness: a group is stale when current weight
#                      version - its oldest version > K.
#   PACE_WINDOW        (pace only; empty) Groups in flight + buffered + taken this step
#                      (RESCUE_PACE_WINDOW), from ROLLOUT_BATCH_SIZE to
#                      (STALENESS + 1) * ROLLOUT_BATCH_SIZE; empty = the largest. Not part
#                      of RUN_NAME: set RUN_NAME to keep runs with another window apart.
#   PACE_STRAGGLER_S   (pace only; TRIAL_TIMEOUT + 1800) Seconds after its admission past
#                      which pace abandons a group still in flight as a no-result (census
#                      reason pace_straggler) and goes on (RESCUE_PACE_STRAGGLER_S); 0 never.
#   BASELINE           all. Group-baseline population of the protect reward hook
#                      (RESCUE_BASELINE): all | survivors.
#
# ── The estimator (the same in every arm) ───────────────────────────────────────────────
#   ESTIMATOR          group. group: GRPO's group-mean baseline. turn: the turn-reached
#                      baseline per token (RESCUE_ESTIMATOR=turn): the reward hook
#                      (rescue.miles.reward.post_process_rewards) runs in every arm.
#   DRGRPO             0. 1: Dr. GRPO in every arm: --disable-grpo-std-normalization and
#                      --custom-pg-loss-reducer-function-path rescue.miles.drgrpo.pg_loss_reducer.
#   DRGRPO_DIVISOR     (empty) Dr. GRPO's constant divisor (RESCUE_DRGRPO_DIVISOR), a number
#                      > 0; empty = --rollout-max-response-len (MAX_RESPONSE_LEN).
#                      Every arm also runs rescue's policy loss and before-train-step hook
#                      (train/rescue/update_norm, train/rescue/adv_*). A stale-handling arm
#                      with ESTIMATOR=turn or DRGRPO=1 has them in its RUN_NAME (-est-turn,
#                      -drgrpo) and tags (estimator:turn, drgrpo:1): a cohort of its own.
#
# ── The gradient oracle (launch/oracle.sh, `make oracle`) ───────────────────────────────
#   CKPT               (required) Megatron checkpoint directory of the recording run
#                      (--load): every arm's gradient is taken at these weights.
#   CKPT_STEP          (empty) --ckpt-step: which saved step of CKPT; empty = its latest.
#   DUMPS              (required) the recording run's dump directory (its rollout_data/*.pt):
#                      a never-drop run with dumps (ARM=never-drop DUMP_STEPS=N).
#   ORACLE_DIR         DUMPS/oracle. Where `rescue oracle build` writes the arms' replay
#                      inputs and the capture writes gradients or statistics.
#   ORACLE_ARMS        all,drop,stale,protect. Arms replayed per dumped step (all first),
#                      separated by commas or spaces.
#   ORACLE_A           0.5. Keep probabilities of the protect arms (commas or spaces).
#   ORACLE_STREAM      0. 1: keep each step's earlier arms in host memory and write only
#                      inner products and norms (RESCUE_ORACLE_STREAM); 0 writes every
#                      arm's full gradient (4 bytes per parameter per arm and step).
#   ORACLE_FORCE       0. 1: rebuild ORACLE_DIR when it already holds oracle.json.
#   The replay uses this file's model, batch (ROLLOUT_BATCH_SIZE*N_SAMPLES rollouts per step,
#   one optimizer step each), parallelism (TP, CP, MAX_TOKENS_PER_GPU), ESTIMATOR, DRGRPO, OFFPOLICY,
#   BASELINE and loss settings: set them as the recording run had them. All GPUS_PER_NODE
#   GPUs of node 0 train (no rollout engines).
#
# ── Cluster (Ray) ───────────────────────────────────────────────────────────────────────
#   NNODES             1. Nodes in the job; run the same command on every node.
#   NODE_RANK          0. This node; 0 starts the Ray head and submits the job.
#   MASTER_ADDR        127.0.0.1. Address of node 0 (set it on every node when NNODES > 1).
#   GPUS_PER_NODE      8. GPUs each node gives to Ray.
#   RAY_PORT           6379. Ray head port.
#   RAY_DASHBOARD_PORT 8265. Ray dashboard port (`ray job submit --address`).
#   RAY_WAIT_S         600. Seconds node 0 waits for all NNODES nodes to join.
#   NODE_ADDR          MASTER_ADDR on node 0, else this node's first address (hostname -I).
#                      The address this node gives Ray (--node-ip-address).
#   RAY_STOP           1. Before starting, stop what this launcher started on this node in
#                      an earlier run (Ray, the housekeeper, the pilot's SGLang server), by
#                      the process ids it recorded in RUN_STATE_DIR; nothing else is touched.
#   RUN_STATE_DIR      OUTPUT_DIR/.launch/<hostname>. Where those process ids are recorded.
#   ACTOR_NUM_NODES    1. Training nodes.
#   ACTOR_GPUS_PER_NODE  GPUS_PER_NODE/2 on one node, else GPUS_PER_NODE. Training GPUs a node.
#                      TP x CP must divide ACTOR_NUM_NODES x ACTOR_GPUS_PER_NODE.
#   ROLLOUT_NUM_GPUS   NNODES*GPUS_PER_NODE - ACTOR_NUM_NODES*ACTOR_GPUS_PER_NODE (SGLang).
#   ROLLOUT_GPUS_PER_ENGINE  1. GPUs per SGLang engine (must divide ROLLOUT_NUM_GPUS).
#   The RolloutManager (the agent's trials, Docker, the dumps) is pinned to node 0
#   (--pin-rollout-manager-to-head).
#   HEALTH_CHECK_FIRST_WAIT  MAX_TURNS*60. Seconds before Miles' fault tolerance for the
#                      rollout engines (--use-fault-tolerance) starts its health checks: one
#                      40-turn trial with 60 s commands.
#
# ── Paths ───────────────────────────────────────────────────────────────────────────────
#   MILES_DIR          /root/miles. Miles checkout (must hold train_async.py; train.py for
#                      the oracle).
#   MEGATRON_DIR       /root/Megatron-LM. Megatron-LM checkout (on the job's PYTHONPATH).
#   OUTPUT_DIR         /root/rescue-runs. Runs, data and pilot results (shared storage when
#                      NNODES > 1).
#   HF_CHECKPOINT      /root/models/Qwen3-8B. Hugging Face checkpoint (SGLang, tokenizer).
#   REF_LOAD           /root/models/Qwen3-8B_torch_dist. Megatron checkpoint to start from.
#   SAVE_DIR           OUTPUT_DIR/RUN_NAME/checkpoints. Checkpoints (--save and --load: a
#                      rerun of the same arm resumes).
#   TASKS_JSONL        OUTPUT_DIR/data/swe_smith_tasks.jsonl. All prepared tasks (pilot input).
#   SUBSET_FILE        OUTPUT_DIR/pilot/subset.txt. Task subset chosen by the pilot.
#   PROMPT_DATA        OUTPUT_DIR/data/swe_smith_pilot.jsonl. Training prompts: the tasks of
#                      SUBSET_FILE (written by `make swe-prepare` once the pilot has run).
#
# ── Model and rollout (shared by the arms) ──────────────────────────────────────────────
#   MODEL_TYPE         qwen3-8B. Miles model script scripts/models/MODEL_TYPE.py.
#   MODEL_ARGS         (empty) Megatron architecture flags; empty reads them from MODEL_TYPE.
#   TITO_MODEL         qwen3. The model family: --tito-model of Miles' session server, and
#                      with it (rescue_family in derive.sh, checked against Miles' own
#                      registry) SGLang's tool-call and reasoning parsers
#                      (--sglang-tool-call-parser, --sglang-reasoning-parser; qwen3: qwen25
#                      and qwen3), the chat template and its kwargs, for training and the
#                      pilot's server alike. Without the tool-call parser SGLang returns the
#                      agent's tool calls as text and every trial ends in format errors.
#   MAX_TURNS          40. Turn cap of the agent: model calls per trial (RESCUE_SWE_STEP_LIMIT).
#   AGENT_CONCURRENCY  ROLLOUT_BATCH_SIZE*N_SAMPLES. Trials at once (RESCUE_SWE_MAX_CONCURRENCY).
#   AGENT_ENV          (empty) More settings of the agent for the job's runtime env and the
#                      pilot, as NAME=VALUE words, e.g. 'RESCUE_SWE_COMMAND_TIMEOUT=120'
#                      (names: swe_smith_tasks/agent_settings.py). The sandbox and the
#                      timeouts below have settings of their own and are refused here.
#   MAX_SEQ_LEN        40960. Whole-trajectory context: --max-seq-len,
#                      --rollout-max-context-len and SGLang's context (--sglang-context-length,
#                      the pilot's --context-length), Qwen3-8B's max_position_embeddings. A
#                      request that would not fit ends the trial as a budget failure
#                      (context_limit). Rollout and training must be the same model: no
#                      rope_scaling in the checkpoint (SGLang would apply YaRN, Miles'
#                      Megatron trains plain RoPE; pre-flight refuses it).
#   EXTEND_CONTEXT     0. 1: allow MAX_SEQ_LEN above the checkpoint's max_position_embeddings,
#                      plain RoPE on both sides past the trained range (the same, untrained
#                      positions in rollout and training); sets
#                      SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 for the engines and the
#                      pilot's server. An explicit choice; pre-flight fails without it.
#   MAX_RESPONSE_LEN   8192. Tokens per model call (--rollout-max-response-len); below MAX_SEQ_LEN.
#   ROLLOUT_BATCH_SIZE 16. Prompts per step.
#   N_SAMPLES          8. Rollouts per prompt (the group size n).
#   GLOBAL_BATCH_SIZE  ROLLOUT_BATCH_SIZE*N_SAMPLES. Samples per optimizer step.
#   NUM_ROLLOUT        200. Training steps.
#   TEMPERATURE        1.0. Sampling temperature (--rollout-temperature; the pilot's too).
#   TOP_P              1.0. --rollout-top-p; the pilot sends the same.
#   TOP_K              -1 (off). --rollout-top-k; the pilot sends the same. With the family's
#                      CHAT_TEMPLATE_KWARGS (clear_thinking) and MAX_RESPONSE_LEN these are
#                      every sampling setting: min_p and repetition_penalty are SGLang's OpenAI
#                      defaults in both, since training's engines
#                      (--sglang-sampling-defaults openai) and the pilot's server
#                      (--sampling-defaults openai) never read the checkpoint's
#                      generation_config (swe_smith_tasks/sampling.py).
#
# ── The sandbox (the same for the pilot, every arm and the grader; fixed, never derived
#    from the node) ──────────────────────────────────────────────────────────────────────
#   SANDBOX_CPUS       2. docker run --cpus of every task container (RESCUE_SWE_CONTAINER_CPUS).
#   SANDBOX_MEMORY     10g. docker run --memory, as the SWE-smith harness grades
#                      (RESCUE_SWE_CONTAINER_MEMORY).
#   SANDBOX_PIDS       4096. docker run --pids-limit (RESCUE_SWE_CONTAINER_PIDS).
#                      The agent's container is cut from the network after checkout.
#   TIME_BUDGET        3600. The agent's own seconds (its model calls and commands) per trial
#                      (RESCUE_SWE_TIME_BUDGET): past it the trial is a budget failure.
#   TRIAL_TIMEOUT      5400. Seconds per trial, start and grading included
#                      (RESCUE_SWE_TRIAL_TIMEOUT; the trainer's limit on one sample,
#                      RESCUE_SWE_OUTER_TIMEOUT, is TRIAL_TIMEOUT + 1800): past it, a no-result.
#                      TIME_BUDGET + one request, one command and a container start must fit.
#   The sandbox and the timeouts are recorded in the run's settings (SAVE_DIR/rescue-run.json)
#   and in the wandb config (--env-report, launcher_env_report).
#
# ── The watchdog (every arm) ────────────────────────────────────────────────────────────
#   WATCHDOG_WINDOW    64. Groups the no-result fraction is taken over (RESCUE_WATCHDOG_WINDOW;
#                      0 off).
#   WATCHDOG_MAX_NO_RESULT 0.5. The run stops, with one line naming the dominant reason and
#                      the last errors and the census flushed to wandb first, when more than
#                      this fraction of the last WATCHDOG_WINDOW groups had no result
#                      (RESCUE_WATCHDOG_MAX_NO_RESULT).
#   WATCHDOG_IDLE_S    (2 * TRIAL_TIMEOUT) ... or when no group finished for this many seconds
#                      (RESCUE_WATCHDOG_IDLE_S; 0 off).
#   PAUSE_MODE         in_place. --pause-generation-mode during weight updates: in_place |
#                      retract (abort would abort every group in flight at each update;
#                      Miles' fully-async rollout and pace refuse it).
#
# ── Training ────────────────────────────────────────────────────────────────────────────
#   LR                 1e-6. Adam learning rate (constant).
#   EPS_CLIP           0.2.  EPS_CLIP_HIGH 0.28. PPO clip range (OFFPOLICY=tis).
#                      No KL or entropy term: the 1/A weight scales the whole loss.
#   OFFPOLICY          tis-sc. The off-policy correction, the same in every arm: tis-sc
#                      (the plan's: truncated importance weights plus score centering,
#                      rescue.miles.sc_loss, no PPO clip; each model call records its top
#                      SC_TOP_K log-probs through rescue.miles.topk.agentic_generate) | tis
#                      (Miles' PPO loss with --use-tis; RUN_NAME gets -tis, tags offpolicy:tis).
#   SC_TOP_K           20. tis-sc: K, the head recorded per generated token
#                      (RESCUE_SC_TOP_K); SGLang's router caps chat requests at 20, more
#                      needs --use-miles-router in EXTRA_ARGS. Cost: 8 bytes per position
#                      and head entry in memory (K=20: 160 B), ~30 bytes of JSON in replies.
#   SC_CAP             2.0. tis-sc: C, the truncation cap of the importance weights (RESCUE_SC_CAP).
#   TP                 2. Tensor parallel size.   CP 2. Context parallel size.
#   MAX_TOKENS_PER_GPU 32768. Dynamic batch size budget.
#   SGLANG_MEM_FRACTION 0.8. --sglang-mem-fraction-static.
#   SAVE_INTERVAL      20. Steps between checkpoints.
#   CKPT_KEEP          2. Checkpoints kept in SAVE_DIR (the newest; the housekeeper deletes
#                      older iter_* folders); 0 keeps all.
#   CKPT_GB            120. Disk estimate of one checkpoint (Qwen3-8B with its Adam state);
#                      pre-flight needs room for CKPT_KEEP + 1 of them.
#   EXTRA_ARGS         (empty) Appended verbatim to train_async.py's flags (word-split).
#
# ── Logging and dumps ───────────────────────────────────────────────────────────────────
#   RUN_NAME           swe-ARM[-aA][-kK][-est-turn][-drgrpo][-tis]-seedSEED, e.g.
#                      swe-protect-a0.5-k2-seed1, swe-drop-k2-est-turn-seed1.
#   WANDB_PROJECT      rescue-swe.
#   WANDB_GROUP        RUN_NAME. Miles names the run after its group (random suffix off), so
#                      this is also the run name; WANDB_TAGS arm:..,a:..,k:..,seed:.. group
#                      the seeds of one arm.
#   SUBMISSION_ID      RUN_NAME-<date>-<time>. Ray job id of the run (the housekeeper follows
#                      the job by it; `ray job status SUBMISSION_ID`).
#   WANDB_MODE         online | offline | disabled (default online). Online needs
#                      WANDB_API_KEY exported before the launch (Ray inherits it).
#   DUMP_DIR           OUTPUT_DIR/RUN_NAME/dumps. Rollout dumps (--save-debug-rollout-data).
#   DUMP_STEPS         50. Keep the dumps of steps 0..DUMP_STEPS-1; 0 = no dumps, all = every
#                      step. Miles dumps every step once the flag is set and has no step
#                      limit, so node 0's housekeeper deletes later steps' dumps as they
#                      appear.
#   DUMP_MB_PER_STEP   300. Disk estimate per dumped step (pre-flight needs
#                      DUMP_STEPS*DUMP_MB_PER_STEP free, with the checkpoints).
#   HOUSEKEEP_S        60. Seconds between the housekeeper's rounds. The housekeeper (dump
#                      window, checkpoint retention) runs detached on node 0, its process id
#                      recorded, until the Ray job ends: it does not depend on the shell that
#                      submitted the job.
#   JOB_POLL_S         30. Seconds between the launcher's asks of `ray job status` once `ray
#                      job submit` has stopped following the job's log: that command exits 0
#                      also when its log stream ends while the job still runs, so the
#                      launcher waits for Ray's job server to report the job ended and exits
#                      0 only when it succeeded (rescue_submit_and_wait).
#
# ── Behaviour of the launcher ───────────────────────────────────────────────────────────
#   DRY_RUN            0. 1: print the exact commands (ray start, ray job submit with every
#                      flag) and run nothing. ARM, A, SEED, STALENESS and MILES_DIR are
#                      still checked; missing GPUs only print a warning.
#   PREFLIGHT          1. Run launch/preflight.sh on node 0 before submitting; 0 skips it.
#   RESUME             0. A SAVE_DIR that already holds a run is refused (Miles would resume
#                      from it silently); 1 resumes it, and is refused when the run's settings
#                      differ from those recorded there (each differing key named).
#   REAP               1. Remove task containers left by earlier runs before starting.
#   PULL_IMAGES        0. 1: pre-flight pulls the missing task images instead of failing.
#   RESCUE_DOCKER      docker. Docker command of pre-flight and `rescue swe reap` (may carry
#                      words, e.g. 'sudo docker').
#   JOB_PYTHON         python3. Interpreter of the Ray job (has Miles, rescue's [swe] extra).
#   RESCUE_PY          .venv/bin/python if present, else python3. Runs `rescue swe ...`.
#
# ── Data, pilot, reaper ─────────────────────────────────────────────────────────────────
#   SWE_DATASET        SWE-bench/SWE-smith. Hugging Face dataset or local JSONL/parquet.
#   SWE_SPLIT          train. Dataset split.
#   IMAGE_NAMESPACE    swebench. Namespace task images are rewritten to (e.g. a mirror).
#   PILOT_BASE_URL     (empty) OpenAI-compatible endpoint for the pilot; empty starts an
#                      SGLang server on HF_CHECKPOINT (GPUS_PER_NODE data-parallel
#                      replicas) at PILOT_PORT for the pilot's duration, with training's
#                      context (MAX_SEQ_LEN), parsers and chat template (TITO_MODEL). Either
#                      way the endpoint must return tool calls in tool_calls: `rescue swe
#                      probe` checks it first and names the missing parser flag.
#   PILOT_MODEL        Qwen3-8B. Model name sent to the endpoint (served name of that server).
#   PILOT_PORT         30000.   PILOT_WAIT_S 900 s for that server to come up.
#   PILOT_N            8. Trials per task (the group size of training).
#   PILOT_CONCURRENCY  64. Trials at once.
#   PILOT_TASKS        (empty) Pilot a random sample (seed SEED) of this many tasks. Empty is
#                      refused (a pilot of the whole dataset is days of GPU time) unless
#                      PILOT_ALL=1.
#   PILOT_ALL          0. 1: pilot every task of TASKS_JSONL when PILOT_TASKS is empty.
#   PILOT_RETRY_INFRA  0. 1: rerun the trials that had no result (infrastructure) in PILOT_OUT.
#   PILOT_LOW          0.2.  PILOT_HIGH 0.5. Success-rate window of the kept tasks.
#   PILOT_MAX_INFRA    0.05. A task whose trial attempts had more than this fraction of
#                      infrastructure faults is rejected (--max-infra-fraction).
#   PILOT_PULL         1. Pull the images of the pilot's tasks before the pilot (`rescue swe
#                      pull`); a task whose pull fails is reported and skipped, not tried.
#   PILOT_OUT          OUTPUT_DIR/pilot. Pilot results (resumable) and SUBSET_FILE.
#   REAP_ARGS          (empty) Flags of `rescue swe reap` for `make reap`, e.g. '--dry-run'.
#   The pilot's agent uses MAX_TURNS, AGENT_ENV, the sandbox, MAX_RESPONSE_LEN, TEMPERATURE,
#   TOP_P, TOP_K and the family's chat_template_kwargs, as training does.
#   VALIDATE_OUT       OUTPUT_DIR/validate. `make swe-validate`: the reference solution of every
#                      SUBSET_FILE task graded in the training sandbox, AGENT_CONCURRENCY at
#                      once; VALIDATE_OUT/subset.txt keeps the tasks whose reference resolves.
#   REQUIRE_VALIDATE   1. make swe-prepare writes PROMPT_DATA from VALIDATE_OUT/subset.txt and
#                      refuses without it; 0 takes SUBSET_FILE as it is.
#
# Errors (one line on stderr, exit status 2; every setting is checked before it is used):
#   ARM='x' is not an arm: set ARM to drop, never-drop, protect or pace (stale handling), or ...
#   ESTIMATOR=turn: the budget-regime arms set the estimator themselves: use ARM=turn, ...
#   ARM=matched (or step-control) needs GLOBAL_BATCH_SIZE to divide ROLLOUT_BATCH_SIZE*N_SAMPLES=n: ...
#   ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5
#   A='x' is outside (0, 1]: set A with 0 < A <= 1
#   A=x applies only to ARM=protect: unset A or set ARM=protect
#   PACE_WINDOW=x applies only to ARM=pace: unset PACE_WINDOW or set ARM=pace
#   PACE_WINDOW=x is outside ROLLOUT_BATCH_SIZE..(STALENESS + 1) * ROLLOUT_BATCH_SIZE: ...
#   PAUSE_MODE='x' is not a pause mode: set PAUSE_MODE=in_place or PAUSE_MODE=retract
#   NAME='x' is not a non-negative integer: set NAME=N (every count, size, port and wait)
#   SEED='x' is not a non-negative integer (...): set SEED=N
#   BASELINE='x' is not a baseline population: set BASELINE=all or BASELINE=survivors
#   ESTIMATOR='x' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn
#   OFFPOLICY='x' is not an off-policy correction of these arms: set OFFPOLICY to one of: ...
#   SC_TOP_K=k on the SWE agent's chat requests: SGLang's router refuses top_logprobs above 20
#   SC_CAP='x' is not a number > 0: set SC_CAP=C
#   SGLANG_RETURN_ORIGINAL_LOGPROB=1 ... / EXTRA_ARGS has --use-tis, which OFFPOLICY=tis-sc refuses
#   DRGRPO='x': set DRGRPO=0 or DRGRPO=1
#   DRGRPO_DIVISOR='x' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty
#   DRGRPO_DIVISOR applies only to DRGRPO=1: unset DRGRPO_DIVISOR or set DRGRPO=1
#   TITO_MODEL='x' has no parsers in rescue_family: set TITO_MODEL to one of ...
#   NODE_RANK='x' is not in 0..NNODES-1: set NODE_RANK for this node
#   NNODES=n needs MASTER_ADDR: set MASTER_ADDR to node 0's address on every node
#   TP=t x CP=c = k does not divide the n training GPUs (ACTOR_NUM_NODES x ACTOR_GPUS_PER_NODE)
#   GPUS_PER_NODE=1 on one node leaves no GPU for training or rollout: ...
#   no Miles checkout at MILES_DIR=...: set MILES_DIR to a Miles checkout with train_async.py
#                      (train.py for the oracle)
#   MILES_DIR=... is a slime checkout (it holds slime/, not miles/): set MILES_DIR to a Miles
#                      checkout (radixark/miles)
#   oracle: CKPT is not set / DUMPS is not set / no dump files in DUMPS / ORACLE_A='x' /
#   ORACLE_ARMS: 'x' is not an arm / the oracle replays on one node / TP x CP does not
#   divide GPUS_PER_NODE (each naming the value to set)
#   no GPUs visible (...): run on a GPU node or set GPUS_PER_NODE / CUDA_VISIBLE_DEVICES

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESCUE_DIR=$(cd "$LAUNCH_DIR/.." && pwd)

ARM=${ARM:-}
A=${A:-}
SEED=${SEED:-1}
STALENESS=${STALENESS:-2}
BASELINE=${BASELINE:-all}
ESTIMATOR=${ESTIMATOR:-group}
PACE_WINDOW=${PACE_WINDOW:-}
PACE_STRAGGLER_S=${PACE_STRAGGLER_S:-}
DRGRPO=${DRGRPO:-0}
DRGRPO_DIVISOR=${DRGRPO_DIVISOR:-}

CKPT=${CKPT:-}
CKPT_STEP=${CKPT_STEP:-}
DUMPS=${DUMPS:-}
ORACLE_DIR=${ORACLE_DIR:-${DUMPS:+$DUMPS/oracle}}
ORACLE_ARMS=${ORACLE_ARMS:-all,drop,stale,protect}
ORACLE_A=${ORACLE_A:-0.5}
# Lists take commas or spaces; rescue's flags take commas (empty items are skipped).
ORACLE_ARMS=${ORACLE_ARMS// /,} ORACLE_A=${ORACLE_A// /,}
ORACLE_STREAM=${ORACLE_STREAM:-0}
ORACLE_FORCE=${ORACLE_FORCE:-0}

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
RAY_PORT=${RAY_PORT:-6379}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
RAY_WAIT_S=${RAY_WAIT_S:-600}
RAY_STOP=${RAY_STOP:-1}
NODE_ADDR=${NODE_ADDR:-}
ACTOR_NUM_NODES=${ACTOR_NUM_NODES:-1}
ACTOR_GPUS_PER_NODE=${ACTOR_GPUS_PER_NODE:-}
ROLLOUT_NUM_GPUS=${ROLLOUT_NUM_GPUS:-}
ROLLOUT_GPUS_PER_ENGINE=${ROLLOUT_GPUS_PER_ENGINE:-1}
HEALTH_CHECK_FIRST_WAIT=${HEALTH_CHECK_FIRST_WAIT:-}

MILES_DIR=${MILES_DIR:-/root/miles}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
OUTPUT_DIR=${OUTPUT_DIR:-/root/rescue-runs}
RUN_STATE_DIR=${RUN_STATE_DIR:-$OUTPUT_DIR/.launch/$(hostname -s 2>/dev/null || echo node)}
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/models/Qwen3-8B}
REF_LOAD=${REF_LOAD:-/root/models/Qwen3-8B_torch_dist}
TASKS_JSONL=${TASKS_JSONL:-$OUTPUT_DIR/data/swe_smith_tasks.jsonl}
PILOT_OUT=${PILOT_OUT:-$OUTPUT_DIR/pilot}
SUBSET_FILE=${SUBSET_FILE:-$PILOT_OUT/subset.txt}
PROMPT_DATA=${PROMPT_DATA:-$OUTPUT_DIR/data/swe_smith_pilot.jsonl}

MODEL_TYPE=${MODEL_TYPE:-qwen3-8B}
MODEL_ARGS=${MODEL_ARGS:-}
TITO_MODEL=${TITO_MODEL:-qwen3}
MAX_TURNS=${MAX_TURNS:-40}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-40960}
EXTEND_CONTEXT=${EXTEND_CONTEXT:-0}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-8192}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16}
N_SAMPLES=${N_SAMPLES:-8}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-}
NUM_ROLLOUT=${NUM_ROLLOUT:-200}
AGENT_CONCURRENCY=${AGENT_CONCURRENCY:-}
AGENT_ENV=${AGENT_ENV:-}
TEMPERATURE=${TEMPERATURE:-1.0}
TOP_P=${TOP_P:-1.0}
TOP_K=${TOP_K:--1}
SANDBOX_CPUS=${SANDBOX_CPUS:-2}
SANDBOX_MEMORY=${SANDBOX_MEMORY:-10g}
SANDBOX_PIDS=${SANDBOX_PIDS:-4096}
TIME_BUDGET=${TIME_BUDGET:-3600}
TRIAL_TIMEOUT=${TRIAL_TIMEOUT:-5400}
WATCHDOG_WINDOW=${WATCHDOG_WINDOW:-64}
WATCHDOG_MAX_NO_RESULT=${WATCHDOG_MAX_NO_RESULT:-0.5}
WATCHDOG_IDLE_S=${WATCHDOG_IDLE_S:-}
PAUSE_MODE=${PAUSE_MODE:-in_place}

LR=${LR:-1e-6}
OFFPOLICY=${OFFPOLICY:-tis-sc}
SC_TOP_K=${SC_TOP_K:-20}
SC_CAP=${SC_CAP:-2.0}
EPS_CLIP=${EPS_CLIP:-0.2}
EPS_CLIP_HIGH=${EPS_CLIP_HIGH:-0.28}
TP=${TP:-2}
CP=${CP:-2}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-32768}
SGLANG_MEM_FRACTION=${SGLANG_MEM_FRACTION:-0.8}
SAVE_INTERVAL=${SAVE_INTERVAL:-20}
CKPT_KEEP=${CKPT_KEEP:-2}
CKPT_GB=${CKPT_GB:-120}
EXTRA_ARGS=${EXTRA_ARGS:-}

WANDB_PROJECT=${WANDB_PROJECT:-rescue-swe}
WANDB_MODE=${WANDB_MODE:-online}
DUMP_STEPS=${DUMP_STEPS:-50}
DUMP_MB_PER_STEP=${DUMP_MB_PER_STEP:-300}
HOUSEKEEP_S=${HOUSEKEEP_S:-60}
JOB_POLL_S=${JOB_POLL_S:-30}

DRY_RUN=${DRY_RUN:-0}
PREFLIGHT=${PREFLIGHT:-1}
RESUME=${RESUME:-0}
REAP=${REAP:-1}
PULL_IMAGES=${PULL_IMAGES:-0}
RESCUE_DOCKER=${RESCUE_DOCKER:-docker}
JOB_PYTHON=${JOB_PYTHON:-python3}
if [[ -z ${RESCUE_PY:-} ]]; then
  if [[ -x $RESCUE_DIR/.venv/bin/python ]]; then RESCUE_PY=$RESCUE_DIR/.venv/bin/python; else RESCUE_PY=python3; fi
fi

SWE_DATASET=${SWE_DATASET:-SWE-bench/SWE-smith}
SWE_SPLIT=${SWE_SPLIT:-train}
IMAGE_NAMESPACE=${IMAGE_NAMESPACE:-swebench}
PILOT_MODEL=${PILOT_MODEL:-Qwen3-8B}
PILOT_WAIT_S=${PILOT_WAIT_S:-900}
PILOT_LOW=${PILOT_LOW:-0.2}
PILOT_HIGH=${PILOT_HIGH:-0.5}
PILOT_BASE_URL=${PILOT_BASE_URL:-}
PILOT_PORT=${PILOT_PORT:-30000}
PILOT_N=${PILOT_N:-8}
PILOT_CONCURRENCY=${PILOT_CONCURRENCY:-64}
PILOT_TASKS=${PILOT_TASKS:-}
PILOT_ALL=${PILOT_ALL:-0}
PILOT_RETRY_INFRA=${PILOT_RETRY_INFRA:-0}
PILOT_MAX_INFRA=${PILOT_MAX_INFRA:-0.05}
PILOT_PULL=${PILOT_PULL:-1}
VALIDATE_OUT=${VALIDATE_OUT:-$OUTPUT_DIR/validate}
REQUIRE_VALIDATE=${REQUIRE_VALIDATE:-1}
REAP_ARGS=${REAP_ARGS:-}

# Derived settings are set once the settings they come from are checked (derive.sh, common.sh):
# the layout (ACTOR_GPUS_PER_NODE, ROLLOUT_NUM_GPUS, GLOBAL_BATCH_SIZE, AGENT_CONCURRENCY,
# HEALTH_CHECK_FIRST_WAIT, NODE_ADDR) by rescue_derive_layout, the limits that follow the trial
# timeout (WATCHDOG_IDLE_S, PACE_STRAGGLER_S) by rescue_derive_swe, the family
# (TOOL_CALL_PARSER, REASONING_PARSER, CHAT_TEMPLATE, CHAT_TEMPLATE_KWARGS) by rescue_family,
# and the names (RUN_NAME, WANDB_GROUP, SAVE_DIR, DUMP_DIR) by rescue_derive_names.
