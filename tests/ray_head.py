"""A Ray head a test starts and stops itself.

``local_ray_head(num_cpus, prefix)`` starts ``ray start --head --block`` on a free port of
127.0.0.1, in a temp dir of its own (short: Ray's socket paths are bounded) and a process
group of its own, waits up to 120 s for its port, and yields ``"127.0.0.1:<port>"``;
afterwards it stops exactly that process group (SIGINT, then SIGKILL after 60 s) and removes
the temp dir. It never connects to, nor stops, a Ray it did not start. Ray >= 2.5x turns
token authentication on for ``ray start``; a local test cluster goes without it, the head
and the test's driver both (``RAY_AUTH_MODE=disabled`` in this process meanwhile, as the
Ray docs say for local development).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The head's environment beside the test's: no usage stats, no token authentication.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_ray_head(num_cpus: int, prefix: str) -> Iterator[str]:
    """The head's address while it runs (module docstring)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}",
         "--include-dashboard=false", f"--temp-dir={tmp}", "--node-ip-address=127.0.0.1",
         "--disable-usage-stats", "--block"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, **RAY_ENV},
    )  # fmt: skip
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the test's Ray head did not start (exit {proc.poll()})")
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # the head and the workers it started, nothing else
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth
