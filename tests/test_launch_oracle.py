"""The gradient oracle's launcher (launch/oracle.sh, `make oracle`): its dry-run commands, the
checks, and (with MILES_SRC) its flags and the matched arm's parsed by Miles' own parser."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_env import (
    ROOT,
    SGLANG_SERVER_FLAGS,
    command_lines,
    dry_run,
    flag_dict,
    launch,
    submitted,
)
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture

torch = pytest.importorskip("torch")


@pytest.fixture
def recording(tmp_path: Path) -> dict[str, str]:
    """A checkpoint directory and a dump directory of two steps (rollout_data/*.pt)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dumps = tmp_path / "dumps"
    (dumps / "rollout_data").mkdir(parents=True)
    for rid in (0, 1):
        torch.save({"rollout_id": rid, "samples": []}, dumps / "rollout_data" / f"{rid}.pt")
    return {"CKPT": str(ckpt), "DUMPS": str(dumps)}


def oracle_dry_run(bin_dir, miles_dir, **env):
    """``oracle.sh`` with ``DRY_RUN=1`` against ``miles_dir``: the stand-in checkout, or the
    real Miles sources, which it must leave as they are (their train.py is never written)."""
    result = launch("oracle.sh", bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr
    return result


def replay(stdout: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(train.py flags, runtime env vars) of the one `ray job submit` line."""
    import json

    (words,) = [w for w in command_lines(stdout) if w[:3] == ["ray", "job", "submit"]]
    sep = words.index("--")
    (env_json,) = flag_dict(words[3:sep])["--runtime-env-json"]
    job = words[sep + 1 :]
    assert job[1].endswith("/train.py")
    return flag_dict(job[2:]), json.loads(env_json)["env_vars"]


def rescue_commands(stdout: str) -> list[list[str]]:
    return [w[w.index("rescue") + 1 :] for w in command_lines(stdout) if "rescue" in w]


def test_dry_run_builds_replays_and_compares(bin_dir, miles_dir, recording):
    result = oracle_dry_run(bin_dir, miles_dir, **recording)
    oracle_dir = recording["DUMPS"] + "/oracle"
    build, compare = rescue_commands(result.stdout)
    assert build == [
        "oracle", "build", recording["DUMPS"], "--out", oracle_dir,
        "--arms", "all,drop,stale,protect", "--a", "0.5",
    ]  # fmt: skip
    assert compare == ["oracle", "compare", oracle_dir]
    flags, env = replay(result.stdout)
    assert flags["--load"] == [recording["CKPT"]] and "--ckpt-step" not in flags
    assert flags["--load-debug-rollout-data"] == [oracle_dir + "/rollout_data/{rollout_id}.pt"]
    assert flags["--start-rollout-id"] == ["0"] and flags["--num-rollout"] == ["8"]  # 2 x 4
    assert flags["--debug-disable-optimizer"] == []
    assert flags["--global-batch-size"] == ["128"]  # one step, one gradient, per replayed arm
    assert flags["--custom-megatron-before-train-step-hook-path"] == [
        "rescue.miles.train_step.before_train_step"
    ]
    assert flags["--custom-reward-post-process-path"] == [
        "rescue.miles.reward.post_process_rewards"
    ]
    assert flags["--actor-num-gpus-per-node"] == ["8"]
    assert "--fully-async" not in flags and "--save" not in flags
    assert env["RESCUE_ORACLE_DIR"] == oracle_dir and env["RESCUE_ORACLE_STREAM"] == "0"


@pytest.mark.parametrize("offpolicy", ["tis-sc", "tis"])
def test_the_replay_trains_on_the_arms_loss_flags(bin_dir, miles_dir, recording, offpolicy):
    """The loss, estimator, Dr. GRPO and off-policy flags are those of the training arms
    (one function)."""
    settings = {"ESTIMATOR": "turn", "DRGRPO": "1", "OFFPOLICY": offpolicy}
    flags, env = replay(oracle_dry_run(bin_dir, miles_dir, **recording, **settings).stdout)
    arm, arm_env, _ = submitted(dry_run("never-drop", bin_dir, miles_dir, **settings).stdout)
    for flag in (
        "--advantage-estimator", "--eps-clip", "--eps-clip-high", "--use-tis", "--loss-type",
        "--custom-loss-function-path", "--custom-reward-post-process-path",
        "--disable-grpo-std-normalization", "--custom-pg-loss-reducer-function-path",
        "--tensor-model-parallel-size", "--context-parallel-size", "--max-tokens-per-gpu",
        "--num-layers", "--hf-checkpoint", "--custom-megatron-before-train-step-hook-path",
        "--rollout-temperature",
    ):  # fmt: skip
        assert flags.get(flag) == arm.get(flag), flag
    assert env["RESCUE_ESTIMATOR"] == "turn"
    sc = offpolicy == "tis-sc"
    assert ("--use-tis" in flags) == (not sc)
    # score centering: the replay publishes the heads the dumps kept, with the arms' cap
    assert (
        flags.get("--custom-rollout-log-function-path") == ["rescue.miles.log.log_rollout"]
    ) == sc
    assert (env.get("RESCUE_SC_CAP"), env.get("RESCUE_SC_TOP_K")) == (
        arm_env.get("RESCUE_SC_CAP"), arm_env.get("RESCUE_SC_TOP_K"),
    )  # fmt: skip


OVERRIDES = [
    ({"ORACLE_A": "0.25,0.5"}, "--num-rollout", ["10"]),
    ({"ORACLE_ARMS": "all,drop"}, "--num-rollout", ["4"]),
    ({"ORACLE_ARMS": "all drop"}, "--num-rollout", ["4"]),  # commas or spaces
    ({"ORACLE_A": "0.25 0.5"}, "--num-rollout", ["10"]),
    ({"CKPT_STEP": "40"}, "--ckpt-step", ["40"]),
    ({"ROLLOUT_BATCH_SIZE": "4"}, "--global-batch-size", ["32"]),
    ({"GPUS_PER_NODE": "4"}, "--actor-num-gpus-per-node", ["4"]),
    ({"ORACLE_DIR": "/o"}, "--load-debug-rollout-data", ["/o/rollout_data/{rollout_id}.pt"]),
]


@pytest.mark.parametrize(("env", "flag", "values"), OVERRIDES, ids=lambda x: str(x))
def test_a_variable_changes_its_flag(env, flag, values, bin_dir, miles_dir, recording):
    flags, _ = replay(oracle_dry_run(bin_dir, miles_dir, **recording, **env).stdout)
    assert flags[flag] == values


def test_stream_force_and_the_arms_reach_build_and_replay(bin_dir, miles_dir, recording):
    env = {"ORACLE_STREAM": "1", "ORACLE_FORCE": "1", "ORACLE_ARMS": "all,drop,stale"}
    result = oracle_dry_run(bin_dir, miles_dir, **recording, **env)
    build, _ = rescue_commands(result.stdout)
    assert build[-1] == "--force" and build[build.index("--arms") + 1] == "all,drop,stale"
    assert replay(result.stdout)[1]["RESCUE_ORACLE_STREAM"] == "1"


INVALID = [
    ({"CKPT": ""}, "CKPT is not set: set CKPT to the recording run's Megatron checkpoint directory"),
    ({"DUMPS": ""}, "DUMPS is not set: set DUMPS to the recording run's dump directory"),
    ({"ORACLE_STREAM": "yes"}, "ORACLE_STREAM='yes': set ORACLE_STREAM=0 or ORACLE_STREAM=1"),
    ({"ORACLE_FORCE": "2"}, "ORACLE_FORCE='2': set ORACLE_FORCE=0 or ORACLE_FORCE=1"),
    ({"CKPT_STEP": "last"}, "CKPT_STEP='last' is not a non-negative integer: set CKPT_STEP=N"),
    ({"ORACLE_ARMS": "drop,all"}, "--arms must start with all (the oracle every arm is compared with)"),
    ({"ORACLE_ARMS": "all,mask"}, "--arms: 'mask' is not an arm; allowed: all, drop, stale, protect"),
    ({"ORACLE_A": "half"}, "ORACLE_A='half' is not a comma-separated list of numbers: set ORACLE_A=0.5"),
    ({"ESTIMATOR": "loo"}, "ESTIMATOR='loo' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn"),
    ({"NNODES": "2", "MASTER_ADDR": "10.0.0.1"}, "the oracle replays on one node: set NNODES=1"),
    ({"TP": "3"}, "TP=3 x CP=2 = 6 does not divide GPUS_PER_NODE=8 (the oracle trains on every GPU): set TP, CP or GPUS_PER_NODE"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, miles_dir, recording):
    result = launch("oracle.sh", bin_dir, miles_dir, DRY_RUN="1", **{**recording, **env})
    assert result.returncode == 2
    (line,) = [x for x in result.stderr.splitlines() if not x.startswith("oracle: warning")]
    assert line.startswith("oracle: error: ") and message in line
    assert result.stdout == ""


def test_dumps_without_dump_files_is_an_error(bin_dir, miles_dir, recording, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = launch(
        "oracle.sh", bin_dir, miles_dir, DRY_RUN="1", **{**recording, "DUMPS": str(empty)}
    )
    assert result.returncode == 2
    assert f"{empty}: no dump files (*.pt, or rollout_data/*.pt)" in result.stderr


def test_no_train_py_fails_with_what_to_set(bin_dir, miles_dir, recording):
    (miles_dir / "train.py").unlink()
    result = launch("oracle.sh", bin_dir, miles_dir, DRY_RUN="1", **recording)
    assert result.returncode == 2
    assert "(train.py missing): set MILES_DIR to a Miles checkout with train.py" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_oracle_dry_run_passes_the_variables(miles_dir, recording):
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "oracle", f"CKPT={recording['CKPT']}",
         f"DUMPS={recording['DUMPS']}", "ORACLE_A=0.1"],
        cwd=ROOT,
        env={**os.environ, "DRY_RUN": "1", "MILES_DIR": str(miles_dir),
             "JOB_PYTHON": sys.executable, "RESCUE_PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    flags, _ = replay(result.stdout)
    assert flags["--load"] == [recording["CKPT"]] and flags["--num-rollout"] == ["8"]
    assert rescue_commands(result.stdout)[0][-1] == "0.1"


# ── against the real Miles sources ───────────────────────────────────────────────────────


@pytest.fixture
def miles_parser():
    from miles_env import miles_argument_parser

    return miles_argument_parser()


def test_miles_parses_the_replay_and_rescue_accepts_it(
    miles_parser,
    bin_dir,
    recording,
):
    from miles_env import MILES_SRC

    from rescue.miles.loss import check_loss_flags

    flags, _ = replay(oracle_dry_run(bin_dir, Path(MILES_SRC), **recording).stdout)
    words = [w for f, v in flags.items() for w in (f, *v)]
    args, rest = miles_parser.parse_known_args(words)
    assert args.debug_disable_optimizer is True
    assert (
        args.load_debug_rollout_data == recording["DUMPS"] + "/oracle/rollout_data/{rollout_id}.pt"
    )
    assert args.num_rollout == 8 and args.start_rollout_id == 0
    assert args.global_batch_size == args.rollout_batch_size * args.n_samples_per_prompt
    check_loss_flags(args)  # rescue's loss accepts the replay's hook
    megatron_flags(rest)


def test_miles_parses_the_matched_arm_and_rescue_accepts_it(miles_parser, bin_dir):
    from miles_env import MILES_SRC

    from rescue.miles.loss import check_loss_flags
    from rescue.miles.matched import check_matched_flags, matched_enabled

    flags, _, _ = submitted(dry_run("matched", bin_dir, Path(MILES_SRC)).stdout)
    words = [w for f, v in flags.items() for w in (f, *v)]
    args, rest = miles_parser.parse_known_args(words)
    assert matched_enabled(args)
    assert args.rollout_sample_filter_path == "filters.mask_truncated_zero_reward"
    check_matched_flags(args)
    check_loss_flags(args)
    assert args.global_batch_size == args.rollout_batch_size * args.n_samples_per_prompt
    megatron_flags(rest)


def megatron_flags(rest: list[str]) -> None:
    """What Miles' own parser leaves is Megatron's or SGLang's: flags Miles' launchers pass."""
    import re

    from miles_env import MILES_SRC

    launched = set()
    for folder in ("examples", "scripts", "miles"):
        for path in (Path(MILES_SRC) / folder).rglob("*.py"):
            launched.update(re.findall(r"""(--[a-z0-9][a-z0-9-]*)[ '"]""", path.read_text()))
    unknown = sorted(
        w for w in rest if w.startswith("--") and w not in launched | SGLANG_SERVER_FLAGS
    )
    assert unknown == []
