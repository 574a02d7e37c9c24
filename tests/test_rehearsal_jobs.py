"""A rehearsal run's job has ended when Ray's job server says so, not when ``ray job submit``
exits: that command exits 0 whenever its log stream ends and the job has not FAILED, a job
still RUNNING included (``submit`` in Ray's ``dashboard/modules/job/cli.py``)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from rescue.rehearsal.miles.jobs import Job


class JobServer:
    """A stand-in for ``ray.job_submission.JobSubmissionClient``: ``get_job_info`` answers the
    statuses of ``script`` in turn (the last one from then on) with the job's ``message``, and
    raises like the real client (``RuntimeError``) when the server is down (``None``)."""

    def __init__(self, *script: str | None, message: str | None = None, logs: str = "") -> None:
        self.script = list(script)
        self.message = message
        self.logs = logs
        self.asked = 0

    def get_job_info(self, job_id: str) -> SimpleNamespace:
        self.asked += 1
        status = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if status is None:
            raise RuntimeError("Failed to connect to Ray at address: http://127.0.0.1:8265.")
        return SimpleNamespace(status=status, message=self.message)

    def get_job_logs(self, job_id: str) -> str:
        if not self.logs:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return self.logs


def ended_tail(rc: int) -> subprocess.Popen:
    """A ``ray job submit`` that has stopped following the log with exit ``rc``."""
    tail = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({rc})"])
    tail.wait()
    return tail


def test_a_tail_that_ends_while_the_job_runs_is_not_the_job_ending(capsys):
    server = JobServer("RUNNING", "RUNNING", "SUCCEEDED", logs="step 1\nstep 2\n")
    job = Job("http://127.0.0.1:8265", "rescue-rehearsal-1-zero-seed1", ended_tail(0), server)
    assert not job.ended()
    assert not job.ended()
    said = capsys.readouterr().out
    assert said.count("stopped following the log (exit 0) while the job is RUNNING") == 1
    assert job.ended()
    asked = server.asked
    assert job.ended() and job.outcome() == "SUCCEEDED"
    assert server.asked == asked  # the server's word that it ended is kept, not asked again


def test_a_running_tail_is_not_asked_about():
    server = JobServer("SUCCEEDED")
    tail = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not Job("http://127.0.0.1:8265", "x", tail, server).ended()
        assert server.asked == 0
    finally:
        tail.kill()
        tail.wait()


def test_the_outcome_is_the_servers_status_and_message():
    failed = JobServer("FAILED", message="Job entrypoint command failed with exit code 1")
    job = Job("http://127.0.0.1:8265", "x", ended_tail(1), failed)
    assert job.ended()
    assert job.outcome() == (
        "FAILED: Job entrypoint command failed with exit code 1 (ray job submit exit 1)"
    )
    stopped = Job("http://127.0.0.1:8265", "x", ended_tail(0), JobServer("STOPPED"))
    assert stopped.ended() and stopped.outcome() == "STOPPED (ray job submit exit 0)"


def test_a_server_that_does_not_answer_is_never_success(capsys):
    job = Job("http://127.0.0.1:8265", "x", ended_tail(0), JobServer(None))
    assert not job.ended()  # followed until the run's timeout, not taken as ended
    outcome = job.outcome()
    assert outcome.startswith("UNKNOWN: the job server at http://127.0.0.1:8265 did not answer")
    assert outcome.endswith("(ray job submit exit 0)")


def test_the_driver_log_is_kept_or_says_why_not(tmp_path, capsys):
    kept = tmp_path / "driver.log"
    Job("http://h:1", "x", ended_tail(0), JobServer("SUCCEEDED", logs="trained\n")).keep_log(kept)
    assert kept.read_text() == "trained\n"
    missing = tmp_path / "missing" / "driver.log"
    Job("http://h:1", "x", ended_tail(0), JobServer("SUCCEEDED")).keep_log(missing)
    said = capsys.readouterr().out
    assert "gave no driver log" in said and "does not exist" in said and not missing.exists()
