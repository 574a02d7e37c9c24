"""What the launchers do on a node: pre-flight, the pilot's server and probe, the processes
they start and stop, the housekeeper. Stand-ins on PATH play the node's commands (docker,
nvidia-smi, ray); nothing needs a GPU, Docker or Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_env import LAUNCH, command_lines, eight_gpus, executable, flag_dict, launch
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture

# ── pre-flight ───────────────────────────────────────────────────────────────────────────

DOCKER = """#!/bin/sh
case "$1 $2" in
  "info --format") echo 27.0.1 ;;
  "image inspect") [ "$3" = swebench/present:latest ] ;;
  "run --rm")
    case "$FAKE_REMOTE" in
      reachable) printf 'branch\\nremote\\n' ;;
      branch) echo branch ;;
      broken) echo 'docker: Error response from daemon: no space left on device.' >&2; exit 125 ;;
      *) : ;;
    esac ;;
  *) exit 1 ;;
esac
"""


def _checkpoint(tmp_path: Path, config: dict, name: str = "hf") -> Path:
    hf = tmp_path / name
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps(config))
    return hf


def preflight(bin_dir: Path, miles_dir: Path, tmp_path: Path, **env: str) -> dict[str, str]:
    eight_gpus(bin_dir)
    executable(bin_dir / "docker", DOCKER)
    data = tmp_path / "prompts.jsonl"
    rows = [
        {
            "prompt": "p",
            "metadata": {"instance_id": "a__b.1.x", "image": "swebench/present:latest"},
        },
        {
            "prompt": "q",
            "metadata": {"instance_id": "c__d.2.y", "image": "swebench/missing:latest"},
        },
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {
        "PROMPT_DATA": str(data),
        "HF_CHECKPOINT": env.get("HF_CHECKPOINT")
        or str(_checkpoint(tmp_path, {"max_position_embeddings": 40960})),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "WANDB_MODE": "offline",
        "DUMP_MB_PER_STEP": "1",
        "CKPT_GB": "1",
        "FAKE_REMOTE": "reachable",
        **env,
    }
    result = launch("preflight.sh", bin_dir, miles_dir, **settings)
    lines = [line for line in result.stdout.splitlines() if line[:1] != " "]
    report = {line.split()[1]: line for line in lines}
    report["_rc"] = str(result.returncode)
    return report


def status(report: dict[str, str], check: str) -> str:
    return report[check].split()[0]


def test_preflight_reports_each_check_and_the_pulls_needed(bin_dir, miles_dir, tmp_path):
    report = preflight(bin_dir, miles_dir, tmp_path)
    for check in ("gpus", "docker", "data", "remote", "wandb", "disk", "context", "imports"):
        assert status(report, check) == "ok", report[check]
    assert status(report, "images") == "FAIL" and report["_rc"] == "1"
    assert (tmp_path / "out" / "pulls-needed.txt").read_text() == (
        "docker pull swebench/missing:latest\n"
    )


@pytest.mark.parametrize(
    ("remote", "verdict", "words"),
    [
        ("branch", "WARN", "its image holds branch a__b.1.x"),
        ("none", "FAIL", "lacks branch a__b.1.x"),
        ("broken", "FAIL", "cannot run a container of swebench/present:latest"),
    ],
)
def test_preflight_says_when_task_containers_cannot_reach_the_remote(
    remote, verdict, words, bin_dir, miles_dir, tmp_path
):
    report = preflight(bin_dir, miles_dir, tmp_path, FAKE_REMOTE=remote)
    assert status(report, "remote") == verdict and words in report["remote"]


def test_preflight_refuses_a_rope_scaling_checkpoint(bin_dir, miles_dir, tmp_path):
    yarn = {
        "max_position_embeddings": 40960,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    }
    report = preflight(
        bin_dir, miles_dir, tmp_path, HF_CHECKPOINT=str(_checkpoint(tmp_path, yarn, "yarn"))
    )
    assert status(report, "context") == "FAIL"
    assert "rope_scaling (yarn)" in report["context"] and "remove rope_scaling" in report["context"]


def test_preflight_allows_a_longer_context_only_when_asked(bin_dir, miles_dir, tmp_path):
    report = preflight(bin_dir, miles_dir, tmp_path, MAX_SEQ_LEN="65536")
    assert status(report, "context") == "FAIL" and "EXTEND_CONTEXT=1" in report["context"]
    report = preflight(bin_dir, miles_dir, tmp_path, MAX_SEQ_LEN="65536", EXTEND_CONTEXT="1")
    assert status(report, "context") == "WARN" and "plain RoPE" in report["context"]


def test_preflight_sizes_disk_for_the_dumps_and_the_checkpoints_kept(bin_dir, miles_dir, tmp_path):
    report = preflight(bin_dir, miles_dir, tmp_path, CKPT_GB="100000000")
    assert status(report, "disk") == "FAIL"
    assert "checkpoints 307200000000 MB (3 x CKPT_GB=100000000)" in report["disk"]
    report = preflight(bin_dir, miles_dir, tmp_path, DUMP_MB_PER_STEP="100000000", CKPT_KEEP="1")
    assert status(report, "disk") == "FAIL" and "dumps 5000000000 MB" in report["disk"]


def test_preflight_imports_what_a_trial_needs_in_the_trainers_python(bin_dir, miles_dir, tmp_path):
    blocked = tmp_path / "blocked"
    (blocked / "minisweagent").mkdir(parents=True)
    (blocked / "minisweagent" / "__init__.py").write_text("raise ImportError('not installed')\n")
    job_python = tmp_path / "job-python"
    executable(
        job_python, f'#!/bin/sh\nPYTHONPATH="{blocked}:$PYTHONPATH" exec "{sys.executable}" "$@"\n'
    )
    report = preflight(bin_dir, miles_dir, tmp_path, JOB_PYTHON=str(job_python))
    assert status(report, "imports") == "FAIL"
    assert "minisweagent.agents.default (ImportError: not installed)" in report["imports"]
    # swe_smith_tasks.agent imports mini-swe-agent only when a trial runs: each piece is named
    listed = report["imports"].split("cannot import ")[1]
    assert "minisweagent.models.litellm_model (ImportError" in listed
    assert "minisweagent.environments.docker (ImportError" in listed
    assert "swe_smith_tasks.agent" not in listed and "litellm (" not in listed


# ── the pilot ────────────────────────────────────────────────────────────────────────────


def pilot(bin_dir, miles_dir, **env):
    return launch("pilot.sh", bin_dir, miles_dir, DRY_RUN="1", **{"PILOT_TASKS": "50", **env})


def test_pilot_serves_the_checkpoint_as_training_does(bin_dir, miles_dir):
    result = pilot(bin_dir, miles_dir)
    assert result.returncode == 0, result.stderr
    (server,) = [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
    flags = flag_dict(server[server.index("sglang.launch_server") + 1 :])
    assert flags["--model-path"] == ["/root/models/Qwen3-8B"]
    assert flags["--context-length"] == ["40960"]
    assert flags["--tool-call-parser"] == ["qwen25"] and flags["--reasoning-parser"] == ["qwen3"]
    assert flags["--chat-template"] == [
        f"{miles_dir}/miles/utils/chat_template_utils/templates/qwen3_fixed.jinja"
    ]
    (probe,) = [w for w in command_lines(result.stdout) if "probe" in w]
    probe_flags = flag_dict(probe[probe.index("probe") + 1 :])
    assert probe_flags["--tool-call-parser"] == ["qwen25"]
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    pilot_flags = flag_dict(cmd[cmd.index("pilot") + 1 :])
    assert json.loads(pilot_flags["--chat-template-kwargs"][0]) == {"clear_thinking": False}
    assert probe_flags["--chat-template-kwargs"] == pilot_flags["--chat-template-kwargs"]


def test_pilot_and_training_share_context_and_parsers(bin_dir, miles_dir):
    from launch_env import dry_run, submitted

    for env in ({}, {"TITO_MODEL": "glm47", "MAX_SEQ_LEN": "32768"}):
        train, _, _ = submitted(dry_run("drop", bin_dir, miles_dir, **env).stdout)
        result = pilot(bin_dir, miles_dir, **env)
        (server,) = [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
        served = flag_dict(server[server.index("sglang.launch_server") + 1 :])
        for flag in ("--context-length", "--tool-call-parser", "--reasoning-parser"):
            assert served[flag] == train[f"--sglang-{flag[2:]}"]


def test_pilot_with_a_longer_context_gives_sglang_its_override(bin_dir, miles_dir):
    result = pilot(bin_dir, miles_dir, MAX_SEQ_LEN="65536", EXTEND_CONTEXT="1")
    (server,) = [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
    assert server[:2] == ["env", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"]


def test_pilot_uses_the_training_settings(bin_dir, miles_dir):
    result = pilot(bin_dir, miles_dir, PILOT_BASE_URL="http://h:1", PILOT_RETRY_INFRA="1")
    assert result.returncode == 0, result.stderr
    assert not [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    flags = flag_dict(cmd[cmd.index("pilot") + 1 :])
    assert flags["--base-url"] == ["http://h:1"]
    assert flags["--n"] == ["8"] and flags["--max-tasks"] == ["50"]
    assert flags["--low"] == ["0.2"] and flags["--high"] == ["0.5"]
    assert flags["--temperature"] == ["1.0"] and flags["--max-tokens"] == ["8192"]
    assert flags["--retry-infra"] == []


def test_pilot_agent_gets_the_training_agent_settings(bin_dir, miles_dir):
    result = pilot(
        bin_dir,
        miles_dir,
        PILOT_BASE_URL="http://h:1",
        MAX_TURNS="12",
        TRIAL_TIMEOUT="4800",
        AGENT_ENV="RESCUE_SWE_COMMAND_TIMEOUT=100 RESCUE_SWE_DOCKER_RUN_ARGS=--shm-size=2g",
    )
    assert result.returncode == 0, result.stderr
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    assert cmd[0] == "env"
    env = dict(w.split("=", 1) for w in cmd[1 : cmd.index("-m") - 1])
    assert env["RESCUE_SWE_STEP_LIMIT"] == "12"
    assert env["RESCUE_SWE_MAX_CONCURRENCY"] == "64"
    assert env["RESCUE_SWE_TRIAL_TIMEOUT"] == "4800"
    assert env["RESCUE_SWE_COMMAND_TIMEOUT"] == "100"
    assert env["RESCUE_SWE_DOCKER_RUN_ARGS"] == "--shm-size=2g"
    bad = pilot(bin_dir, miles_dir, PILOT_BASE_URL="u", AGENT_ENV="oops")
    assert bad.returncode == 2 and "AGENT_ENV entry 'oops' is not NAME=VALUE" in bad.stderr


def test_pilot_of_the_whole_dataset_must_be_asked_for(bin_dir, miles_dir):
    result = pilot(bin_dir, miles_dir, PILOT_TASKS="", PILOT_BASE_URL="http://h:1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "pilot: error: PILOT_TASKS is empty: set PILOT_TASKS=N to pilot a random sample of N "
        "tasks, or PILOT_ALL=1 to pilot every task of TASKS_JSONL\n"
    )
    result = pilot(bin_dir, miles_dir, PILOT_TASKS="", PILOT_ALL="1", PILOT_BASE_URL="http://h:1")
    (cmd,) = [w for w in command_lines(result.stdout) if "pilot" in w]
    assert "--max-tasks" not in cmd


def test_pilot_needs_the_family_chat_template(bin_dir, tmp_path):
    result = pilot(bin_dir, tmp_path)
    assert result.returncode == 2
    assert "no chat template" in result.stderr and "set MILES_DIR" in result.stderr


def test_pilot_stops_before_any_trial_when_the_endpoint_returns_calls_as_text(
    bin_dir, miles_dir, tmp_path
):
    pytest.importorskip("minisweagent")
    from swe_stubs import ScriptedOpenAI

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "p", "metadata": {"instance_id": "a__b.1.x"}}) + "\n")
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo ready"}}\n</tool_call>'
    server = ScriptedOpenAI([{"text": call}])  # SGLang started without --tool-call-parser
    try:
        result = launch(
            "pilot.sh",
            bin_dir,
            miles_dir,
            PILOT_BASE_URL=server.base_url,
            TASKS_JSONL=str(tasks),
            PILOT_TASKS="1",
            PILOT_PULL="0",  # no docker here: the image pull would stop it first
            OUTPUT_DIR=str(tmp_path / "out"),
        )
    finally:
        server.close()
    assert result.returncode == 2
    assert "--tool-call-parser qwen25" in result.stderr
    assert "fails the tool-call probe" in result.stderr
    assert len(server.requests) == 1 and not (tmp_path / "out" / "pilot").exists()


# ── processes: recorded by session, stopped by record only ───────────────────────────────


def _bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"source {LAUNCH}/config.sh && source {LAUNCH}/common.sh && {script}"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status != "Z"


def test_an_earlier_runs_processes_are_stopped_by_their_recorded_session_only(tmp_path):
    state = tmp_path / "state"
    started = _bash(
        # a session leader whose child outlives it: what `ray start` leaves behind
        f"rescue_spawn ray wait bash -c 'sleep 300 >/dev/null 2>&1 & echo $! > \"$0\"' "
        f"{tmp_path / 'child.pid'}",
        RUN_STATE_DIR=str(state),
    )
    assert started.returncode == 0, started.stderr
    child = int((tmp_path / "child.pid").read_text())
    bystander = subprocess.Popen(["sleep", "300"])  # the same command, not ours
    try:
        assert _alive(child) and (state / "ray.sid").is_file()
        dry = _bash("rescue_stop_recorded ray", RUN_STATE_DIR=str(state), DRY_RUN="1")
        assert "stop ray left by an earlier run" in dry.stdout and _alive(child)
        stopped = _bash("rescue_stop_recorded ray", RUN_STATE_DIR=str(state))
        assert stopped.returncode == 0, stopped.stderr
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
        assert bystander.poll() is None  # never touched
        assert not (state / "ray.sid").exists()
    finally:
        bystander.kill()
        bystander.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


# ── the housekeeper: dumps and checkpoints, whatever happens to the submitting shell ────


def _fake_ray(bin_dir: Path, tmp_path: Path, ending: str = "succeeded") -> Path:
    """A ray CLI: start succeeds; submit exits 0 at once, as Ray's does when its log stream
    ends while the job still runs (``submit`` in Ray's dashboard/modules/job/cli.py); the job
    runs until a flag file exists, then ``job status`` prints its ``ending`` as Ray's
    ``_log_job_status`` does (``Job 'ID' succeeded``, ``failed``, ``was stopped``)."""
    done = tmp_path / "job-done"
    executable(
        bin_dir / "ray",
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/ray-calls"\n'
        'case "$1 $2" in\n'
        '  "job status")\n'
        f'    if [ -e "{done}" ]; then echo "Job \'x\' {ending}"; else\n'
        "      echo \"Status for job 'x': RUNNING\"; fi ;;\n"
        "esac\n"
        "exit 0\n",
    )
    return done


def _checkpoints(save: Path, iterations: list[int], latest: int) -> None:
    for i in iterations:
        (save / f"iter_{i:07d}").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text(f"{latest}\n")


def test_checkpoint_retention_keeps_the_newest_and_never_one_being_written(tmp_path):
    save = tmp_path / "ckpt"
    _checkpoints(save, [20, 40, 60, 80, 100], latest=80)  # 100 is being written
    result = _bash("rescue_prune_checkpoints", SAVE_DIR=str(save), CKPT_KEEP="2")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in save.glob("iter_*")) == [
        "iter_0000060",
        "iter_0000080",
        "iter_0000100",
    ]
    _bash("rescue_prune_checkpoints", SAVE_DIR=str(save), CKPT_KEEP="0")
    assert len(list(save.glob("iter_*"))) == 3


def test_dump_window_keeps_the_first_steps(tmp_path):
    dumps = tmp_path / "dumps"
    (dumps / "rollout_data").mkdir(parents=True)
    (dumps / "dashboard_columns").mkdir()
    for i in (0, 7, 49, 50, 120):
        (dumps / "rollout_data" / f"{i}.pt").write_text("")
        (dumps / "dashboard_columns" / f"rollout_{i}.parquet").write_text("")
    result = _bash("rescue_prune_dumps", DUMP_DIR=str(dumps), DUMP_STEPS="50")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (dumps / "rollout_data").iterdir()) == ["0.pt", "49.pt", "7.pt"]
    assert len(list((dumps / "dashboard_columns").iterdir())) == 3


def _waiting_launcher(
    bin_dir: Path, miles_dir: Path, tmp_path: Path, job: str, **env: str
) -> tuple[subprocess.Popen, Path, Path]:
    """``swe_arm.sh`` started in its own session against ``_fake_ray``, returned once it says
    it waits for job ``job`` (submit exited 0 while the job runs): (the launcher, its stderr
    file, its RUN_STATE_DIR)."""
    out = tmp_path / "out"
    stderr = tmp_path / "launcher.err"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"),
        "JOB_PYTHON": sys.executable, "RESCUE_PY": sys.executable, "MILES_DIR": str(miles_dir),
        "OUTPUT_DIR": str(out), "PREFLIGHT": "0", "REAP": "0", "HOUSEKEEP_S": "1",
        "JOB_POLL_S": "1", "SUBMISSION_ID": job, **env,
    }  # fmt: skip
    with stderr.open("w") as err:
        launcher = subprocess.Popen(
            ["bash", str(LAUNCH / "swe_arm.sh")], env=env, stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True,
        )  # fmt: skip
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    deadline = time.monotonic() + 60
    try:
        while f"submit stopped following job {job}" not in stderr.read_text():
            assert launcher.poll() is None, stderr.read_text()  # not ended at submit's exit 0
            assert time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.2)
    except BaseException:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        raise
    return launcher, stderr, out / ".launch" / host


def test_the_housekeeper_outlives_the_launcher_until_the_job_ends(bin_dir, miles_dir, tmp_path):
    eight_gpus(bin_dir)
    done = _fake_ray(bin_dir, tmp_path)
    launcher, _, state = _waiting_launcher(
        bin_dir, miles_dir, tmp_path, "job-1", ARM="drop", DUMP_STEPS="2", CKPT_KEEP="1"
    )
    # the launcher waits for the job: the submitting shell goes away (a lost ssh session)
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    calls = (tmp_path / "ray-calls").read_text()
    assert "start --head" in calls and "job submit" in calls and "--submission-id job-1" in calls
    run = tmp_path / "out" / "swe-drop-k2-seed1"
    sid = int((state / "housekeeper.sid").read_text())
    assert (state / "ray.sid").is_file()
    try:
        (run / "dumps" / "rollout_data").mkdir(parents=True, exist_ok=True)
        for i in (0, 1, 2, 9):
            (run / "dumps" / "rollout_data" / f"{i}.pt").write_text("")
        _checkpoints(run / "checkpoints", [20, 40, 60], latest=60)

        def kept() -> tuple[list[str], list[str]]:
            dumps = sorted(p.name for p in (run / "dumps" / "rollout_data").iterdir())
            return dumps, sorted(p.name for p in (run / "checkpoints").glob("iter_*"))

        # one pass prunes the dumps, then the checkpoints: wait for both
        deadline = time.monotonic() + 60
        while kept() != (["0.pt", "1.pt"], ["iter_0000060"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert kept() == (["0.pt", "1.pt"], ["iter_0000060"])
        assert _alive(sid)  # the job still runs
        assert "job status" in (tmp_path / "ray-calls").read_text()
        done.write_text("")
        deadline = time.monotonic() + 60
        while _alive(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(sid)
        assert "job job-1 ended" in (run / "housekeeper.log").read_text()
    finally:
        if _alive(sid):
            os.killpg(sid, signal.SIGKILL)


@pytest.mark.parametrize(("ending", "rc"), [("succeeded", 0), ("failed", 1), ("was stopped", 1)])
def test_the_launcher_ends_when_ray_says_the_job_ended_not_when_submit_exits(
    bin_dir, miles_dir, tmp_path, ending, rc
):
    """``ray job submit`` exits 0 when its log stream ends while the job still runs; the
    launcher (and a chain's next arm, or the oracle's comparison after it) waits for Ray."""
    eight_gpus(bin_dir)
    done = _fake_ray(bin_dir, tmp_path, ending)
    launcher, stderr, state = _waiting_launcher(
        bin_dir, miles_dir, tmp_path, "job-2", ARM="never-drop"
    )
    try:
        time.sleep(2)  # two more asks: still running
        assert launcher.poll() is None, stderr.read_text()
        done.write_text("")
        assert launcher.wait(timeout=60) == rc, stderr.read_text()
        said = stderr.read_text()
        assert said.count("submit stopped following job job-2") == 1
        assert (f"job job-2 {ending.split()[-1]}" in said) == (rc != 0), said
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        if (state / "housekeeper.sid").exists():
            sid = int((state / "housekeeper.sid").read_text())
            deadline = time.monotonic() + 30
            while _alive(sid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(sid):
                os.killpg(sid, signal.SIGKILL)
