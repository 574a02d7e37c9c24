"""The text-game launchers: each arm's own flags, dry runs that differ only by them, the
recipe's settings, the prepare commands, the checks, and Miles' own parser on every arm."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from budget_arms import BUDGET_ARMS, budget_env, budget_flags
from launch_env import LAUNCH, ROOT, command_lines, flag_dict, launch, submitted
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture

ARMS = BUDGET_ARMS
#: The flags that distinguish the arms (launch/budget.sh); every other flag is shared.
ARM_FLAGS = {arm: budget_flags(arm) for arm in ARMS}
ARM_FLAG_NAMES = {flag for flags in ARM_FLAGS.values() for flag in flags}
ARM_ENV = {arm: budget_env(arm) for arm in ARMS}
NAMED_FLAGS = {"--load", "--save", "--wandb-group", "--wandb-dir", "--save-debug-rollout-data"}
NAMED_ENV = {"WANDB_TAGS"}


@pytest.fixture
def agent_miles(miles_dir: Path) -> Path:
    """The stand-in Miles checkout with the recipe's model script (Miles' arguments of it)."""
    (miles_dir / "scripts" / "models" / "qwen2.5-1.5B.py").write_text(
        'def model_args():\n    return "--num-layers 28 --hidden-size 1536 --vocab-size 151936"\n'
    )
    return miles_dir


def arm_run(arm: str, bin_dir: Path, miles_dir: Path, env: str = "alfworld", **more: str):
    result = launch("agent_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ENV=env, ARM=arm, **more)
    assert result.returncode == 0, result.stderr
    return submitted(result.stdout, "train.py")


@pytest.mark.parametrize("env", ["alfworld", "cooking"])
@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_submits_exactly_its_own_flags_and_settings(arm, env, bin_dir, agent_miles):
    flags, renv, _ = arm_run(arm, bin_dir, agent_miles, env)
    assert {f: v for f, v in flags.items() if f in ARM_FLAG_NAMES} == ARM_FLAGS[arm]
    assert {k: renv[k] for k in ARM_ENV[arm]} == ARM_ENV[arm]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("env", ["alfworld", "cooking"])
def test_make_agent_arm_dry_runs_differ_only_by_the_arms_own_settings(env, agent_miles):
    shared, shared_env = {}, {}
    for arm in ARMS:
        result = subprocess.run(
            ["make", "-s", "--no-print-directory", "agent-arm", f"ENV={env}", f"ARM={arm}"],
            cwd=ROOT,
            env={**os.environ, "DRY_RUN": "1", "MILES_DIR": str(agent_miles), "JOB_PYTHON": sys.executable,
                 "RESCUE_PY": sys.executable, "SUBMISSION_ID": "fixed", "OUTPUT_DIR": "/runs"},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        flags, renv, _ = submitted(result.stdout, "train.py")
        shared[arm] = {f: v for f, v in flags.items() if f not in ARM_FLAG_NAMES | NAMED_FLAGS}
        shared_env[arm] = {k: v for k, v in renv.items() if k not in set(ARM_ENV[arm]) | NAMED_ENV}
        assert flags["--wandb-group"] == [
            f"agent-{env}-{arm}-cap{50 if env == 'alfworld' else 15}-seed1"
        ]
    for arm in ARMS[1:]:
        assert shared[arm] == shared["zero"], arm
        assert shared_env[arm] == shared_env["zero"], arm


RECIPE = {
    "--custom-generate-function-path": ["rescue.miles.textgame.generate"],
    "--dynamic-sampling-filter-path": ["rescue.miles.textgame.drop_no_result"],
    "--custom-reward-post-process-path": ["rescue.miles.reward.post_process_rewards"],
    "--custom-rollout-log-function-path": ["rescue.miles.log.log_rollout"],
    "--hf-checkpoint": ["/root/models/Qwen2.5-1.5B-Instruct"],
    "--num-layers": ["28"],
    "--hidden-size": ["1536"],
    "--n-samples-per-prompt": ["8"],
    "--rollout-batch-size": ["16"],
    "--global-batch-size": ["128"],
    "--num-rollout": ["150"],
    "--actor-num-gpus-per-node": ["2"],
    "--colocate": [],
    "--lr": ["1e-6"],
    "--agent-history": ["2"],
    "--rollout-max-response-len": ["512"],
    "--rollout-max-context-len": ["2560"],
    "--use-kl-loss": [],
    "--kl-loss-type": ["low_var_kl"],
    "--kl-loss-coef": ["0.01"],
    "--advantage-estimator": ["grpo"],
    "--metadata-key": ["metadata"],
}


@pytest.mark.parametrize(("env", "cap"), [("alfworld", "50"), ("cooking", "15")])
def test_every_arm_runs_the_recipe_with_its_environments_cap(env, cap, bin_dir, agent_miles):
    flags, renv, job = arm_run("mask", bin_dir, agent_miles, env, SEED="2")
    assert {f: flags.get(f) for f in RECIPE} == RECIPE
    assert flags["--agent-cap"] == [cap]
    assert renv["RESCUE_TRUNCATED_REWARD"] == "zero"
    assert renv["WANDB_TAGS"] == f"env:{env},arm:mask,seed:2,cap:{cap}"
    assert flags["--prompt-data"] == [f"/runs/data/agent-{env}.jsonl"]
    assert ("ALFWORLD_DATA" in renv) is (env == "alfworld")
    assert job[1].endswith("/train.py") and "--apply-chat-template" not in flags
    assert "--rm-type" not in flags and "--fully-async" not in flags


OVERRIDES = [
    ({"CAP": "30"}, "--agent-cap", ["30"]),
    ({"HISTORY": "0"}, "--agent-history", ["0"]),
    ({"STEP_TOKENS": "256"}, "--rollout-max-response-len", ["256"]),
    ({"CONTEXT_LEN": "4096"}, "--rollout-max-context-len", ["4096"]),
    ({"KL_COEF": "0.02"}, "--kl-loss-coef", ["0.02"]),
    ({"KL_COEF": "0"}, "--use-kl-loss", None),
    ({"SEED": "3"}, "--rollout-seed", ["3"]),
    ({"GPUS_PER_RUN": "1"}, "--actor-num-gpus-per-node", ["1"]),
    ({"ROLLOUT_BATCH_SIZE": "4"}, "--global-batch-size", ["32"]),
    ({"N_SAMPLES": "4"}, "--n-samples-per-prompt", ["4"]),
    ({"NUM_ROLLOUT": "7"}, "--num-rollout", ["7"]),
    ({"LR": "2e-6"}, "--lr", ["2e-6"]),
    ({"PROMPT_DATA": "/d.jsonl"}, "--prompt-data", ["/d.jsonl"]),
    ({"MODEL_TYPE": "qwen3-1.7B"}, "--hidden-size", ["2048"]),
    ({"HF_CHECKPOINT": "/m"}, "--hf-checkpoint", ["/m"]),
    ({"WANDB_PROJECT": "p"}, "--wandb-project", ["p"]),
    ({"DUMP_STEPS": "0"}, "--save-debug-rollout-data", None),
    ({"EXTRA_ARGS": "--foo 1"}, "--foo", ["1"]),
]


@pytest.mark.parametrize(("env", "flag", "values"), OVERRIDES, ids=lambda x: str(x))
def test_a_variable_changes_its_flag(env, flag, values, bin_dir, agent_miles):
    flags, _, _ = arm_run("zero", bin_dir, agent_miles, **env)
    assert flags.get(flag) == values


def test_alfworld_data_reaches_the_runs_processes(bin_dir, agent_miles):
    _, renv, _ = arm_run("zero", bin_dir, agent_miles, ALFWORLD_DATA="/data/alf")
    assert renv["ALFWORLD_DATA"] == "/data/alf"


INVALID = [
    ({"ARM": "zero"}, "ENV is not set: set ENV=alfworld or ENV=cooking"),
    ({"ENV": "webshop", "ARM": "zero"}, "ENV='webshop' is not a text game: set ENV=alfworld or ENV=cooking"),
    ({"ENV": "cooking"}, "ARM is not set: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn"),
    (
        {"ENV": "cooking", "ARM": "protect"},
        "ARM='protect' is not a text-game arm: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn",
    ),
    (
        {"ENV": "cooking", "ARM": "mask", "ESTIMATOR": "turn"},
        "ESTIMATOR=turn: the budget-regime arms set the estimator themselves: use ARM=turn, or unset ESTIMATOR",
    ),
    ({"ENV": "cooking", "ARM": "zero", "CAP": "0"}, "CAP='0' is not a positive integer: set CAP=N, or unset it to read CAP_FILE"),
    ({"ENV": "cooking", "ARM": "zero", "HISTORY": "x"}, "HISTORY='x' is not a non-negative integer: set HISTORY=N"),
    ({"ENV": "cooking", "ARM": "zero", "GAMES": "0"}, "GAMES='0' is not a positive integer: set GAMES=N"),
    (
        {"ENV": "cooking", "ARM": "zero", "STEP_TOKENS": "4096"},
        "STEP_TOKENS=4096 is not below CONTEXT_LEN=2560: no prompt would fit; raise CONTEXT_LEN",
    ),
    (
        {"ENV": "cooking", "ARM": "zero", "CONTEXT_LEN": "9000"},
        "CONTEXT_LEN=9000 is above MAX_TOKENS_PER_GPU=8192: one step would not fit a micro-batch; raise MAX_TOKENS_PER_GPU",
    ),
    ({"ENV": "cooking", "ARM": "zero", "KL_COEF": "-1"}, "KL_COEF='-1' is not a number >= 0: set KL_COEF=0.01, or 0 for no KL loss"),
    ({"ENV": "cooking", "ARM": "zero", "GAME_SEED": "x"}, "GAME_SEED='x' is not an integer: set GAME_SEED to an integer"),
    (
        {"ENV": "cooking", "ARM": "mask", "DRGRPO_DIVISOR": "512"},
        "DRGRPO_DIVISOR applies only to ARM=drgrpo-mask: unset DRGRPO_DIVISOR or set ARM=drgrpo-mask",
    ),
    (
        {"ENV": "cooking", "ARM": "zero", "EXTRA_ARGS": "--partial-rollout"},
        "EXTRA_ARGS has --partial-rollout, an outcome-dependent exclusion no single-turn arm may have: remove it from EXTRA_ARGS",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, agent_miles):
    result = launch("agent_arm.sh", bin_dir, agent_miles, DRY_RUN="1", **env)
    assert result.returncode == 2, result.stdout
    assert result.stderr == f"agent-arm: error: {message}\n" and result.stdout == ""


def test_a_run_without_its_rows_is_refused(bin_dir, agent_miles, tmp_path):
    from launch_env import eight_gpus

    eight_gpus(bin_dir)
    rows = tmp_path / "none.jsonl"
    result = launch(
        "agent_arm.sh", bin_dir, agent_miles, ENV="cooking", ARM="zero", PROMPT_DATA=str(rows)
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"agent-arm: error: no PROMPT_DATA={rows}: run make agent-prepare ENV=cooking first\n"
    )


def test_every_agent_setting_is_documented():
    import re

    text = (LAUNCH / "agent_config.sh").read_text()
    header = text[: text.index("AGENT_CONFIG_DIR=")]
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-", text, flags=re.M)
    assert len(names) > 15
    assert [n for n in names if not re.search(rf"\b{n}\b", header)] == []


# ── agent-prepare ─────────────────────────────────────────────────────────────────────────


def _prepare(bin_dir, miles_dir, **env):
    result = launch("agent_prepare.sh", bin_dir, miles_dir, DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr
    return command_lines(result.stdout)


def test_prepare_cooking_makes_the_graded_set_from_the_seed(bin_dir, agent_miles):
    (words,) = [
        w
        for w in _prepare(bin_dir, agent_miles, ENV="cooking", GAMES="4", GAME_SEED="9")
        if "prepare" in w
    ]
    assert words[words.index("agent") : words.index("prepare") + 1] == ["agent", "prepare"]
    assert flag_dict(words[words.index("prepare") + 1 :]) == {
        "--env": ["cooking"],
        "--games-dir": ["/runs/games/cooking"],
        "--out": ["/runs/data/agent-cooking.jsonl"],
        "--games": ["4"],
        "--seed": ["9"],
        "--cap": ["15"],
    }


def test_prepare_alfworld_downloads_with_alfworlds_own_command_then_writes_rows(
    bin_dir, agent_miles
):
    lines = _prepare(bin_dir, agent_miles, ENV="alfworld", ALFWORLD_DATA="/alf")
    (download,) = [w for w in lines if any(x.endswith("alfworld-download") for x in w)]
    assert download[:2] == ["env", "ALFWORLD_DATA=/alf"] and download[-2:] == ["--data-dir", "/alf"]
    (rows,) = [w for w in lines if "prepare" in w]
    assert "ALFWORLD_DATA=/alf" in rows
    assert flag_dict(rows[rows.index("prepare") + 1 :]) == {
        "--env": ["alfworld"],
        "--data-dir": ["/alf"],
        "--split": ["train"],
        "--out": ["/runs/data/agent-alfworld.jsonl"],
    }
    assert lines.index(download) < lines.index(rows)


# ── against the real Miles sources ───────────────────────────────────────────────────────


@pytest.fixture
def miles_src() -> Path:
    src = os.environ.get("MILES_SRC")
    if not src:
        pytest.skip("checks the flags against real Miles sources: set MILES_SRC=/path/to/miles")
    return Path(src)


@pytest.mark.parametrize("env", ["alfworld", "cooking"])
@pytest.mark.parametrize("arm", ARMS)
def test_every_arms_flags_parse_with_miles_own_parser(arm, env, miles_src, bin_dir):
    from test_rlvr_launch import _check_with_miles_parser

    out = launch("agent_arm.sh", bin_dir, miles_src, DRY_RUN="1", ENV=env, ARM=arm, SEED="2")
    assert out.returncode == 0, out.stderr
    (submit,) = [w for w in command_lines(out.stdout) if w[:3] == ["ray", "job", "submit"]]
    args, leftover = _check_with_miles_parser(submit[submit.index("--") + 3 :], miles_src)
    assert args.custom_generate_function_path == "rescue.miles.textgame.generate"
    assert args.agent_cap == (50 if env == "alfworld" else 15) and args.agent_history == 2
    assert args.dynamic_sampling_filter_path == "rescue.miles.textgame.drop_no_result"
    assert args.colocate is True and args.n_samples_per_prompt == 8
    assert args.rollout_batch_size == 16 and args.num_rollout == 150
    assert args.use_kl_loss is True and args.kl_loss_type == "low_var_kl"
    assert args.over_sampling_batch_size is None and args.partial_rollout is False
    masked = "--rollout-sample-filter-path" in budget_flags(arm)  # the registry's mask column
    assert args.rollout_sample_filter_path == (
        "filters.mask_truncated_zero_reward" if masked else None
    )
    assert args.grpo_std_normalization is (arm != "drgrpo-mask")
    assert {"--num-layers", "--hidden-size"} <= leftover
