"""`make slime-arm`: the dry-run command of each arm on slime, its settings and checks, and
(with ``SLIME_SRC``) every flag parsed by slime's own argument parser and accepted by
rescue's checks at start.

The launcher runs with ``DRY_RUN=1`` against a stand-in slime checkout and stand-in node
commands (``launch_env``); the printed ``ray job submit`` line is parsed into
``{flag: [values]}``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_env import LAUNCH, ROOT, launch, submitted
from launch_env import bin_dir as bin_dir  # a fixture

ARMS = ("drop", "never-drop", "protect", "pace")
SLIME_ARMS = "drop, never-drop, protect or pace"
#: The flags that distinguish the arms; every other flag is shared.
ARM_FLAGS = {
    "drop": {},
    "never-drop": {},
    "protect": {"--custom-reward-post-process-path": ["rescue.reward.post_process_rewards"]},
    "pace": {},
}
ARM_ENV = {
    "drop": {"RESCUE_ARM": "drop"},
    "never-drop": {"RESCUE_ARM": "never-drop"},
    "protect": {"RESCUE_ARM": "protect", "RESCUE_A": "0.5", "RESCUE_BASELINE": "all"},
    "pace": {"RESCUE_ARM": "pace"},
}
NAMED_FLAGS = {"--load", "--save", "--wandb-group", "--wandb-dir", "--save-debug-rollout-data"}
MODEL_SCRIPT = """MODEL_ARGS=(
   --swiglu
   --num-layers 36
   --normalization "RMSNorm"
   --rotary-base "${MODEL_ARGS_ROTARY_BASE:-1000000}"
)
"""


@pytest.fixture
def slime_dir(tmp_path: Path) -> Path:
    """A stand-in slime checkout: train_async.py and slime's Qwen3-8B model script (a bash
    array, as slime's scripts/models/*.sh are)."""
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "train_async.py").write_text("")
    (slime / "scripts" / "models" / "qwen3-8B.sh").write_text(MODEL_SCRIPT)
    return slime


def slime_run(bin_dir: Path, slime_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return launch("slime_arm.sh", bin_dir, None, SLIME_DIR=str(slime_dir), **env)


def dry_run(arm: str, bin_dir: Path, slime_dir: Path, **env: str):
    extra = {"A": "0.5"} if arm == "protect" else {}
    result = slime_run(bin_dir, slime_dir, ARM=arm, DRY_RUN="1", **{**extra, **env})
    assert result.returncode == 0, result.stderr
    return result


# ── each arm has exactly its own settings ───────────────────────────────────────────────


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_submits_exactly_its_own_flags_and_settings(arm, bin_dir, slime_dir):
    flags, env, job = submitted(dry_run(arm, bin_dir, slime_dir).stdout)
    assert job[1] == f"{slime_dir}/train_async.py"
    base_flags, base_env, _ = submitted(dry_run("never-drop", bin_dir, slime_dir).stdout)
    own = {k: v for k, v in flags.items() if k not in base_flags}
    assert own == ARM_FLAGS[arm]
    shared = {k for k in flags if k in base_flags and k not in NAMED_FLAGS}
    assert all(flags[k] == base_flags[k] for k in shared)
    own_env = {k: v for k, v in env.items() if base_env.get(k) != v and k != "WANDB_TAGS"}
    assert own_env == {k: v for k, v in ARM_ENV[arm].items() if arm != "never-drop"}
    assert env["RESCUE_ARM"] == arm and env["RESCUE_MAX_STALENESS"] == "2"
    assert flags["--rollout-function-path"] == ["rescue.slime.rollout.generate_rollout"]
    assert flags["--custom-generate-function-path"] == ["rescue.slime.generate.generate"]
    assert env["RESCUE_GENERATE_FUNCTION"] == "slime.rollout.sglang_rollout.generate"
    assert env["RESCUE_ESTIMATOR"] == "group" and "--custom-advantage-function-path" not in flags
    assert env["PYTHONPATH"].split(":")[:2] == [str(ROOT), str(slime_dir)]
    assert "framework:slime" in env["WANDB_TAGS"].split(",")
    assert "--fully-async" not in flags  # a Miles flag


def test_the_turn_estimator_adds_the_hooks_and_its_names(bin_dir, slime_dir):
    for arm in ARMS:
        flags, env, _ = submitted(dry_run(arm, bin_dir, slime_dir, ESTIMATOR="turn").stdout)
        assert flags["--custom-reward-post-process-path"] == ["rescue.reward.post_process_rewards"]
        assert flags["--custom-advantage-function-path"] == [
            "rescue.slime.advantages.turn_advantages"
        ]
        assert env["RESCUE_ESTIMATOR"] == "turn"
        assert "-est-turn-" in flags["--wandb-group"][0]
        assert "estimator:turn" in env["WANDB_TAGS"]


def test_names_and_the_model_script(bin_dir, slime_dir):
    flags, env, _ = submitted(dry_run("protect", bin_dir, slime_dir, SEED="3").stdout)
    assert env["WANDB_TAGS"] == "arm:protect,seed:3,a:0.5,k:2,framework:slime"
    assert flags["--wandb-group"] == ["slime-protect-a0.5-k2-seed3"]
    assert flags["--save"] == ["/runs/slime-protect-a0.5-k2-seed3/checkpoints"]
    assert flags["--wandb-project"] == ["rescue-slime"]
    # slime's bash model script, its array read word by word
    assert flags["--num-layers"] == ["36"] and flags["--normalization"] == ["RMSNorm"]
    assert flags["--rotary-base"] == ["1000000"] and flags["--swiglu"] == []
    flags, _, _ = submitted(
        dry_run("drop", bin_dir, slime_dir, MODEL_ARGS="--num-layers 2 --hidden-size 8").stdout
    )
    assert flags["--num-layers"] == ["2"] and "--swiglu" not in flags


@pytest.mark.parametrize(
    ("env", "flag", "values"),
    [
        ({}, "--rm-type", ["math"]),
        ({"RM_TYPE": "deepscaler"}, "--rm-type", ["deepscaler"]),
        ({"RM_TYPE": ""}, "--rm-type", None),
        ({"CUSTOM_RM_PATH": "my.rm"}, "--custom-rm-path", ["my.rm"]),
        ({}, "--custom-rm-path", None),
        ({"LABEL_KEY": "answer"}, "--label-key", ["answer"]),
        ({}, "--apply-chat-template", []),
        ({"APPLY_CHAT_TEMPLATE": "0"}, "--apply-chat-template", None),
        ({"PROMPT_DATA": "/d/p.jsonl"}, "--prompt-data", ["/d/p.jsonl"]),
        ({}, "--prompt-data", ["/runs/data/slime_prompts.jsonl"]),
        ({"STALENESS": "5"}, "--rollout-max-context-len", ["40960"]),
        ({"DUMP_STEPS": "0"}, "--save-debug-rollout-data", None),
    ],
)
def test_a_setting_changes_its_flag(env, flag, values, bin_dir, slime_dir):
    flags, _, _ = submitted(dry_run("drop", bin_dir, slime_dir, **env).stdout)
    assert flags.get(flag) == values


def test_settings_reach_the_runtime_environment(bin_dir, slime_dir):
    _, env, _ = submitted(
        dry_run(
            "pace",
            bin_dir,
            slime_dir,
            STALENESS="3",
            PACE_WINDOW="40",
            SLIME_GENERATE="examples.coding_agent_rl.generate.generate",
            SLIME_ENV="SWE_AGENT=codex ADAPTER_PUBLIC_HOST=10.0.0.1",
        ).stdout
    )
    assert env["RESCUE_MAX_STALENESS"] == "3" and env["RESCUE_PACE_WINDOW"] == "40"
    assert env["RESCUE_GENERATE_FUNCTION"] == "examples.coding_agent_rl.generate.generate"
    assert env["SWE_AGENT"] == "codex" and env["ADAPTER_PUBLIC_HOST"] == "10.0.0.1"


# ── invalid input: one line, nothing run ───────────────────────────────────────────────

INVALID = [
    ({"ARM": "bogus"}, f"ARM='bogus' is not a slime arm: set ARM to {SLIME_ARMS}"),
    ({}, f"ARM is not set: set ARM to {SLIME_ARMS}"),
    (
        {"ARM": "mask"},
        "ARM=mask is a budget-regime arm, which runs on Miles (make swe-arm or make rlvr-arm): "
        f"on slime set ARM to {SLIME_ARMS}",
    ),
    (
        {"ARM": "drop", "DRGRPO": "1"},
        "DRGRPO=1 runs on Miles only (rescue.miles.drgrpo is Miles' reducer): unset DRGRPO",
    ),
    (
        {"ARM": "pace", "PACE_STRAGGLER_S": "600"},
        "PACE_STRAGGLER_S=600 runs on Miles only (slime's drain never abandons a group in "
        "flight): unset PACE_STRAGGLER_S",
    ),
    ({"ARM": "protect"}, "ARM=protect needs A: set A with 0 < A <= 1, e.g. A=0.5"),
    ({"ARM": "drop", "A": "0.5"}, "A=0.5 applies only to ARM=protect: unset A or set ARM=protect"),
    (
        {"ARM": "pace", "PACE_WINDOW": "49"},
        "PACE_WINDOW=49 is outside ROLLOUT_BATCH_SIZE..(STALENESS + 1) * ROLLOUT_BATCH_SIZE = "
        "16..48: set PACE_WINDOW in that range or leave it empty",
    ),
    (
        {"ARM": "drop", "ESTIMATOR": "loo"},
        "ESTIMATOR='loo' is not an estimator: set ESTIMATOR=group or ESTIMATOR=turn",
    ),
    (
        {"ARM": "drop", "STALENESS": "x"},
        "STALENESS='x' is not a non-negative integer: set STALENESS=N",
    ),
    (
        {"ARM": "drop", "APPLY_CHAT_TEMPLATE": "yes"},
        "APPLY_CHAT_TEMPLATE='yes': set APPLY_CHAT_TEMPLATE=0 or APPLY_CHAT_TEMPLATE=1",
    ),
    (
        {"ARM": "drop", "SLIME_ENV": "SWE_AGENT"},
        "SLIME_ENV entry 'SWE_AGENT' is not NAME=VALUE: set SLIME_ENV='NAME=VALUE ...'",
    ),
]


@pytest.mark.parametrize(("env", "message"), INVALID, ids=lambda x: str(x))
def test_invalid_input_fails_with_its_message(env, message, bin_dir, slime_dir):
    result = slime_run(bin_dir, slime_dir, DRY_RUN="1", **env)
    assert result.returncode == 2
    assert result.stderr == f"slime-arm: error: {message}\n"
    assert result.stdout == ""


def test_no_slime_checkout_or_model_script_fails_with_what_to_set(bin_dir, tmp_path, slime_dir):
    result = slime_run(bin_dir, tmp_path, ARM="drop", DRY_RUN="1")
    assert result.returncode == 2
    assert result.stderr == (
        f"slime-arm: error: no slime checkout at SLIME_DIR={tmp_path} (train_async.py missing): "
        "set SLIME_DIR to a slime checkout with train_async.py\n"
    )
    result = slime_run(bin_dir, slime_dir, ARM="drop", DRY_RUN="1", MODEL_TYPE="qwen9-1B")
    assert result.returncode == 2
    assert result.stderr.endswith(
        f"error: no model script {slime_dir}/scripts/models/qwen9-1B.sh: set MODEL_TYPE to one "
        "in SLIME_DIR/scripts/models or set MODEL_ARGS\n"
    )


def test_other_nodes_join_the_head_and_submit_nothing(bin_dir, slime_dir):
    result = slime_run(
        bin_dir,
        slime_dir,
        ARM="drop",
        DRY_RUN="1",
        NNODES="2",
        NODE_RANK="1",
        MASTER_ADDR="10.0.0.1",
        NODE_ADDR="10.0.0.2",
    )
    assert result.returncode == 0, result.stderr
    assert "ray job submit" not in result.stdout
    assert "ray start --address 10.0.0.1:6379 --node-ip-address 10.0.0.2" in result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_slime_arm_dry_run_passes_the_variables(slime_dir):
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "slime-arm", "ARM=protect", "A=0.25", "SEED=4"],
        cwd=ROOT,
        env={
            **os.environ,
            "DRY_RUN": "1",
            "SLIME_DIR": str(slime_dir),
            "JOB_PYTHON": sys.executable,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    flags, env, _ = submitted(result.stdout)
    assert env["RESCUE_A"] == "0.25" and env["RESCUE_SEED"] == "4" and flags["--seed"] == ["4"]


def test_every_slime_setting_is_documented_with_its_default():
    text = (LAUNCH / "slime_config.sh").read_text()
    header = text[: text.index("SLIME_DIR=")]
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{\1:?-", text, flags=re.M)
    assert len(names) >= 10
    undocumented = [n for n in names if not re.search(rf"^#\s+{n}\s", header, flags=re.M)]
    assert undocumented == []


# ── against slime's own argument parser and rescue's checks at start ─────────────────────

#: Megatron's and SGLang's flags the launcher passes, which slime's parser leaves to those
#: parsers (slime's own launchers pass each of them: scripts/models/*.sh and
#: examples/fully_async/*.sh at the pinned commit).
OTHER_PARSERS = {
    "--num-layers",
    "--hidden-size",
    "--optimizer",
    "--lr-decay-style",
    "--weight-decay",
    "--adam-beta1",
    "--adam-beta2",
    "--tensor-model-parallel-size",
    "--sequence-parallel",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--attention-dropout",
    "--hidden-dropout",
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "--sglang-mem-fraction-static",
}


@pytest.fixture
def slime_src() -> Path:
    src = os.environ.get("SLIME_SRC")
    if not src:
        pytest.skip("parses the flags with slime's own parser: set SLIME_SRC=/path/to/slime")
    return Path(src)


def _launched_by_slime(slime_src: Path) -> set[str] | None:
    """The flags slime's own launchers pass, when the checkout has them (an archive of the
    package alone has not)."""
    scripts = [p for d in ("scripts", "examples") for p in (slime_src / d).rglob("*.sh")]
    if not scripts:
        return None
    found: set[str] = set()
    for path in scripts:
        found.update(re.findall(r"(--[a-z0-9][a-z0-9-]*)", path.read_text(errors="replace")))
    return found


@pytest.mark.parametrize("estimator", ["group", "turn"])
@pytest.mark.parametrize("arm", ARMS)
def test_every_arms_dry_run_parses_with_slimes_parser_and_passes_the_checks(
    arm, estimator, slime_src, bin_dir, monkeypatch
):
    from framework_args import parse_with_slime

    from rescue.gate import Gate
    from rescue.slime.checks import check_slime_run, start_warnings
    from rescue.slime.rollout import max_staleness_from_env

    out = dry_run(
        arm,
        bin_dir,
        slime_src,
        ESTIMATOR=estimator,
        MODEL_ARGS="--num-layers 36 --hidden-size 4096",
    ).stdout
    flags, env, _ = submitted(out)
    words = [w for k, v in flags.items() for w in (k, *v)]
    args, rest = parse_with_slime(words)
    leftover = {w for w in rest if w.startswith("--")}
    assert leftover == OTHER_PARSERS
    if (launched := _launched_by_slime(slime_src)) is not None:
        assert leftover <= launched | {"--hidden-size", "--num-layers"}
    # slime read rescue's functions and the arm's settings with their real types
    assert args.rollout_function_path == "rescue.slime.rollout.generate_rollout"
    assert args.custom_generate_function_path == "rescue.slime.generate.generate"
    assert args.advantage_estimator == "grpo" and args.use_tis is True
    assert args.normalize_advantages is False and args.rollout_global_dataset is True
    assert args.n_samples_per_prompt == 8 and args.rollout_batch_size == 16
    assert args.custom_convert_samples_to_train_data_path is None
    turn = estimator == "turn"
    assert args.custom_advantage_function_path == (
        "rescue.slime.advantages.turn_advantages" if turn else None
    )
    assert args.custom_reward_post_process_path == (
        "rescue.reward.post_process_rewards" if turn or arm == "protect" else None
    )
    # what the rollout function checks at start, with the job's environment: it starts
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gate = Gate.from_env(max_staleness=max_staleness_from_env())
    assert gate.arm.value == arm
    pace = check_slime_run(args, gate)
    assert (pace is not None) == (arm == "pace") and start_warnings(args) == []
    for path in (
        args.rollout_function_path,
        args.custom_generate_function_path,
        args.custom_advantage_function_path,
        args.custom_reward_post_process_path,
    ):
        if path:
            module, name = path.rsplit(".", 1)
            assert callable(getattr(__import__(module, fromlist=[name]), name))


def test_slimes_own_model_script_when_the_checkout_has_it(slime_src, bin_dir):
    """A git checkout of slime has scripts/models/*.sh (its package archive has not: the dry
    runs above give MODEL_ARGS); its Qwen3-8B array reaches Megatron's parser whole."""
    from framework_args import parse_with_slime

    script = slime_src / "scripts" / "models" / "qwen3-8B.sh"
    flags, _, _ = submitted(
        dry_run(
            "drop",
            bin_dir,
            slime_src,
            **({} if script.exists() else {"MODEL_ARGS": "--num-layers 36"}),
        ).stdout
    )
    _, rest = parse_with_slime([w for k, v in flags.items() for w in (k, *v)])
    assert flags["--num-layers"] == ["36"] and "--num-layers" in rest
    if script.exists():
        assert flags["--normalization"] == ["RMSNorm"] and flags["--vocab-size"] == ["151936"]
        assert flags["--rotary-base"] == ["1000000"]
