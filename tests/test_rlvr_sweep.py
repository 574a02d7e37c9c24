"""The sweep: every run submitted, progress as Ray reports it, failures with their logs.

``launch/rlvr_sweep.sh`` runs for real here against a stand-in ``ray`` on ``PATH`` that
answers ``ray start``, ``ray job submit --no-wait``, ``ray job status`` and ``ray job logs``
as Ray 2.x's CLI prints them (``ray.dashboard.modules.job.cli``), each job following a
scripted list of statuses, one per ``ray job status`` call.
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import eight_gpus, executable, launch
from launch_env import miles_dir as miles_dir  # a fixture

from rescue.errors import InputError
from rescue.rlvr.sweep import (
    DONE,
    FAILED,
    LOST,
    QUEUED,
    RUNNING,
    Run,
    Watcher,
    parse_status,
    read_plan,
)

#: The stand-in ``ray``: state in $RAY_STANDIN (script.json: run name -> statuses, and
#: "submit_fails": run names whose submission Ray refuses).
RAY_STANDIN = r"""#!/usr/bin/env python3
import json, os, sys, time
state = os.environ["RAY_STANDIN"]
script = json.load(open(os.path.join(state, "script.json")))
calls = os.path.join(state, "calls.jsonl")
with open(calls, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
stamp = time.strftime("%Y-%m-%d %H:%M:%S,000")

def log(level, where, text):
    print(f"{stamp}\t{level} {where} -- {text}")

def run_of(sid):
    return sid.rsplit("-", 2)[0]

if args[:1] == ["start"]:
    print("Ray runtime started.")
    sys.exit(0)
if args[:2] == ["job", "submit"]:
    sid = args[args.index("--submission-id") + 1]
    if run_of(sid) in script.get("submit_fails", []):
        print("Traceback (most recent call last):\nRuntimeError: Request failed with status code 500: No available agent to submit job, please try again later.")
        sys.exit(1)
    open(os.path.join(state, "job-" + sid), "w").write("0")
    log("INFO", "cli.py:322", f"Job '{sid}' submitted successfully")
    sys.exit(0)
if args[:2] == ["job", "status"] or args[:2] == ["job", "logs"]:
    sid = args[-1]
    path = os.path.join(state, "job-" + sid)
    if not os.path.exists(path):
        print(f"Traceback (most recent call last):\nRuntimeError: Request failed with status code 404: Job {sid} does not exist.")
        sys.exit(1)
    if args[1] == "logs":
        print(f"driver log of {sid}\nTraceback (most recent call last):\nRuntimeError: CUDA out of memory")
        sys.exit(0)
    n = int(open(path).read())
    statuses = script["runs"][run_of(sid)]
    status = statuses[min(n, len(statuses) - 1)]
    open(path, "w").write(str(n + 1))
    if status == "SUCCEEDED":
        bar = "-" * (len(sid) + 17)
        log("SUCC", "cli.py:66", bar); log("SUCC", "cli.py:67", f"Job '{sid}' succeeded"); log("SUCC", "cli.py:68", bar)
    elif status == "FAILED":
        bar = "-" * (len(sid) + 14)
        log("ERR", "cli.py:74", bar); log("ERR", "cli.py:75", f"Job '{sid}' failed"); log("ERR", "cli.py:76", bar)
        log("INFO", "cli.py:89", "Status message: Job entrypoint command failed with exit code 1")
    elif status == "STOPPED":
        log("WARN", "cli.py:85", f"Job '{sid}' was stopped")
    else:
        log("INFO", "cli.py:92", f"Status for job '{sid}': {status}")
    sys.exit(0)
print("unexpected", args, file=sys.stderr)
sys.exit(2)
"""


def stand_in_ray(bin_dir: Path, state: Path, runs: dict, submit_fails=()) -> None:
    state.mkdir()
    (state / "script.json").write_text(
        json.dumps({"runs": runs, "submit_fails": list(submit_fails)})
    )
    executable(
        bin_dir / "ray", RAY_STANDIN.replace("#!/usr/bin/env python3", f"#!{sys.executable}")
    )
    eight_gpus(bin_dir)


def test_a_sweep_reports_progress_and_every_failure_with_its_log(bin_dir, miles_dir, tmp_path):
    state = tmp_path / "ray"
    out_dir = tmp_path / "runs"
    runs = {
        "rlvr-zero-cap512-seed1": ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"],
        "rlvr-zero-cap512-seed2": ["PENDING", "PENDING", "RUNNING", "SUCCEEDED"],
        "rlvr-mask-cap512-seed1": ["RUNNING", "FAILED"],
        "rlvr-mask-cap512-seed2": ["PENDING", "RUNNING", "STOPPED"],
        "rlvr-turn-cap512-seed2": ["PENDING", "SUCCEEDED"],
    }
    stand_in_ray(bin_dir, state, runs, submit_fails=["rlvr-turn-cap512-seed1"])
    result = launch(
        "rlvr_sweep.sh",
        bin_dir,
        miles_dir,
        timeout=120,
        OUTPUT_DIR=str(out_dir),
        RAY_STANDIN=str(state),
        ARMS="zero mask turn",
        SEEDS="2",
        FORCE="1",  # two seeds keep the stand-in sweep small; the judge needs three
        CAP="512",
        SWEEP_POLL_S="1",
        DUMP_STEPS="all",
        CKPT_KEEP="0",
        SWEEP_DIR=str(tmp_path / "sweep"),
    )
    out = result.stdout
    assert result.returncode == 1, result.stderr + out
    calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    assert [c[:2] for c in calls].count(["job", "submit"]) == 6
    assert calls[0][0] == "start"
    plan = read_plan(tmp_path / "sweep" / "plan.jsonl")
    assert [r.run for r in plan] == [
        "rlvr-zero-cap512-seed1",
        "rlvr-zero-cap512-seed2",
        "rlvr-mask-cap512-seed1",
        "rlvr-mask-cap512-seed2",
        "rlvr-turn-cap512-seed1",
        "rlvr-turn-cap512-seed2",
    ]
    # a refused submission is a failed run from the start, its output in its log
    refused = out_dir / "rlvr-turn-cap512-seed1" / "ray-job.log"
    assert "No available agent to submit job" in refused.read_text()
    assert (
        f"rlvr-sweep: FAILED rlvr-turn-cap512-seed1: log {refused} (ray job submit failed:" in out
    )
    # a failed job: its driver log fetched into its log path, Ray's message shown
    failed = out_dir / "rlvr-mask-cap512-seed1" / "ray-job.log"
    assert "CUDA out of memory" in failed.read_text()
    assert (
        f"rlvr-sweep: FAILED rlvr-mask-cap512-seed1: log {failed} (Job entrypoint command "
        "failed with exit code 1)" in out
    )
    stopped = out_dir / "rlvr-mask-cap512-seed2" / "ray-job.log"
    assert f"rlvr-sweep: FAILED rlvr-mask-cap512-seed2: log {stopped} (stopped)" in out
    # progress: counts whenever a run changes, every run counted
    counts = re.findall(
        r"rlvr-sweep: 6 runs: (\d+) queued, (\d+) running, (\d+) done, (\d+) failed", out
    )
    assert counts[0] == ("5", "0", "0", "1")
    assert all(sum(map(int, c)) <= 6 for c in counts)
    assert counts[-1] == ("0", "0", "3", "3")
    assert "rlvr-sweep: 3 of 6 runs did not succeed:" in out
    assert "rlvr-sweep: running rlvr-zero-cap512-seed1" in out
    assert "rlvr-sweep: done rlvr-zero-cap512-seed2" in out


def watcher_for(runs: list[Run], answers: dict[str, list[tuple[int, str]]], **kw):
    """A Watcher whose ``ray`` answers come from ``answers[submission id]`` in turn."""
    out = io.StringIO()
    calls = []

    def runner(argv):
        calls.append(argv)
        sid = argv[-1]
        if argv[2] == "logs":
            return 0, f"log of {sid}\n"
        queue = answers[sid]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    w = Watcher(
        runs, address="http://h:1", poll_s=0, runner=runner, out=out, sleep=lambda s: None, **kw
    )
    return w, out, calls


def status(sid: str, s: str) -> tuple[int, str]:
    return 0, f"x\tINFO cli.py:92 -- Status for job '{sid}': {s}\n"


def test_the_watcher_ends_when_every_run_has_and_exits_0_only_if_all_succeeded(tmp_path):
    runs = [Run("a", "a-1", str(tmp_path / "a.log")), Run("b", "b-1", str(tmp_path / "b.log"))]
    w, out, _ = watcher_for(
        runs,
        {
            "a-1": [status("a-1", "PENDING"), status("a-1", "RUNNING"), (0, "Job 'a-1' succeeded")],
            "b-1": [status("b-1", "RUNNING"), (0, "Job 'b-1' succeeded")],
        },
    )
    assert w.watch() == 0
    assert [r.state for r in runs] == [DONE, DONE]
    assert runs[0].history == [RUNNING, DONE]  # queued is where every run starts
    assert "all 2 runs succeeded" in out.getvalue()


def test_a_run_ray_stops_answering_for_is_lost_not_skipped(tmp_path):
    runs = [Run("a", "a-1", str(tmp_path / "a.log")), Run("b", "b-1", str(tmp_path / "b.log"))]
    w, out, _ = watcher_for(
        runs,
        {
            "a-1": [(1, "ConnectionError: could not reach http://h:1")],
            "b-1": [(0, "Job 'b-1' succeeded")],
        },
        lost_after=3,
    )
    assert w.watch() == 1
    assert [r.state for r in runs] == [LOST, DONE]
    text = out.getvalue()
    assert "LOST a: ray job status failed 3 times in a row: ConnectionError" in text
    assert "ray job status --address http://h:1 a-1" in text
    assert "1 of 2 runs did not succeed:" in text and ", 1 lost" in text


def test_a_failed_runs_log_is_fetched_once_into_its_path(tmp_path):
    log = tmp_path / "deep" / "a.log"
    runs = [Run("a", "a-1", str(log))]
    w, out, calls = watcher_for(
        runs, {"a-1": [(0, "ERR -- Job 'a-1' failed\nINFO -- Status message: boom")]}
    )
    assert w.watch() == 1
    assert log.read_text() == "log of a-1\n"
    assert [c[:3] for c in calls].count(["ray", "job", "logs"]) == 1
    assert f"FAILED a: log {log} (boom)" in out.getvalue()


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("Status for job 'x': PENDING", QUEUED),
        ("Status for job 'x': RUNNING", RUNNING),
        ("------\nJob 'x' succeeded\n------", DONE),
        ("Job 'x' failed\nStatus message: m", FAILED),
        ("Job 'x' was stopped", FAILED),
        ("Traceback ...\nRuntimeError: 404", None),
    ],
)
def test_parse_status(text, state):
    assert parse_status(text)[0] == state


def test_a_bad_plan_is_refused(tmp_path):
    plan = tmp_path / "plan.jsonl"
    plan.write_text('{"run": "a"}\n')
    with pytest.raises(InputError, match="line 1: expected an object with run, submission_id"):
        read_plan(plan)
    with pytest.raises(InputError, match="does not exist"):
        read_plan(tmp_path / "none")


def test_parse_status_reads_what_rays_own_cli_prints(capfd):
    """Ray's ``ray job status`` printer, run on each JobStatus, read back by ``parse_status``."""
    pytest.importorskip("ray")
    from ray.dashboard.modules.job import cli
    from ray.job_submission import JobStatus

    class Info:
        def __init__(self, status):
            self.status = status
            self.message = "exit code 1" if status == JobStatus.FAILED else None

    class Client:
        def __init__(self, status):
            self.info = Info(status)

        def get_job_info(self, job_id):
            return self.info

    want = {
        JobStatus.PENDING: QUEUED,
        JobStatus.RUNNING: RUNNING,
        JobStatus.SUCCEEDED: DONE,
        JobStatus.FAILED: FAILED,
        JobStatus.STOPPED: FAILED,
    }
    for status, state in want.items():
        capfd.readouterr()
        cli._log_job_status(Client(status), "rlvr-zero-cap512-seed1-20260101-000000")
        captured = capfd.readouterr()
        got = parse_status(captured.out + captured.err)
        assert got[0] == state, (status, captured)
        if status == JobStatus.FAILED:
            assert got[1] == "exit code 1"


def test_the_watch_command_uses_its_ray_poll_and_lost_after(tmp_path, monkeypatch, capsys):
    from rescue.cli import main as rescue_main
    from rescue.rlvr import sweep

    plan = tmp_path / "plan.jsonl"
    plan.write_text(
        json.dumps(
            {"run": "a", "submission_id": "a-1", "log": str(tmp_path / "a.log"), "submitted": True}
        )
        + "\n"
    )
    ray = tmp_path / "my-ray"
    executable(
        ray, f"#!{sys.executable}\nimport sys\nprint('cannot reach', sys.argv[1:])\nsys.exit(1)\n"
    )
    slept = []
    monkeypatch.setattr(sweep.time, "sleep", slept.append)
    code = rescue_main(
        [
            "rlvr",
            "watch",
            "--plan",
            str(plan),
            "--address",
            "http://h:9",
            "--ray",
            str(ray),
            "--poll-s",
            "0.5",
            "--lost-after",
            "2",
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert (
        "LOST a: ray job status failed 2 times in a row: cannot reach ['job', 'status', '--address', 'http://h:9', 'a-1']"
        in out
    )
    assert slept.count(0.5) == 1  # between its two polls (the rest: subprocess' own waits)
    assert [s for s in slept if s >= 0.5] == [0.5]


def test_sweep_watch_0_submits_every_run_and_leaves_the_watching_to_q2(
    bin_dir, miles_dir, tmp_path
):
    state = tmp_path / "ray"
    stand_in_ray(bin_dir, state, {"rlvr-zero-cap512-seed1": ["PENDING"]})
    result = launch(
        "rlvr_sweep.sh",
        bin_dir,
        miles_dir,
        timeout=120,
        OUTPUT_DIR=str(tmp_path / "runs"),
        RAY_STANDIN=str(state),
        ARMS="zero",
        SEEDS="1",
        CAP="512",
        DUMP_STEPS="all",
        CKPT_KEEP="0",
        SWEEP_DIR=str(tmp_path / "sweep"),
        SWEEP_WATCH="0",
    )
    assert result.returncode == 0, result.stderr
    calls = [json.loads(x) for x in (state / "calls.jsonl").read_text().splitlines()]
    assert any(c[:2] == ["job", "submit"] for c in calls)
    assert not any(c[:2] == ["job", "status"] for c in calls)  # nobody watched
    assert len(read_plan(tmp_path / "sweep" / "plan.jsonl")) == 1
    assert "rescue rlvr watch --plan" in result.stderr + result.stdout


def test_the_watcher_writes_runs_ended_for_rescue_status(tmp_path, monkeypatch):
    progress = tmp_path / "p.json"
    monkeypatch.setenv("RESCUE_STAGE_PROGRESS", str(progress))
    runs = [Run("a", "a-1", str(tmp_path / "a.log")), Run("b", "b-1", str(tmp_path / "b.log"))]
    w, _, _ = watcher_for(
        runs,
        {
            "a-1": [(0, "Job 'a-1' succeeded")],
            "b-1": [status("b-1", "RUNNING"), (0, "Job 'b-1' succeeded")],
        },
    )
    assert w.watch() == 0
    got = json.loads(progress.read_text())
    assert got["done"] == 2 and got["total"] == 2 and got["unit"] == "runs"
    assert "2 done" in got["detail"]
