"""A run's Ray job as Ray's job server records it, not as ``ray job submit`` exits.

``ray job submit`` (without ``--no-wait``) follows the driver's log and exits 1 only when the
job FAILED: when the log stream ends first (the job server closes it when its websocket to
the job's agent closes), it prints the job's status, ``RUNNING`` or ``PENDING``, and exits 0 (``submit`` in Ray's
``dashboard/modules/job/cli.py``; 2.40 to 2.60 alike). Here the tail's exit is only the
cue to ask the job server; the job has ended when the server says so, and its status and
message are the run's. The driver's whole log as the server kept it is written
to the run folder (``driver.log``) beside the tail's (``job.log``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

#: The job server's statuses after which a job runs no more (``ray.job_submission.JobStatus``).
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class Job:
    """The job ``submission_id`` on the job server at ``dashboard``, followed by ``tail`` (the
    ``ray job submit`` process). ``client``: a ``JobSubmissionClient`` (made on first use)."""

    def __init__(
        self, dashboard: str, submission_id: str, tail: subprocess.Popen, client: Any = None,
    ) -> None:  # fmt: skip
        self.dashboard = dashboard
        self.submission_id = submission_id
        self.tail = tail
        self._client = client
        self.tail_ended_early = False
        #: the server's (status, message) once it has said the job ended
        self.final: tuple[str, str] | None = None

    def client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.dashboard)
        return self._client

    def info(self) -> tuple[str, str]:
        """The job's status and the server's message about it; ``("UNKNOWN", why)`` when the
        server cannot be asked."""
        try:
            info = self.client().get_job_info(self.submission_id)
        except Exception as e:  # the server down or the job unknown: said, never guessed
            return "UNKNOWN", f"the job server at {self.dashboard} did not answer: {e}"
        status = getattr(info.status, "value", info.status)
        return str(status), info.message or ""

    def ended(self) -> bool:
        """Whether the job has ended: asked of the server once the tail has exited, and not
        again once it said so."""
        if self.final is not None:
            return True
        if self.tail.poll() is None:
            return False
        status, message = self.info()
        if status in TERMINAL:
            self.final = status, message
            return True
        if not self.tail_ended_early:
            self.tail_ended_early = True
            print(f"rehearsal: {self.submission_id}: `ray job submit` stopped following the "
                  f"log (exit {self.tail.returncode}) while the job is {status}; following "
                  "its status on the job server", flush=True)  # fmt: skip
        return False

    def outcome(self) -> str:
        """The run's status: ``SUCCEEDED``, or the server's status, message and the tail's
        exit (``FAILED: ... (ray job submit exit 1)``)."""
        status, message = self.final or self.info()
        if status == "SUCCEEDED":
            return status
        rc = self.tail.poll()
        return f"{status}{f': {message}' if message else ''} (ray job submit exit {rc})"

    def keep_log(self, path: Path) -> None:
        """Write the driver's log as the job server kept it to ``path``, or say why not."""
        try:
            path.write_text(self.client().get_job_logs(self.submission_id))
        except Exception as e:
            print(f"rehearsal: {self.submission_id}: the job server at {self.dashboard} gave "
                  f"no driver log ({e}); {path.name} not written", flush=True)  # fmt: skip
