"""The single-turn launchers: the dry-run commands of each arm, the sweep, the settings, the checks.

The launchers run with ``DRY_RUN=1`` against stand-ins (``launch_env``); the printed
``ray job submit`` lines are parsed into ``{flag: [values]}``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from budget_arms import BUDGET_ARMS, budget_env, budget_flags
from launch_env import (
    LAUNCH,
    ROOT,
    SGLANG_SERVER_FLAGS,
    command_lines,
    flag_dict,
    launch,
    split_submit,
    submitted,
)
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture

ARMS = BUDGET_ARMS
#: The flags that distinguish the arms; every other flag is shared.
ARM_FLAGS = {arm: budget_flags(arm) for arm in ARMS}
ARM_FLAG_NAMES = {flag for flags in ARM_FLAGS.values() for flag in flags}
#: The runtime-env settings that distinguish the arms (present in every arm, values differ).
ARM_ENV = {
    arm: {**budget_env(arm), **({"RESCUE_TURN_TOKENS": "256"} if arm == "turn" else {})}
    for arm in ARMS
}
ARM_ENV_NAMES = {k for env in ARM_ENV.values() for k in env}
#: Shared flags and settings whose value is derived from the run name (arm, cap, seed).
NAMED_FLAGS = {"--load", "--save", "--wandb-group", "--wandb-dir", "--save-debug-rollout-data"}
NAMED_ENV = {"WANDB_TAGS"}
#: What Miles would use to keep or drop a group by its outcome or its length.
EXCLUSIONS = (
    "--dynamic-sampling-filter-path",
    "--over-sampling-batch-size",
    "--rollout-submission-granularity",
    "--partial-rollout",
)


def rlvr(script: str, bin_dir: Path, miles_dir: Path, **env: str):
    result = launch(script, bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr
    return result


def arm_run(arm: str, bin_dir: Path, miles_dir: Path, **env: str):
    return submitted(
        rlvr("rlvr_arm.sh", bin_dir, miles_dir, **{"ARM": arm, "CAP": "1024", **env}).stdout,
        "train.py",
    )


# ── each arm has exactly its own settings ───────────────────────────────────────────────


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_submits_exactly_its_own_flags_and_settings(arm, bin_dir, miles_dir):
    flags, env, _ = arm_run(arm, bin_dir, miles_dir)
    assert {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES} == ARM_FLAGS[arm]
    assert {k: v for k, v in env.items() if k in ARM_ENV_NAMES} == ARM_ENV[arm]


def _make_dry_run(target: str, miles_dir: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", target, *words],
        cwd=ROOT,
        env={
            **os.environ,
            "DRY_RUN": "1",
            "MILES_DIR": str(miles_dir),
            "JOB_PYTHON": sys.executable,
            "RESCUE_PY": sys.executable,
            **({"SUBMISSION_ID": "fixed"} if target == "rlvr-arm" else {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_rlvr_arm_dry_runs_differ_only_by_the_arms_own_settings(miles_dir):
    shared, shared_env, rest = {}, {}, {}
    for arm in ARMS:
        result = _make_dry_run("rlvr-arm", miles_dir, f"ARM={arm}", "CAP=1024")
        assert result.returncode == 0, result.stderr
        flags, env, _ = submitted(result.stdout, "train.py")
        shared[arm] = {f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES | NAMED_FLAGS}
        shared_env[arm] = {k: v for k, v in env.items() if k not in ARM_ENV_NAMES | NAMED_ENV}
        assert {k: env.get(k) for k in ARM_ENV[arm]} == ARM_ENV[arm]
        rest[arm] = [
            w
            for w in command_lines(result.stdout)
            if w[:3] != ["ray", "job", "submit"] and "submit" not in w
        ]
    first = ARMS[0]
    for arm in ARMS[1:]:
        assert shared[arm] == shared[first], arm
        assert shared_env[arm] == shared_env[first], arm
        assert rest[arm] == rest[first], arm


#: What every arm has: the reward hook scoring truncation 0, the census, the logging contract.
EVERY_ARM = {
    "--custom-reward-post-process-path": ["rescue.miles.reward.post_process_rewards"],
    "--custom-rollout-log-function-path": ["rescue.miles.log.log_rollout"],
    "--loss-type": ["custom_loss"],
    "--custom-loss-function-path": ["rescue.miles.loss.policy_loss"],
    "--custom-megatron-before-train-step-hook-path": ["rescue.miles.train_step.before_train_step"],
    "--colocate": [],
    "--actor-num-gpus-per-node": ["1"],
    "--n-samples-per-prompt": ["8"],
    "--rollout-max-response-len": ["1024"],
    "--advantage-estimator": ["grpo"],
    "--rm-type": ["math"],
    "--apply-chat-template": [],
    "--input-key": ["prompt"],
    "--label-key": ["label"],
}


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_scores_truncation_zero_logs_the_census_and_dumps(arm, bin_dir, miles_dir):
    flags, env, job = arm_run(arm, bin_dir, miles_dir, SEED="2")
    assert {f: flags.get(f) for f in EVERY_ARM} == EVERY_ARM
    assert env["RESCUE_TRUNCATED_REWARD"] == "zero"
    name = f"rlvr-{arm}-cap1024-seed2"
    assert flags["--wandb-group"] == [name] and "--disable-wandb-random-suffix" in flags
    assert env["WANDB_TAGS"] == f"arm:{arm},seed:2,cap:1024"
    assert flags["--save-debug-rollout-data"] == [
        f"/runs/{name}/dumps/rollout_data/{{rollout_id}}.pt"
    ]
    assert flags["--seed"] == ["2"] and flags["--rollout-seed"] == ["2"]
    assert job[1].endswith("/train.py") and "--fully-async" not in flags


#: OFFPOLICY's flags in the single-turn arms: none (the default, on-policy), tis, tis-sc.
OFFPOLICY_FLAGS = {
    "none": {"--custom-loss-function-path": ["rescue.miles.loss.policy_loss"]},
    "tis": {"--custom-loss-function-path": ["rescue.miles.loss.policy_loss"], "--use-tis": []},
    "tis-sc": {
        "--custom-loss-function-path": ["rescue.miles.sc_loss.policy_loss"],
        "--custom-generate-function-path": ["rescue.miles.topk.generate"],
    },
}


@pytest.mark.parametrize("offpolicy", ["none", "tis", "tis-sc"])
def test_offpolicy_is_the_same_in_every_arm_and_names_its_cohort(offpolicy, bin_dir, miles_dir):
    shared = {}
    for arm in ARMS:
        env = {} if offpolicy == "none" else {"OFFPOLICY": offpolicy}
        flags, run_env, _ = arm_run(arm, bin_dir, miles_dir, SEED="2", **env)
        wanted = {**OFFPOLICY_FLAGS["none"], "--use-tis": None,
                  "--custom-generate-function-path": None, **OFFPOLICY_FLAGS[offpolicy]}  # fmt: skip
        assert {f: flags.get(f) for f in wanted} == wanted
        sc = {k: run_env.get(k) for k in ("RESCUE_SC_TOP_K", "RESCUE_SC_CAP")}
        assert sc == ({"RESCUE_SC_TOP_K": "20", "RESCUE_SC_CAP": "2.0"} if offpolicy == "tis-sc"
                      else {"RESCUE_SC_TOP_K": None, "RESCUE_SC_CAP": None})  # fmt: skip
        suffix = "" if offpolicy == "none" else f"-{offpolicy}"
        assert flags["--wandb-group"] == [f"rlvr-{arm}-cap1024{suffix}-seed2"]
        tag = "" if offpolicy == "none" else f",offpolicy:{offpolicy}"
        assert run_env["WANDB_TAGS"] == f"arm:{arm},seed:2,cap:1024{tag}"
        shared[arm] = {f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES | NAMED_FLAGS}
    assert all(shared[arm] == shared[ARMS[0]] for arm in ARMS)


def test_the_judge_reads_each_offpolicy_as_its_own_cohort(bin_dir, miles_dir):
    from rescue.judge.runs import identify

    for offpolicy, setting in (("none", None), ("tis", "tis"), ("tis-sc", "tis-sc")):
        flags, env, _ = arm_run("mask", bin_dir, miles_dir, OFFPOLICY=offpolicy)
        for where in ({"group": flags["--wandb-group"][0]}, {"tags": env["WANDB_TAGS"]}):
            cond, seed = identify(**where)
            assert (cond.family if "group" in where else "rlvr", cond.arm, seed, cond.setting) == (
                "rlvr", "mask", 1, setting,
            ), where  # fmt: skip


@pytest.mark.parametrize("arm", ARMS)
def test_no_arm_has_an_outcome_dependent_group_filter(arm, bin_dir, miles_dir):
    """Miles' non-zero-std dynamic filter (and over-sampling, sample-level submission and
    partial rollout, which keep the groups that finish first) would exclude groups by
    their outcome or length: none of them is on in any arm."""
    flags, _, _ = arm_run(arm, bin_dir, miles_dir)
    assert [f for f in EXCLUSIONS if f in flags] == []


@pytest.mark.parametrize("flag", EXCLUSIONS)
def test_extra_args_cannot_bring_an_outcome_dependent_filter_back(flag, bin_dir, miles_dir):
    value = "x.y.z" if flag != "--partial-rollout" else ""
    result = launch(
        "rlvr_arm.sh",
        bin_dir,
        miles_dir,
        DRY_RUN="1",
        ARM="zero",
        CAP="1024",
        EXTRA_ARGS=f"--lr-warmup-iters 0 {flag} {value}",
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"rlvr-arm: error: EXTRA_ARGS has {flag}, an outcome-dependent exclusion no "
        "single-turn arm may have: remove it from EXTRA_ARGS\n"
    )


def test_the_run_is_one_colocated_job_on_a_run_slot_after_a_head_with_slots(bin_dir, miles_dir):
    out = rlvr("rlvr_arm.sh", bin_dir, miles_dir, ARM="mask", CAP="1024").stdout
    lines = command_lines(out)
    (start,) = [w for w in lines if "ray" in w[:3] and "start" in w[:4]]
    assert start[:2] == ["env", "RAY_JOB_START_TIMEOUT_SECONDS=31536000"]
    head = flag_dict(start[4:])
    assert head["--head"] == [] and head["--num-gpus"] == ["8"]
    assert json.loads(head["--resources"][0]) == {"rescue_run_slot": 8}
    (submit,) = [w for w in lines if w[:3] == ["ray", "job", "submit"]]
    _, _, _, ray_opts = split_submit(submit, "train.py")
    assert json.loads(ray_opts["--entrypoint-resources"][0]) == {"rescue_run_slot": 1}
    assert ray_opts["--entrypoint-num-cpus"] == ["1"] and "--no-wait" not in ray_opts
    assert ray_opts["--submission-id"][0].startswith("rlvr-mask-cap1024-seed1-")
    assert "ray must not run" not in out


def test_other_nodes_join_with_their_run_slots_and_submit_nothing(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_arm.sh",
        bin_dir,
        miles_dir,
        ARM="zero",
        CAP="1024",
        NNODES="3",
        NODE_RANK="2",
        MASTER_ADDR="10.0.0.1",
        NODE_ADDR="10.0.0.3",
        GPUS_PER_RUN="2",
        TP="2",
    ).stdout
    lines = command_lines(out)
    assert not [w for w in lines if w[:2] == ["ray", "job"]]
    (start,) = [w for w in lines if w[:2] == ["ray", "start"]]
    flags = flag_dict(start[2:])
    assert flags["--address"] == ["10.0.0.1:6379"] and flags["--node-ip-address"] == ["10.0.0.3"]
    assert json.loads(flags["--resources"][0]) == {"rescue_run_slot": 4}


def test_ray_start_0_submits_to_the_running_cluster(bin_dir, miles_dir):
    out = rlvr("rlvr_arm.sh", bin_dir, miles_dir, ARM="zero", CAP="1024", RAY_START="0").stdout
    lines = command_lines(out)
    assert not [w for w in lines if "start" in w[:4]]
    assert len([w for w in lines if w[:3] == ["ray", "job", "submit"]]) == 1


# ── every setting changes what it names ──────────────────────────────────────────────────

OVERRIDES = [
    ({"SEED": "3"}, "--seed", ["3"]),
    ({"CAP": "2048"}, "--rollout-max-response-len", ["2048"]),
    ({"GPUS_PER_RUN": "2"}, "--actor-num-gpus-per-node", ["2"]),
    ({"GPUS_PER_RUN": "2"}, "--num-gpus-per-node", ["2"]),
    ({"RM_TYPE": "deepscaler"}, "--rm-type", ["deepscaler"]),
    ({"PROMPT_DATA": "/d.jsonl"}, "--prompt-data", ["/d.jsonl"]),
    ({"RLVR_DATASET": "math"}, "--prompt-data", ["/runs/data/rlvr-math.jsonl"]),
    ({"NUM_ROLLOUT": "7"}, "--num-rollout", ["7"]),
    ({"ROLLOUT_BATCH_SIZE": "4"}, "--rollout-batch-size", ["4"]),
    ({"ROLLOUT_BATCH_SIZE": "4"}, "--global-batch-size", ["32"]),
    ({"N_SAMPLES": "4"}, "--n-samples-per-prompt", ["4"]),
    ({"GLOBAL_BATCH_SIZE": "128"}, "--global-batch-size", ["128"]),
    ({"TEMPERATURE": "0.7"}, "--rollout-temperature", ["0.7"]),
    ({"LR": "2e-6"}, "--lr", ["2e-6"]),
    ({"EPS_CLIP_HIGH": "0.3"}, "--eps-clip-high", ["0.3"]),
    ({"SGLANG_MEM_FRACTION": "0.5"}, "--sglang-mem-fraction-static", ["0.5"]),
    ({"MAX_TOKENS_PER_GPU": "8192"}, "--max-tokens-per-gpu", ["8192"]),
    ({"GPUS_PER_RUN": "2", "TP": "2"}, "--tensor-model-parallel-size", ["2"]),
    ({"GPUS_PER_RUN": "2", "CP": "2"}, "--context-parallel-size", ["2"]),
    ({"SAVE_INTERVAL": "10"}, "--save-interval", ["10"]),
    ({"HF_CHECKPOINT": "/m"}, "--hf-checkpoint", ["/m"]),
    ({"REF_LOAD": "/m_torch_dist"}, "--ref-load", ["/m_torch_dist"]),
    ({"WANDB_PROJECT": "p"}, "--wandb-project", ["p"]),
    ({"WANDB_MODE": "offline"}, "--wandb-mode", ["offline"]),
    ({"RUN_NAME": "r"}, "--wandb-group", ["r"]),
    ({"SAVE_DIR": "/ck"}, "--save", ["/ck"]),
    ({"DUMP_DIR": "/du"}, "--save-debug-rollout-data", ["/du/rollout_data/{rollout_id}.pt"]),
    ({"DUMP_STEPS": "0"}, "--save-debug-rollout-data", None),
    ({"MODEL_ARGS": "--num-layers 2"}, "--num-layers", ["2"]),
    ({"MODEL_TYPE": "qwen3-8B"}, "--num-layers", ["36"]),
    ({"EXTRA_ARGS": "--foo 1 --bar"}, "--foo", ["1"]),
]


@pytest.mark.parametrize(("env", "flag", "values"), OVERRIDES, ids=lambda x: str(x))
def test_a_variable_changes_its_flag(env, flag, values, bin_dir, miles_dir):
    flags, _, _ = arm_run("mask", bin_dir, miles_dir, **env)
    assert flags.get(flag) == values


def test_the_model_defaults_to_miles_qwen3_1_7b_script(bin_dir, miles_dir):
    flags, _, _ = arm_run("zero", bin_dir, miles_dir)
    assert flags["--num-layers"] == ["28"] and flags["--hidden-size"] == ["2048"]
    assert flags["--hf-checkpoint"] == ["/root/models/Qwen3-1.7B"]


def test_turn_tokens_and_the_drgrpo_divisor_reach_their_arms_only(bin_dir, miles_dir):
    _, env, _ = arm_run("turn", bin_dir, miles_dir, TURN_TOKENS="128")
    assert env["RESCUE_TURN_TOKENS"] == "128"
    _, env, _ = arm_run("zero", bin_dir, miles_dir, TURN_TOKENS="128")
    assert "RESCUE_TURN_TOKENS" not in env
    _, env, _ = arm_run("drgrpo-mask", bin_dir, miles_dir, DRGRPO_DIVISOR="4096")
    assert env["RESCUE_DRGRPO_DIVISOR"] == "4096"
    _, env, _ = arm_run("drgrpo-mask", bin_dir, miles_dir)
    assert "RESCUE_DRGRPO_DIVISOR" not in env  # the reducer's default: the cap


def test_job_start_timeout_and_run_slots_follow_their_settings(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_arm.sh",
        bin_dir,
        miles_dir,
        ARM="zero",
        CAP="1024",
        JOB_START_TIMEOUT_S="77",
        GPUS_PER_NODE="4",
        GPUS_PER_RUN="2",
    ).stdout
    (start,) = [w for w in command_lines(out) if w[:1] == ["env"]]
    assert start[1] == "RAY_JOB_START_TIMEOUT_SECONDS=77"
    assert json.loads(flag_dict(start[4:])["--resources"][0]) == {"rescue_run_slot": 2}


# ── the cap ──────────────────────────────────────────────────────────────────────────────


def _cap_file(path: Path, cap: int, **context: str) -> Path:
    path.write_text(json.dumps({"cap": cap, "rate": 0.3, "rates": [], **context}))
    return path


def test_without_cap_the_calibrated_cap_is_read(bin_dir, miles_dir, tmp_path):
    cap_file = _cap_file(
        tmp_path / "cap.json", 1536, model="/root/models/Qwen3-1.7B", data="/d.jsonl"
    )
    flags, env, _ = arm_run(
        "zero", bin_dir, miles_dir, CAP="", CAP_FILE=str(cap_file), PROMPT_DATA="/d.jsonl"
    )
    assert flags["--rollout-max-response-len"] == ["1536"]
    assert flags["--wandb-group"] == ["rlvr-zero-cap1536-seed1"]
    assert env["WANDB_TAGS"] == "arm:zero,seed:1,cap:1536"


def test_a_cap_file_of_another_model_is_refused(bin_dir, miles_dir, tmp_path):
    cap_file = _cap_file(tmp_path / "cap.json", 1536, model="/other", data="/d.jsonl")
    result = launch(
        "rlvr_arm.sh",
        bin_dir,
        miles_dir,
        DRY_RUN="1",
        ARM="zero",
        CAP_FILE=str(cap_file),
        PROMPT_DATA="/d.jsonl",
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"rlvr-arm: error: cap file {cap_file} was calibrated with model /other, not "
        "/root/models/Qwen3-1.7B: run make rlvr-calibrate again, or set CAP=N\n"
    )


def test_no_cap_and_no_cap_file_is_refused(bin_dir, miles_dir, tmp_path):
    result = launch(
        "rlvr_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ARM="zero", CAP_FILE=str(tmp_path / "c")
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"rlvr-arm: error: no cap file {tmp_path / 'c'}: run make rlvr-calibrate (writes "
        "CAP_FILE), or set CAP=N\n"
    )


# ── invalid input: one documented line, nothing run ──────────────────────────────────────

INVALID = [
    (
        {},
        "ARM is not set: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn",
    ),
    (
        {"ARM": "protect"},
        "ARM='protect' is not a single-turn arm: set ARM=zero, mask, matched, step-control, drgrpo-mask, "
        "survivor or turn",
    ),
    (
        {"ARM": "mask", "ESTIMATOR": "turn"},
        "ESTIMATOR=turn: the budget-regime arms set the estimator themselves: use ARM=turn, "
        "or unset ESTIMATOR",
    ),
    (
        {"ARM": "mask", "DRGRPO": "1"},
        "DRGRPO=1: the budget-regime arms set Dr. GRPO themselves: use ARM=drgrpo-mask, or "
        "unset DRGRPO",
    ),
    (
        {"ARM": "mask", "BASELINE": "survivors"},
        "BASELINE=survivors: the budget-regime arms set the baseline population themselves: "
        "use ARM=survivor, or unset BASELINE",
    ),
    ({"ARM": "mask", "A": "0.5"}, "A=0.5 applies only to the SWE arm ARM=protect: unset A"),
    (
        {"ARM": "mask", "DRGRPO_DIVISOR": "4096"},
        "DRGRPO_DIVISOR applies only to ARM=drgrpo-mask: unset DRGRPO_DIVISOR or set "
        "ARM=drgrpo-mask",
    ),
    (
        {"ARM": "drgrpo-mask", "DRGRPO_DIVISOR": "-1"},
        "DRGRPO_DIVISOR='-1' is not a number > 0: set DRGRPO_DIVISOR=D or leave it empty",
    ),
    (
        {"ARM": "mask", "CAP": "1k"},
        "CAP='1k' is not a positive integer: set CAP=N, or unset it to read CAP_FILE",
    ),
    (
        {"ARM": "mask", "CAP": "20000"},
        "CAP=20000 is not below MAX_TOKENS_PER_GPU=16384: one response would not fit a "
        "micro-batch; raise MAX_TOKENS_PER_GPU",
    ),
    (
        {"ARM": "mask", "RM_TYPE": "f1"},
        "RM_TYPE='f1' is not a grader of the single-turn arms: set RM_TYPE=math, deepscaler or "
        "dapo",
    ),
    (
        {"ARM": "mask", "RLVR_DATASET": "aime"},
        "RLVR_DATASET='aime' is not a dataset: set RLVR_DATASET=gsm8k or RLVR_DATASET=math",
    ),
    (
        {"ARM": "mask", "GPUS_PER_RUN": "16"},
        "GPUS_PER_RUN=16 exceeds GPUS_PER_NODE=8: a run is placed on one node",
    ),
    (
        {"ARM": "mask", "TP": "2"},
        "TP=2 x CP=1 = 2 does not divide GPUS_PER_RUN=1: set TP, CP or GPUS_PER_RUN",
    ),
    ({"ARM": "mask", "RAY_START": "yes"}, "RAY_START='yes': set RAY_START=0 or RAY_START=1"),
    (
        {"ARM": "mask", "CAL_LOW": "0.5", "CAL_HIGH": "0.4"},
        "CAL_LOW=0.5 is above CAL_HIGH=0.4: set CAL_LOW <= CAL_HIGH",
    ),
    (
        {"ARM": "mask", "CAL_HIGH": "1.5"},
        "CAL_HIGH='1.5' is not a rate in [0, 1]: set CAL_HIGH to a number between 0 and 1",
    ),
    (
        {"ARM": "mask", "SEED": "x"},
        "SEED='x' is not a non-negative integer (run names end in -seedSEED, which the judge "
        "reads): set SEED=N",
    ),
    ({"ARM": "mask", "SWEEP_WATCH": "2"}, "SWEEP_WATCH='2': set SWEEP_WATCH=0 or SWEEP_WATCH=1"),
    (
        {"ARM": "mask", "OFFPOLICY": "sc"},
        "OFFPOLICY='sc' is not an off-policy correction of these arms: set OFFPOLICY to one of: "
        "none tis tis-sc",
    ),
    (
        {"ARM": "mask", "OFFPOLICY": "tis-sc", "EXTRA_ARGS": "--rollout-top-p 0.9"},
        "EXTRA_ARGS has --rollout-top-p, which OFFPOLICY=tis-sc refuses (rescue.miles.sc_flags): "
        "remove it or set OFFPOLICY=tis",
    ),
]


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, miles_dir):
    result = launch("rlvr_arm.sh", bin_dir, miles_dir, DRY_RUN="1", **{"CAP": "1024", **env})
    assert result.returncode == 2, result.stdout
    assert result.stderr == f"rlvr-arm: error: {message}\n"
    assert result.stdout == ""


def _rlvr_integer_settings() -> list[str]:
    text = (LAUNCH / "rlvr.sh").read_text()
    body = re.search(r"^RESCUE_RLVR_POSITIVE=\(([^)]*)\)", text, flags=re.M).group(1)
    return body.split()


@pytest.mark.parametrize("name", _rlvr_integer_settings())
@pytest.mark.parametrize("script", ["rlvr_arm.sh", "rlvr_sweep.sh", "rlvr_calibrate.sh"])
def test_a_bad_number_is_one_line_naming_it(name, script, bin_dir, miles_dir):
    prog = script.removesuffix(".sh").replace("_", "-")
    result = launch(script, bin_dir, miles_dir, DRY_RUN="1", ARM="zero", CAP="1024", **{name: "8x"})
    assert result.returncode == 2, result.stdout
    assert result.stderr == f"{prog}: error: {name}='8x' is not a positive integer: set {name}=N\n"


def test_every_rlvr_setting_is_documented_and_every_number_checked():
    text = (LAUNCH / "rlvr_config.sh").read_text()
    header = text[: text.index("RLVR_CONFIG_DIR=")]
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-", text, flags=re.M)
    assert len(names) > 25
    assert [n for n in names if not re.search(rf"\b{n}\b", header)] == []
    numeric = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-([0-9]+)\}$", text, re.M)
    common = (LAUNCH / "common.sh").read_text()
    rlvr = (LAUNCH / "rlvr.sh").read_text()
    switches = re.search(r"^RESCUE_RLVR_SWITCHES=\(([^)]*)\)", rlvr, re.M).group(1).split()
    assert {"RAY_START", "SWEEP_WATCH"} <= set(switches)
    checked = set(_rlvr_integer_settings()) | set(switches)
    for array in ("POSITIVE", "NON_NEGATIVE", "SWITCHES"):
        checked |= set(re.search(rf"^RESCUE_{array}=\(([^)]*)\)", common, re.M).group(1).split())
    assert [n for n, _ in numeric if n not in checked] == []


# ── the sweep ────────────────────────────────────────────────────────────────────────────


def sweep_submits(stdout: str) -> dict[tuple[str, str], tuple]:
    """(arm, seed) -> (flags, env, ray options) of every ``ray job submit`` printed."""
    runs = {}
    for words in command_lines(stdout):
        if words[:3] != ["ray", "job", "submit"]:
            continue
        flags, env, _, ray_opts = split_submit(words, "train.py")
        tags = dict(t.split(":") for t in env["WANDB_TAGS"].split(","))
        key = (tags["arm"], tags["seed"])
        assert key not in runs, key
        runs[key] = (flags, env, ray_opts)
    return runs


def test_the_sweep_submits_every_arm_and_seed_once_as_rlvr_arm_would(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_sweep.sh", bin_dir, miles_dir, ARMS="zero mask turn", SEEDS="3", CAP="1024"
    ).stdout
    runs = sweep_submits(out)
    assert set(runs) == {(a, str(s)) for a in ("zero", "mask", "turn") for s in (1, 2, 3)}
    stamps = set()
    for (arm, seed), (flags, env, ray_opts) in runs.items():
        assert ray_opts["--no-wait"] == []
        sid = ray_opts["--submission-id"][0]
        assert sid.startswith(f"rlvr-{arm}-cap1024-seed{seed}-")
        stamps.add(sid.rsplit("-seed", 1)[1].split("-", 1)[1])
        single_flags, single_env, _ = arm_run(arm, bin_dir, miles_dir, SEED=seed)
        assert flags == single_flags and env == single_env
    assert len(stamps) == 1  # one sweep, one stamp
    lines = command_lines(out)
    (watch,) = [w for w in lines if w[-9:-7] == ["rlvr", "watch"] or "watch" in w]
    assert watch[watch.index("--address") + 1] == "http://127.0.0.1:8265"
    assert watch[watch.index("--poll-s") + 1] == "60"
    housekeepers = [line for line in out.splitlines() if line.startswith("# until job rlvr-")]
    assert len(housekeepers) == 9


@pytest.mark.parametrize("arms", ["zero bogus", "zero,bogus", "zero, bogus"])
def test_the_sweep_checks_every_arm_before_it_starts_anything(arms, bin_dir, miles_dir):
    result = launch("rlvr_sweep.sh", bin_dir, miles_dir, DRY_RUN="1", CAP="1024", ARMS=arms)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.endswith(
        f"rlvr-sweep: error: ARMS='{arms}' names 'bogus', which is not a single-turn arm: set "
        "ARMS to some of zero mask matched step-control drgrpo-mask survivor turn (commas or spaces between "
        "them)\n"
    )


@pytest.mark.parametrize("arms", ["zero,mask", "zero, mask", "zero mask", " zero,,mask "])
def test_the_sweep_takes_arms_separated_by_commas_or_spaces(arms, bin_dir, miles_dir):
    out = rlvr("rlvr_sweep.sh", bin_dir, miles_dir, ARMS=arms, SEEDS="1", CAP="1024",
               FORCE="1").stdout  # fmt: skip
    assert set(sweep_submits(out)) == {("zero", "1"), ("mask", "1")}


def test_the_sweep_prints_what_its_seeds_can_decide_before_it_submits(bin_dir, miles_dir):
    out = rlvr("rlvr_sweep.sh", bin_dir, miles_dir, ARMS="zero mask turn", SEEDS="3",
               CAP="1024").stdout  # fmt: skip
    lines = out.splitlines()
    power = [i for i, x in enumerate(lines) if x.startswith("# power of this sweep's report: ")]
    submits = [i for i, x in enumerate(lines) if x.startswith("ray job submit")]
    assert len(power) == 1 and submits and power[0] < submits[0]
    line = lines[power[0]]
    assert "SEEDS=3 per arm" in line and "P3 " in line and "P7 online " in line


def test_the_sweep_refuses_seeds_that_decide_nothing_unless_forced(bin_dir, miles_dir):
    result = launch("rlvr_sweep.sh", bin_dir, miles_dir, DRY_RUN="1", CAP="1024",
                    ARMS="zero mask", SEEDS="2")  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "rlvr-sweep: error: SEEDS=2: P3, control compare these arms, and the judge decides "
        "nothing on fewer than 3 paired seeds per arm: set SEEDS >= 3, or FORCE=1 to run anyway\n"
    )
    out = rlvr("rlvr_sweep.sh", bin_dir, miles_dir, CAP="1024", ARMS="zero mask", SEEDS="2",
               FORCE="1").stdout  # fmt: skip
    assert "# power of this sweep's report: FORCE=1: SEEDS=2" in out
    assert "decides nothing" in out and len(sweep_submits(out)) == 4
    # an arm no prediction compares alone is not refused
    out = rlvr(
        "rlvr_sweep.sh", bin_dir, miles_dir, CAP="1024", ARMS="drgrpo-mask", SEEDS="1"
    ).stdout
    assert len(sweep_submits(out)) == 1


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ARMS": "zero zero"}, "ARMS='zero zero' names an arm twice: list each arm once"),
        (
            {"ARMS": " "},
            "ARMS is empty: set ARMS to some of zero mask matched step-control drgrpo-mask survivor turn",
        ),
        (
            {"RUN_NAME": "r"},
            "RUN_NAME is set, but every run of a sweep has its own: unset RUN_NAME",
        ),
        ({"SEEDS": "0"}, "SEEDS='0' is not a positive integer: set SEEDS=N"),
        ({"FORCE": "yes"}, "FORCE='yes': set FORCE=0 or FORCE=1"),
    ],
)
def test_sweep_settings_are_checked(env, message, bin_dir, miles_dir):
    result = launch("rlvr_sweep.sh", bin_dir, miles_dir, DRY_RUN="1", CAP="1024", **env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.endswith(f"rlvr-sweep: error: {message}\n")


def test_sweep_poll_and_dir_reach_the_watch(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_sweep.sh",
        bin_dir,
        miles_dir,
        ARMS="zero",
        SEEDS="1",
        CAP="1024",
        SWEEP_POLL_S="5",
        SWEEP_DIR="/s",
    ).stdout
    (watch,) = [w for w in command_lines(out) if "watch" in w]
    assert watch[watch.index("--poll-s") + 1] == "5"
    assert watch[watch.index("--plan") + 1] == "/s/plan.jsonl"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_rlvr_sweep_passes_arms_and_seeds(miles_dir):
    result = _make_dry_run(
        "rlvr-sweep", miles_dir, "ARMS=survivor drgrpo-mask", "SEEDS=2", "CAP=768"
    )
    assert result.returncode == 0, result.stderr
    assert set(sweep_submits(result.stdout)) == {
        (a, s) for a in ("survivor", "drgrpo-mask") for s in ("1", "2")
    }


# ── data and calibration commands ────────────────────────────────────────────────────────


def _cli_words(stdout: str, step: str) -> list[str]:
    (words,) = [w for w in command_lines(stdout) if step in w and "rlvr" in w]
    return words[words.index(step) + 1 :]


def test_prepare_passes_dataset_source_split_and_output(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_prepare.sh",
        bin_dir,
        miles_dir,
        RLVR_DATASET="math",
        RLVR_SOURCE="/rows.parquet",
        RLVR_SPLIT="test",
    ).stdout
    assert flag_dict(_cli_words(out, "prepare")) == {
        "--dataset": ["math"],
        "--split": ["test"],
        "--out": ["/runs/data/rlvr-math.jsonl"],
        "--source": ["/rows.parquet"],
    }
    out = rlvr("rlvr_prepare.sh", bin_dir, miles_dir).stdout
    assert "--source" not in flag_dict(_cli_words(out, "prepare"))


def test_calibrate_serves_the_checkpoint_and_passes_every_setting(bin_dir, miles_dir):
    out = rlvr(
        "rlvr_calibrate.sh",
        bin_dir,
        miles_dir,
        CAL_CAPS="256 512",
        CAL_PROMPTS="64",
        CAL_N="4",
        CAL_LOW="0.25",
        CAL_HIGH="0.35",
        CAL_PORT="31000",
        CAL_CONCURRENCY="16",
        TEMPERATURE="0.9",
        SEED="5",
        CAP_FILE="/c.json",
    ).stdout
    (server,) = [w for w in command_lines(out) if "sglang.launch_server" in w]
    s = flag_dict(server[3:])
    assert s["--model-path"] == ["/root/models/Qwen3-1.7B"] and s["--port"] == ["31000"]
    assert s["--dp-size"] == ["8"]
    assert flag_dict(_cli_words(out, "calibrate")) == {
        "--data": ["/runs/data/rlvr-gsm8k.jsonl"],
        "--model": ["/root/models/Qwen3-1.7B"],
        "--base-url": ["http://127.0.0.1:31000"],
        "--caps": ["256 512"],
        "--out": ["/c.json"],
        "--prompts": ["64"],
        "--n": ["4"],
        "--low": ["0.25"],
        "--high": ["0.35"],
        "--temperature": ["0.9"],
        "--seed": ["5"],
        "--concurrency": ["16"],
    }


def test_calibrate_uses_a_given_server_and_starts_none(bin_dir, miles_dir):
    out = rlvr("rlvr_calibrate.sh", bin_dir, miles_dir, CAL_BASE_URL="http://10.0.0.9:8000").stdout
    assert not [w for w in command_lines(out) if "sglang.launch_server" in w]
    assert flag_dict(_cli_words(out, "calibrate"))["--base-url"] == ["http://10.0.0.9:8000"]


def test_calibrate_needs_the_prepared_data(bin_dir, miles_dir, tmp_path):
    result = launch("rlvr_calibrate.sh", bin_dir, miles_dir, PROMPT_DATA=str(tmp_path / "none"))
    assert result.returncode == 2
    assert result.stderr == (
        f"rlvr-calibrate: error: no PROMPT_DATA={tmp_path / 'none'}: run make rlvr-prepare first\n"
    )


# ── against the real Miles sources ───────────────────────────────────────────────────────


@pytest.fixture
def miles_src() -> Path:
    src = os.environ.get("MILES_SRC")
    if not src:
        pytest.skip("checks the flags against real Miles sources: set MILES_SRC=/path/to/miles")
    return Path(src)


def test_the_qwen3_1_7b_model_script_and_train_py_are_miles_own(miles_src, bin_dir):
    out = rlvr("rlvr_arm.sh", bin_dir, miles_src, ARM="zero", CAP="1024").stdout
    flags, _, job = submitted(out, "train.py")
    assert Path(job[1]) == miles_src / "train.py" and (miles_src / "train.py").is_file()
    assert flags["--num-layers"] == ["28"] and flags["--hidden-size"] == ["2048"]
    assert flags["--num-query-groups"] == ["8"] and "--qk-layernorm" in flags


def _miles_launched_flags(miles_src: Path) -> set[str]:
    """Flags Miles' own launchers and model scripts pass (Megatron's and SGLang's among them)."""
    launched = set()
    for folder in ("examples", "scripts"):
        for path in (miles_src / folder).rglob("*.py"):
            launched.update(re.findall(r"(--[a-z0-9][a-z0-9-]*)[ '\"]", path.read_text()))
    return launched | SGLANG_SERVER_FLAGS


def _check_with_miles_parser(words: list[str], miles_src: Path):
    """Every flag Miles defines parses with its real type and choices; every other one is a
    flag Miles' own launchers pass (Megatron's, SGLang's)."""
    from framework_args import parse_with_miles

    args, rest = parse_with_miles(words)
    leftover = {w for w in rest if w.startswith("--")}
    unknown = sorted(leftover - _miles_launched_flags(miles_src))
    assert unknown == [], unknown
    return args, leftover


@pytest.mark.parametrize("arm", ARMS)
def test_every_arms_flags_parse_with_miles_own_parser(arm, miles_src, bin_dir):
    out = rlvr("rlvr_arm.sh", bin_dir, miles_src, ARM=arm, CAP="1536", SEED="2").stdout
    (submit,) = [w for w in command_lines(out) if w[:3] == ["ray", "job", "submit"]]
    words = submit[submit.index("--") + 3 :]
    args, leftover = _check_with_miles_parser(words, miles_src)
    assert args.colocate is True and args.actor_num_gpus_per_node == 1
    assert args.n_samples_per_prompt == 8 and args.rollout_max_response_len == 1536
    assert args.rm_type == "math" and args.apply_chat_template is True
    assert args.advantage_estimator == "grpo" and args.seed == 2 and args.rollout_seed == 2
    assert args.custom_reward_post_process_path == "rescue.miles.reward.post_process_rewards"
    assert args.custom_rollout_log_function_path == "rescue.miles.log.log_rollout"
    assert args.save_debug_rollout_data.endswith("/dumps/rollout_data/{rollout_id}.pt")
    assert args.wandb_group == f"rlvr-{arm}-cap1536-seed2" and args.use_wandb is True
    # no outcome-dependent exclusion: Miles' defaults, as parsed
    assert args.dynamic_sampling_filter_path is None and args.over_sampling_batch_size is None
    assert args.partial_rollout is False and args.rollout_submission_granularity is None
    masked = "--rollout-sample-filter-path" in budget_flags(arm)  # the registry's mask column
    assert args.rollout_sample_filter_path == (
        "filters.mask_truncated_zero_reward" if masked else None
    )
    assert args.grpo_std_normalization is (arm != "drgrpo-mask")
    assert args.custom_pg_loss_reducer_function_path == (
        "rescue.miles.drgrpo.pg_loss_reducer" if arm == "drgrpo-mask" else None
    )
    converts = budget_flags(arm).get("--custom-convert-samples-to-train-data-path", [None])
    assert args.custom_convert_samples_to_train_data_path == converts[0]  # matched, step-control
    assert args.custom_megatron_before_train_step_hook_path == (
        "rescue.miles.train_step.before_train_step"
    )
    # the model script's and Megatron's flags are left to Megatron's parser
    assert {"--num-layers", "--tensor-model-parallel-size", "--hidden-size"} <= leftover


def test_the_sweeps_flags_parse_with_miles_own_parser(miles_src, bin_dir):
    out = rlvr(
        "rlvr_sweep.sh", bin_dir, miles_src, ARMS=" ".join(ARMS), SEEDS="2", CAP="768", FORCE="1"
    ).stdout
    submits = [w for w in command_lines(out) if w[:3] == ["ray", "job", "submit"]]
    assert len(submits) == 2 * len(ARMS)
    for submit in submits:
        args, _ = _check_with_miles_parser(submit[submit.index("--") + 3 :], miles_src)
        assert args.rollout_max_response_len == 768 and args.dynamic_sampling_filter_path is None


def test_score_centerings_commands_are_accepted_by_its_own_checks(miles_src, bin_dir, monkeypatch):
    """The tis-sc commands, parsed by Miles' parser, pass the checks the loss, the recorder
    and the publication make (rescue.miles.sc_flags); tis does not (it is not the SC loss)."""
    from rescue.miles.sc_flags import check_sc_flags, sc_enabled

    commands = [
        ("rlvr_arm.sh", {"ARM": "mask", "CAP": "1024", "OFFPOLICY": "tis-sc"}),
        ("swe_arm.sh", {"ARM": "protect", "A": "0.5"}),
        ("swe_arm.sh", {"ARM": "turn"}),
    ]
    for script, settings in commands:
        out = launch(script, bin_dir, miles_src, DRY_RUN="1", **settings)
        assert out.returncode == 0, out.stderr
        (submit,) = [w for w in command_lines(out.stdout) if w[:3] == ["ray", "job", "submit"]]
        _, env, _ = submitted(
            out.stdout, "train.py" if script == "rlvr_arm.sh" else "train_async.py"
        )
        for key in ("RESCUE_SC_TOP_K", "RESCUE_SC_CAP"):
            monkeypatch.setenv(key, env[key])
        args, leftover = _check_with_miles_parser(submit[submit.index("--") + 3 :], miles_src)
        assert sc_enabled(args) and args.use_tis is False
        check_sc_flags(args)
        if script == "swe_arm.sh":  # the recorder brings the wrapped function's own flags
            assert args.custom_agent_function_path == "swe_smith_tasks.agent.run"
            assert "--custom-agent-function-path" not in leftover
    out = launch("swe_arm.sh", bin_dir, miles_src, DRY_RUN="1", ARM="drop", OFFPOLICY="tis")
    (submit,) = [w for w in command_lines(out.stdout) if w[:3] == ["ray", "job", "submit"]]
    args, _ = _check_with_miles_parser(submit[submit.index("--") + 3 :], miles_src)
    assert not sc_enabled(args) and args.use_tis is True


@pytest.mark.parametrize("arm", ARMS)
def test_swe_budget_arms_flags_parse_with_miles_own_parser(arm, miles_src, bin_dir):
    out = launch("swe_arm.sh", bin_dir, miles_src, DRY_RUN="1", ARM=arm)
    assert out.returncode == 0, out.stderr
    (submit,) = [w for w in command_lines(out.stdout) if w[:3] == ["ray", "job", "submit"]]
    args, _ = _check_with_miles_parser(submit[submit.index("--") + 3 :], miles_src)
    assert args.custom_async_data_buffer_path == "rescue.miles.buffer.RescueDataBuffer"
    assert args.fully_async is True and args.dynamic_sampling_filter_path is None
    assert args.custom_reward_post_process_path == "rescue.miles.reward.post_process_rewards"


def test_the_matched_arm_needs_whole_steps_of_the_global_batch(bin_dir, miles_dir):
    for script, batch in (("rlvr_arm.sh", 256), ("swe_arm.sh", 128)):
        result = launch(
            script,
            bin_dir,
            miles_dir,
            DRY_RUN="1",
            ARM="matched",
            CAP="1024",
            GLOBAL_BATCH_SIZE="48",
        )
        assert result.returncode == 2 and result.stdout == "", script
        assert result.stderr.endswith(
            f"error: ARM=matched needs GLOBAL_BATCH_SIZE to divide ROLLOUT_BATCH_SIZE*N_SAMPLES="
            f"{batch} (got 48): set GLOBAL_BATCH_SIZE={batch}\n"
        ), result.stderr


@pytest.mark.slow  # half a minute: the power line of every arm at 3 to 10 seeds (make test-all)
def test_the_default_sweep_is_every_arm_at_three_seeds(bin_dir, miles_dir):
    runs = sweep_submits(rlvr("rlvr_sweep.sh", bin_dir, miles_dir, CAP="1024").stdout)
    assert set(runs) == {(a, str(s)) for a in ARMS for s in (1, 2, 3)}
