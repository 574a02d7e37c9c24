"""The SWE launchers' run hygiene: sandbox and watchdog in every arm's dry run, the settings
recorded beside the checkpoints (a rerun refused unless RESUME=1 with the same settings), the
version warnings, the validation step and the settings the agent's own limits come from."""

from __future__ import annotations

import json
import subprocess

import pytest
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import command_lines, dry_run, eight_gpus, flag_dict, launch, submitted
from launch_env import miles_dir as miles_dir  # a fixture

from rescue.errors import InputError
from rescue.frameworks import MILES, SGLANG_VERSION
from swe_smith_tasks.run_record import (
    RECORD,
    check_save_dir,
    differences,
    record,
    version_warnings,
)

ARMS = ("drop", "never-drop", "protect", "pace", "zero", "mask", "turn")
SANDBOX = (
    "# sandbox: --cpus 2 --memory 10g --pids-limit 4096, cut from the network after checkout; "
    "the agent's own time 3600 s, a trial 5400 s; 40 turns"
)
WATCHDOG = (
    "# watchdog: stop when more than 0.5 of the last 64 groups have no result, or no group "
    "finishes for 10800 s (0: off)"
)


@pytest.mark.parametrize("arm", ARMS)
def test_every_arms_dry_run_shows_its_sandbox_and_watchdog(arm, bin_dir, miles_dir):
    out = dry_run(arm, bin_dir, miles_dir).stdout
    assert SANDBOX in out.splitlines() and WATCHDOG in out.splitlines()
    flags, env, _ = submitted(out)
    expected = {
        "RESCUE_SWE_CONTAINER_CPUS": "2",
        "RESCUE_SWE_CONTAINER_MEMORY": "10g",
        "RESCUE_SWE_CONTAINER_PIDS": "4096",
        "RESCUE_SWE_TIME_BUDGET": "3600",
        "RESCUE_SWE_TRIAL_TIMEOUT": "5400",
        "RESCUE_SWE_OUTER_TIMEOUT": "7200",
        "RESCUE_WATCHDOG_WINDOW": "64",
        "RESCUE_WATCHDOG_MAX_NO_RESULT": "0.5",
        "RESCUE_WATCHDOG_IDLE_S": "10800",
    }
    assert {k: env[k] for k in expected} == expected
    # the same settings reach the wandb config through Miles' --env-report
    (report,) = flags["--env-report"]
    assert {k: json.loads(report)["rescue"][k] for k in expected} == expected
    assert flags["--custom-reward-post-process-path"] == [
        "rescue.miles.reward.post_process_rewards"
    ]


def test_the_sandbox_watchdog_and_pace_settings_change_what_is_shown_and_sent(bin_dir, miles_dir):
    out = dry_run(
        "pace",
        bin_dir,
        miles_dir,
        SANDBOX_CPUS="4",
        SANDBOX_MEMORY="16g",
        SANDBOX_PIDS="0",
        TIME_BUDGET="1800",
        TRIAL_TIMEOUT="3600",
        WATCHDOG_WINDOW="16",
        WATCHDOG_MAX_NO_RESULT="0.25",
    ).stdout
    assert "# sandbox: --cpus 4 --memory 16g --pids-limit 0," in out
    assert "the agent's own time 1800 s, a trial 3600 s" in out
    assert "more than 0.25 of the last 16 groups" in out and "for 7200 s" in out
    assert "# pace: a group in flight past PACE_STRAGGLER_S=5400 s is abandoned" in out
    _, env, _ = submitted(out)
    assert env["RESCUE_SWE_CONTAINER_CPUS"] == "4" and env["RESCUE_SWE_OUTER_TIMEOUT"] == "5400"
    assert env["RESCUE_WATCHDOG_IDLE_S"] == "7200" and env["RESCUE_PACE_STRAGGLER_S"] == "5400"


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"AGENT_ENV": "RESCUE_SWE_CONTAINER_CPUS=8"},
            "AGENT_ENV sets RESCUE_SWE_CONTAINER_CPUS, which has a setting of its own",
        ),
        (
            {"TIME_BUDGET": "5000"},
            "the agent's settings are refused: RESCUE_SWE_TIME_BUDGET=5000.0 plus one request",
        ),
        ({"TOP_P": "1.5"}, "TOP_P='1.5' is not a number in [0, 1]"),
        ({"TOP_K": "-2"}, "TOP_K='-2' is not -1 (off) or a count"),
        ({"WATCHDOG_MAX_NO_RESULT": "2"}, "WATCHDOG_MAX_NO_RESULT='2' is not a number in [0, 1]"),
        ({"SANDBOX_MEMORY": "lots"}, "SANDBOX_MEMORY='lots' is not a docker --memory size"),
        ({"PACE_STRAGGLER_S": "60"}, "PACE_STRAGGLER_S=60 applies only to ARM=pace"),
    ],
)
def test_bad_sandbox_and_watchdog_settings_are_one_line(env, message, bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ARM="drop", **env)
    assert result.returncode == 2 and result.stdout == ""
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert error.startswith("swe-arm: error: ") and message in error


# ── the run's record beside its checkpoints ─────────────────────────────────────────────


def _record(tmp_path, lr="1e-6", data="tasks"):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(data)
    return record(["--lr", lr, "--fully-async"], {"RESCUE_ARM": "drop"}, prompts)


def test_a_new_run_records_its_settings_and_a_rerun_must_ask_to_resume(tmp_path):
    save = tmp_path / "save"
    assert "new run" in check_save_dir(save, _record(tmp_path), resume=False)
    kept = json.loads((save / RECORD).read_text())
    assert kept["flags"] == {"--lr": ["1e-6"], "--fully-async": []}
    assert kept["data"]["sha256"] and kept["env"] == {"RESCUE_ARM": "drop"}
    with pytest.raises(InputError, match=r"already holds a run .*set RESUME=1"):
        check_save_dir(save, _record(tmp_path), resume=False)
    assert "resuming" in check_save_dir(save, _record(tmp_path), resume=True)
    launches = json.loads((save / RECORD).read_text())["launches"]
    assert [x["resume"] for x in launches] == [False, True]  # the record says it resumed


def test_every_launch_of_a_run_gets_the_wandb_run_id_recorded_for_it(tmp_path):
    from swe_smith_tasks.run_record import wandb_run_id

    save = tmp_path / "save"
    first = wandb_run_id(save)  # nothing recorded: a new id, each time
    assert first != wandb_run_id(save) and first.isalnum() and len(first) == 8
    check_save_dir(save, {**_record(tmp_path), "wandb_run_id": first}, resume=False)
    assert wandb_run_id(save) == first
    other = {**_record(tmp_path), "wandb_run_id": "zzzzzzzz"}
    assert "resuming" in check_save_dir(save, other, resume=True)  # kept, not compared


def test_where_the_job_runs_is_not_a_setting_of_the_run(tmp_path):
    prompts = tmp_path / "p.jsonl"
    env = {"RESCUE_ARM": "drop", "SGLANG_X": "1", "MASTER_ADDR": "10.0.0.1", "PYTHONPATH": "/a"}
    assert record([], env, prompts)["env"] == {"RESCUE_ARM": "drop", "SGLANG_X": "1"}


def test_a_resume_with_other_settings_is_refused_naming_each_key(tmp_path):
    save = tmp_path / "save"
    check_save_dir(save, _record(tmp_path), resume=False)
    with pytest.raises(InputError) as e:
        check_save_dir(save, _record(tmp_path, lr="2e-6", data="other"), resume=True)
    message = str(e.value)
    assert "flags.--lr: ['1e-6'] -> ['2e-6']" in message
    assert "data.sha256" in message and "rescue_version" not in message


def test_a_save_dir_without_a_record_cannot_be_resumed_and_a_dry_run_writes_nothing(tmp_path):
    old = tmp_path / "old"
    (old / "iter_0000020").mkdir(parents=True)
    with pytest.raises(InputError, match=f"has no {RECORD}"):
        check_save_dir(old, _record(tmp_path), resume=True)
    fresh = tmp_path / "fresh"
    check_save_dir(fresh, _record(tmp_path), resume=False, dry_run=True)
    assert not fresh.exists()
    assert differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == ["a.c: '<unset>' -> 2"]


def test_the_launcher_refuses_a_used_save_dir_and_resumes_only_the_same_run(
    bin_dir, miles_dir, tmp_path
):
    eight_gpus(bin_dir)
    common = dict(ARM="drop", OUTPUT_DIR=str(tmp_path / "runs"), PREFLIGHT="0", REAP="0")
    first = launch("swe_arm.sh", bin_dir, miles_dir, **common)
    save = tmp_path / "runs" / "swe-drop-k2-seed1" / "checkpoints"
    assert (save / RECORD).is_file(), first.stderr  # written before Ray (which fails here)
    again = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", **common)
    assert again.returncode == 2 and "already holds a run" in again.stderr
    resumed = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", RESUME="1", **common)
    assert resumed.returncode == 0, resumed.stderr
    assert "# resuming the run in" in resumed.stdout
    wandb_id = json.loads((save / RECORD).read_text())["wandb_run_id"]
    assert len(wandb_id) == 8  # the first launch's, given to the resumed job as well
    assert f'"WANDB_RUN_ID":"{wandb_id}","WANDB_RESUME":"allow"' in resumed.stdout
    assert [x["resume"] for x in json.loads((save / RECORD).read_text())["launches"]] == [False]
    changed = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", RESUME="1", LR="3e-6", **common)
    assert changed.returncode == 2 and "flags.--lr: ['1e-6'] -> ['3e-6']" in changed.stderr


# ── versions ─────────────────────────────────────────────────────────────────────────────


def test_version_warnings_name_both_versions():
    assert version_warnings(MILES.commit, SGLANG_VERSION) == []
    other = version_warnings("a" * 40, "0.5.30")
    assert other == [
        f"the Miles checkout is at aaaaaaaa, rescue is tested against radixark/miles {MILES.short}",
        f"the installed SGLang is 0.5.30, rescue is tested against {SGLANG_VERSION}",
    ]
    assert "cannot tell" in version_warnings(None, None)[0]


def test_the_launcher_warns_about_a_miles_checkout_at_another_commit(bin_dir, miles_dir):
    git = ["git", "-C", str(miles_dir)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run(
        [
            *git,
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    result = dry_run("drop", bin_dir, miles_dir)
    assert (
        f"swe-arm: warning: the Miles checkout is at {head[:8]}, rescue is tested against "
        f"radixark/miles {MILES.short}"
    ) in result.stderr
    assert f"rescue is tested against {SGLANG_VERSION}" in result.stderr  # no SGLang here


# ── validation and the training prompts ──────────────────────────────────────────────────


def test_swe_validate_grades_the_pilots_subset_in_the_training_sandbox(bin_dir, miles_dir):
    result = launch("swe_validate.sh", bin_dir, miles_dir, DRY_RUN="1", SANDBOX_CPUS="3")
    assert result.returncode == 0, result.stderr
    (cmd,) = [w for w in command_lines(result.stdout) if "validate" in w]
    env = dict(w.split("=", 1) for w in cmd[1 : cmd.index("-m") - 1])
    assert env["RESCUE_SWE_CONTAINER_CPUS"] == "3" and env["RESCUE_SWE_MAX_CONCURRENCY"] == "128"
    flags = flag_dict(cmd[cmd.index("validate") + 1 :])
    assert flags["--subset"] == ["/runs/pilot/subset.txt"]
    assert flags["--tasks"] == ["/runs/data/swe_smith_tasks.jsonl"]
    assert flags["--out"] == ["/runs/validate"] and flags["--concurrency"] == ["128"]


def test_swe_prepare_trains_on_the_validated_subset_only(bin_dir, miles_dir, tmp_path):
    out = tmp_path / "runs"
    (out / "pilot").mkdir(parents=True)
    (out / "pilot" / "subset.txt").write_text("a\n")
    common = dict(OUTPUT_DIR=str(out), DRY_RUN="1")
    refused = launch("swe_prepare.sh", bin_dir, miles_dir, **common)
    assert refused.returncode == 2 and "run make swe-validate" in refused.stderr
    as_is = launch("swe_prepare.sh", bin_dir, miles_dir, REQUIRE_VALIDATE="0", **common)
    assert f"--subset {out}/pilot/subset.txt" in as_is.stdout
    (out / "validate").mkdir()
    (out / "validate" / "subset.txt").write_text("a\n")
    validated = launch("swe_prepare.sh", bin_dir, miles_dir, **common)
    assert validated.returncode == 0 and f"--subset {out}/validate/subset.txt" in validated.stdout
    (out / "pilot" / "subset.txt").touch()  # a later pilot: the validation is stale
    import os
    import time

    later = time.time() + 10
    os.utime(out / "pilot" / "subset.txt", (later, later))
    stale = launch("swe_prepare.sh", bin_dir, miles_dir, **common)
    assert stale.returncode == 2 and "rerun make swe-validate" in stale.stderr
