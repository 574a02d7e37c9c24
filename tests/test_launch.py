"""The SWE-arm launchers: the dry-run commands of each arm, the checks, the pre-flight.

The launchers run with ``DRY_RUN=1`` against a stand-in Miles checkout (``train_async.py``
and a model script), so no GPU, Ray or Miles is needed. The printed ``ray job submit``
line is parsed with ``shlex`` into ``{flag: [values]}``; nothing is grepped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"

#: The flags that distinguish the arms; every other flag is shared.
ARM_FLAGS = {
    "drop": {"--max-weight-staleness": ["2"]},
    "never-drop": {},
    "protect": {
        "--max-weight-staleness": ["2"],
        "--custom-async-data-buffer-path": ["rescue.miles.buffer.RescueDataBuffer"],
        "--custom-reward-post-process-path": ["rescue.miles.reward.post_process_rewards"],
    },
}
ARM_FLAG_NAMES = {flag for flags in ARM_FLAGS.values() for flag in flags}
#: Shared flags whose value is derived from the run name (arm, A, seed).
NAMED_FLAGS = {"--load", "--save", "--wandb-group", "--wandb-dir", "--save-debug-rollout-data"}


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def miles_dir(tmp_path: Path) -> Path:
    """A stand-in Miles checkout: train_async.py and the Qwen3-8B model script."""
    miles = tmp_path / "miles"
    (miles / "scripts" / "models").mkdir(parents=True)
    (miles / "train_async.py").write_text("")
    (miles / "scripts" / "models" / "qwen3-8B.py").write_text(
        'def model_args():\n    return "--num-layers 36\\n --hidden-size 4096 "\n'
    )
    return miles


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """Stand-ins for the node's commands; ray fails, so nothing can start by accident."""
    d = tmp_path / "bin"
    d.mkdir()
    _executable(d / "nvidia-smi", "#!/bin/sh\nexit 0\n")  # no GPUs
    _executable(d / "ray", "#!/bin/sh\necho 'ray must not run in tests' >&2\nexit 99\n")
    return d


def launch(
    script: str, bin_dir: Path, miles_dir: Path | None, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "JOB_PYTHON": sys.executable,
        "RESCUE_PY": sys.executable,
        "OUTPUT_DIR": "/runs",
    }
    if miles_dir is not None:
        base["MILES_DIR"] = str(miles_dir)
    return subprocess.run(
        ["bash", str(LAUNCH / script)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def command_lines(stdout: str) -> list[list[str]]:
    """The printed commands, each split as the shell would (comment lines skipped)."""
    return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith("#")]


def flag_dict(words: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --switch`` -> ``{"--flag": ["v1", "v2"], "--switch": []}``; no repeats."""
    flags: dict[str, list[str]] = {}
    current = None
    for word in words:
        if word.startswith("--"):
            assert word not in flags, f"flag {word} given twice"
            flags[word] = []
            current = word
        else:
            assert current is not None, f"value {word!r} before any flag"
            flags[current].append(word)
    return flags


def submitted(stdout: str) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """(train_async.py flags, runtime env vars, the words before train_async.py's flags)."""
    submits = [w for w in command_lines(stdout) if w[:3] == ["ray", "job", "submit"]]
    assert len(submits) == 1, stdout
    words = submits[0]
    sep = words.index("--")
    ray_opts = flag_dict(words[3:sep])
    (env_json,) = ray_opts["--runtime-env-json"]
    env = json.loads(env_json)["env_vars"]
    job = words[sep + 1 :]
    assert job[1].endswith("/train_async.py")
    return flag_dict(job[2:]), env, job[:2]


def dry_run(arm: str, bin_dir: Path, miles_dir: Path, **env: str):
    extra = {"A": "0.5"} if arm == "protect" else {}
    result = launch("swe_arm.sh", bin_dir, miles_dir, ARM=arm, DRY_RUN="1", **{**extra, **env})
    assert result.returncode == 0, result.stderr
    return result


# ── each arm has exactly its flags ───────────────────────────────────────────────────────


@pytest.mark.parametrize("arm", sorted(ARM_FLAGS))
def test_each_arm_submits_exactly_its_own_flags(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
    own = {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES}
    assert own == ARM_FLAGS[arm]
    assert env["RESCUE_ARM"] == arm
    assert env["RESCUE_SEED"] == "1"
    if arm == "protect":
        assert env["RESCUE_A"] == "0.5"
        assert env["RESCUE_BASELINE"] == "all"
    else:
        assert "RESCUE_A" not in env and "RESCUE_BASELINE" not in env


def test_the_arms_share_every_other_flag(bin_dir, miles_dir):
    shared = {}
    for arm in ARM_FLAGS:
        flags, _, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
        shared[arm] = {
            f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES and f not in NAMED_FLAGS
        }
    assert shared["drop"] == shared["never-drop"] == shared["protect"]


#: The train-side logging contract, in every arm.
LOGGING_FLAGS = {
    "--loss-type": ["custom_loss"],
    "--custom-loss-function-path": ["rescue.miles.loss.policy_loss"],
    "--custom-megatron-before-train-step-hook-path": ["rescue.miles.train_step.before_train_step"],
}
REWARD_HOOK = {"--custom-reward-post-process-path": ["rescue.miles.reward.post_process_rewards"]}
DRGRPO_FLAGS = {
    "--disable-grpo-std-normalization": [],
    "--custom-pg-loss-reducer-function-path": ["rescue.miles.drgrpo.pg_loss_reducer"],
}


@pytest.mark.parametrize("arm", sorted(ARM_FLAGS))
def test_by_default_every_arm_logs_the_contract_with_the_group_estimator(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir).stdout)
    assert {f: flags.get(f) for f in LOGGING_FLAGS} == LOGGING_FLAGS
    assert env["RESCUE_ESTIMATOR"] == "group" and "RESCUE_DRGRPO_DIVISOR" not in env
    assert not set(DRGRPO_FLAGS) & set(flags)
    assert ("--custom-reward-post-process-path" in flags) == (arm == "protect")


def test_estimator_turn_and_drgrpo_are_applied_identically_to_every_arm(bin_dir, miles_dir):
    settings = {"ESTIMATOR": "turn", "DRGRPO": "1", "DRGRPO_DIVISOR": "4096"}
    shared = {}
    for arm in ARM_FLAGS:
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
    assert shared["drop"] == shared["never-drop"] == shared["protect"]


def test_drgrpo_without_a_divisor_leaves_the_reducers_default(bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run("drop", bin_dir, miles_dir, DRGRPO="1").stdout)
    assert {f: flags.get(f) for f in DRGRPO_FLAGS} == DRGRPO_FLAGS
    assert "RESCUE_DRGRPO_DIVISOR" not in env and env["RESCUE_ESTIMATOR"] == "group"


def test_shared_settings_of_the_swe_arms(bin_dir, miles_dir):
    flags, env, job = submitted(dry_run("protect", bin_dir, miles_dir).stdout)
    expected = {
        "--fully-async": [],
        "--use-tis": [],
        "--custom-generate-function-path": [
            "miles.rollout.generate_hub.agentic_tool_call.generate"
        ],
        "--custom-agent-function-path": ["swe_smith_tasks.agent.run"],
        "--custom-rm-path": ["swe_smith_tasks.agent.reward_func"],
        "--custom-rollout-log-function-path": ["rescue.miles.log.log_rollout"],
        "--use-session-server": [],
        "--n-samples-per-prompt": ["8"],
        "--rollout-batch-size": ["16"],
        "--global-batch-size": ["128"],
        "--max-seq-len": ["65536"],
        "--rollout-max-context-len": ["65536"],
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
    assert env["RESCUE_SWE_STEP_LIMIT"] == "40"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "128"
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
    assert "ray must not run" not in result.stderr
    assert "no GPUs visible" in result.stderr  # a warning only, in a dry run


def test_other_nodes_join_the_head_and_submit_nothing(bin_dir, miles_dir):
    result = dry_run("drop", bin_dir, miles_dir, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1")
    lines = command_lines(result.stdout)
    assert not [w for w in lines if w[:2] == ["ray", "job"]]
    (start,) = [w for w in lines if w[:2] == ["ray", "start"]]
    assert flag_dict(start[2:])["--address"] == ["10.0.0.1:6379"]


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
    ({"MAX_RESPONSE_LEN": "4096"}, "--rollout-max-response-len", ["4096"]),
    ({"WANDB_PROJECT": "p"}, "--wandb-project", ["p"]),
    ({"WANDB_MODE": "offline"}, "--wandb-mode", ["offline"]),
    ({"RUN_NAME": "r"}, "--wandb-group", ["r"]),
    ({"PROMPT_DATA": "/d.jsonl"}, "--prompt-data", ["/d.jsonl"]),
    ({"HF_CHECKPOINT": "/m"}, "--hf-checkpoint", ["/m"]),
    ({"TP": "4"}, "--tensor-model-parallel-size", ["4"]),
    ({"LR": "2e-6"}, "--lr", ["2e-6"]),
    ({"TITO_MODEL": "default"}, "--tito-model", ["default"]),
    ({"MODEL_ARGS": "--num-layers 2"}, "--num-layers", ["2"]),
    ({"EXTRA_ARGS": "--foo 1 --bar"}, "--foo", ["1"]),
    ({"DUMP_STEPS": "0"}, "--save-debug-rollout-data", None),
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
            AGENT_ENV="RESCUE_SWE_TRIAL_TIMEOUT=100 RESCUE_SWE_DOCKER_RUN_ARGS=--cpus=2",
        ).stdout
    )
    assert env["RESCUE_SWE_STEP_LIMIT"] == "12"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "9"
    assert env["RESCUE_SWE_TRIAL_TIMEOUT"] == "100"
    assert env["RESCUE_SWE_DOCKER_RUN_ARGS"] == "--cpus=2"


@pytest.mark.parametrize("arm", ["drop", "never-drop"])
def test_census_buffer_runs_drop_and_never_drop_through_rescues_buffer(arm, bin_dir, miles_dir):
    flags, env, _ = submitted(dry_run(arm, bin_dir, miles_dir, CENSUS_BUFFER="1").stdout)
    own = {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES}
    assert own == {
        "--max-weight-staleness": ["2"],
        "--custom-async-data-buffer-path": ["rescue.miles.buffer.RescueDataBuffer"],
    }
    assert env["RESCUE_ARM"] == arm and "RESCUE_A" not in env


def test_the_arm_entries_set_their_arm(bin_dir, miles_dir):
    for script, arm in [("drop.sh", "drop"), ("never_drop.sh", "never-drop")]:
        result = launch(script, bin_dir, miles_dir, DRY_RUN="1", ARM="protect")
        assert result.returncode == 0, result.stderr
        assert submitted(result.stdout)[1]["RESCUE_ARM"] == arm
    result = launch("protect.sh", bin_dir, miles_dir, DRY_RUN="1", A="1")
    assert submitted(result.stdout)[1]["RESCUE_A"] == "1"


# ── invalid input: one documented line, nothing run ──────────────────────────────────────

INVALID = [
    ({"ARM": "mask"}, "ARM='mask' is not an arm: set ARM=drop, ARM=never-drop or ARM=protect"),
    ({}, "ARM is not set: set ARM=drop, ARM=never-drop or ARM=protect"),
    ({"ARM": "protect"}, "ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5"),
    ({"ARM": "protect", "A": "0"}, "A='0' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "1.5"}, "A='1.5' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "-0.5"}, "A='-0.5' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "protect", "A": "half"}, "A='half' is outside (0, 1]: set A with 0 < A <= 1"),
    ({"ARM": "drop", "A": "0.5"}, "A=0.5 applies only to ARM=protect: unset A or set ARM=protect"),
    (
        {"ARM": "never-drop", "STALENESS": "2"},
        "STALENESS applies only to ARM=drop and ARM=protect (or CENSUS_BUFFER=1): unset STALENESS",
    ),
    (
        {"ARM": "drop", "STALENESS": "-1"},
        "STALENESS='-1' is not a non-negative integer: set STALENESS=K",
    ),
    ({"ARM": "drop", "SEED": "x"}, "SEED='x' is not an integer: set SEED to an integer"),
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
]


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 2
    assert result.stderr == f"swe-arm: error: {message}\n"
    assert result.stdout == ""


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
    gpus = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(8))
    _executable(bin_dir / "nvidia-smi", "#!/bin/sh\n" + gpus)
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
    assert (
        first
        == "swe-arm: error: ARM='bogus' is not an arm: set ARM=drop, ARM=never-drop or ARM=protect"
    )


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


# ── the other launchers ──────────────────────────────────────────────────────────────────


def test_prepare_writes_all_tasks_then_the_pilot_subset(bin_dir, tmp_path):
    result = launch("swe_prepare.sh", bin_dir, None, DRY_RUN="1", OUTPUT_DIR=str(tmp_path))
    (only,) = [w for w in command_lines(result.stdout) if "rescue" in w]
    assert "--subset" not in only and only[-1] == f"{tmp_path}/data/swe_smith_tasks.jsonl"
    assert "make pilot" in result.stdout
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "subset.txt").write_text("task-1\n")
    result = launch("swe_prepare.sh", bin_dir, None, DRY_RUN="1", OUTPUT_DIR=str(tmp_path))
    _, second = [w for w in command_lines(result.stdout) if "rescue" in w]
    i = second.index("prepare")
    assert flag_dict(second[i + 1 :])["--subset"] == [f"{tmp_path}/pilot/subset.txt"]
    assert flag_dict(second[i + 1 :])["--out"] == [f"{tmp_path}/data/swe_smith_pilot.jsonl"]


def test_pilot_uses_the_training_settings(bin_dir, tmp_path):
    result = launch(
        "pilot.sh", bin_dir, None, DRY_RUN="1", PILOT_BASE_URL="http://h:1", PILOT_TASKS="50"
    )
    assert result.returncode == 0, result.stderr
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    flags = flag_dict(cmd[cmd.index("pilot") + 1 :])
    assert flags["--base-url"] == ["http://h:1"]
    assert flags["--n"] == ["8"] and flags["--max-tasks"] == ["50"]
    assert flags["--low"] == ["0.2"] and flags["--high"] == ["0.5"]
    assert flags["--temperature"] == ["1.0"] and flags["--max-tokens"] == ["8192"]


def test_pilot_agent_gets_the_training_agent_settings(bin_dir):
    result = launch(
        "pilot.sh",
        bin_dir,
        None,
        DRY_RUN="1",
        PILOT_BASE_URL="http://h:1",
        MAX_TURNS="12",
        AGENT_ENV="RESCUE_SWE_TRIAL_TIMEOUT=100 RESCUE_SWE_DOCKER_RUN_ARGS=--cpus=2",
    )
    assert result.returncode == 0, result.stderr
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    assert cmd[0] == "env"
    env = dict(w.split("=", 1) for w in cmd[1 : cmd.index("-m") - 1])
    assert env["RESCUE_SWE_STEP_LIMIT"] == "12"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "64"
    assert env["RESCUE_SWE_TRIAL_TIMEOUT"] == "100"
    assert env["RESCUE_SWE_DOCKER_RUN_ARGS"] == "--cpus=2"
    bad = launch("pilot.sh", bin_dir, None, DRY_RUN="1", PILOT_BASE_URL="u", AGENT_ENV="oops")
    assert bad.returncode == 2 and "AGENT_ENV entry 'oops' is not NAME=VALUE" in bad.stderr


def test_pilot_without_endpoint_serves_the_checkpoint(bin_dir):
    result = launch("pilot.sh", bin_dir, None, DRY_RUN="1")
    (server,) = [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
    flags = flag_dict(server[server.index("sglang.launch_server") + 1 :])
    assert flags["--model-path"] == ["/root/models/Qwen3-8B"]
    assert flags["--context-length"] == ["65536"]


def test_dump_window_keeps_the_first_steps(tmp_path):
    dumps = tmp_path / "dumps"
    (dumps / "rollout_data").mkdir(parents=True)
    (dumps / "dashboard_columns").mkdir()
    for i in (0, 7, 49, 50, 120):
        (dumps / "rollout_data" / f"{i}.pt").write_text("")
        (dumps / "dashboard_columns" / f"rollout_{i}.parquet").write_text("")
    subprocess.run(
        [
            "bash",
            "-c",
            f"source {LAUNCH}/config.sh && source {LAUNCH}/common.sh && rescue_prune_dumps",
        ],
        env={**os.environ, "DUMP_DIR": str(dumps), "DUMP_STEPS": "50"},
        check=True,
    )
    assert sorted(p.name for p in (dumps / "rollout_data").iterdir()) == ["0.pt", "49.pt", "7.pt"]
    assert len(list((dumps / "dashboard_columns").iterdir())) == 3


def test_preflight_reports_each_check_and_the_pulls_needed(bin_dir, miles_dir, tmp_path):
    gpus = "".join(f"echo 'GPU {i}: NVIDIA H100'\n" for i in range(8))
    _executable(bin_dir / "nvidia-smi", "#!/bin/sh\n" + gpus)
    _executable(
        bin_dir / "docker",
        '#!/bin/sh\ncase "$1 $2" in\n'
        '  "info --format") echo 27.0.1 ;;\n'
        '  "image inspect") [ "$3" = swebench/present:latest ] ;;\n'
        "  *) exit 1 ;;\nesac\n",
    )
    data = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "p", "metadata": {"image": "swebench/present:latest"}},
        {"prompt": "q", "metadata": {"image": "swebench/missing:latest"}},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"max_position_embeddings": 40960}))
    result = launch(
        "preflight.sh",
        bin_dir,
        miles_dir,
        PROMPT_DATA=str(data),
        HF_CHECKPOINT=str(hf),
        OUTPUT_DIR=str(tmp_path / "out"),
        WANDB_MODE="offline",
        DUMP_MB_PER_STEP="1",
    )
    status = {
        line.split()[1]: line.split()[0] for line in result.stdout.splitlines() if line[:1] != " "
    }
    assert status["gpus"] == status["docker"] == status["data"] == "ok"
    assert status["wandb"] == status["disk"] == "ok"
    assert status["images"] == "FAIL"
    assert status["context"] == "FAIL"  # 40960 positions < MAX_SEQ_LEN 65536
    assert "imports" in status  # reported; its result depends on what JOB_PYTHON has
    assert (tmp_path / "out" / "pulls-needed.txt").read_text() == (
        "docker pull swebench/missing:latest\n"
    )
    assert result.returncode == 1


def test_preflight_accepts_a_yarn_extended_checkpoint(bin_dir, miles_dir, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    config = {
        "max_position_embeddings": 40960,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    }
    (hf / "config.json").write_text(json.dumps(config))
    result = launch("preflight.sh", bin_dir, miles_dir, HF_CHECKPOINT=str(hf))
    (line,) = [x for x in result.stdout.splitlines() if x.split()[1:2] == ["context"]]
    assert line.startswith("ok") and "131072 positions" in line


# ── documentation and lint ───────────────────────────────────────────────────────────────


def test_every_setting_is_documented_with_its_default_in_config():
    text = (LAUNCH / "config.sh").read_text()
    header = text[: text.index("LAUNCH_DIR=")]
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-", text, flags=re.M)
    assert len(names) > 40
    undocumented = [n for n in names if not re.search(rf"\b{n}\b", header)]
    assert undocumented == []


def test_make_lint_runs_shellcheck_on_the_launchers():
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile[makefile.index("\nlint:") : makefile.index("\nbench:")]
    assert "shellcheck launch/*.sh" in lint


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_launchers_are_shellcheck_clean():
    scripts = sorted(str(p) for p in LAUNCH.glob("*.sh"))
    result = subprocess.run(
        ["shellcheck", *scripts], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout


# ── against the real Miles sources (read, never imported) ────────────────────────────────


@pytest.fixture
def miles_src() -> Path:
    src = os.environ.get("MILES_SRC")
    if not src:
        pytest.skip("checks the flags against real Miles sources: set MILES_SRC=/path/to/miles")
    return Path(src)


def test_every_flag_is_one_miles_reads(miles_src, bin_dir):
    """Each flag is defined in Miles, or passed verbatim by Miles' own launchers (the
    Megatron and SGLang flags, which Miles forwards to those parsers)."""
    flags, _, _ = submitted(
        dry_run("protect", bin_dir, miles_src, ESTIMATOR="turn", DRGRPO="1").stdout
    )
    defined = set()
    for path in (miles_src / "miles").rglob("*.py"):
        defined.update(re.findall(r"""["'](--[a-z0-9][a-z0-9-]*)["']""", path.read_text()))
    launched = set()
    for folder in ("examples", "scripts"):
        for path in (miles_src / folder).rglob("*.py"):
            launched.update(re.findall(r"(--[a-z0-9][a-z0-9-]*)[ '\"]", path.read_text()))
    unknown = sorted(f for f in flags if f not in defined and f not in launched)
    assert unknown == []


def test_the_generate_function_and_model_script_exist_in_miles(miles_src, bin_dir):
    flags, _, _ = submitted(dry_run("drop", bin_dir, miles_src).stdout)
    (generate,) = flags["--custom-generate-function-path"]
    module, name = generate.rsplit(".", 1)
    source = (miles_src / (module.replace(".", "/") + ".py")).read_text()
    assert f"async def {name}(" in source
    assert flags["--num-layers"] == ["36"] and flags["--hidden-size"] == ["4096"]  # Qwen3-8B
