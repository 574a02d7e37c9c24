"""``rescue sim --ray``: the arm-seed grid as Ray tasks gives the local run's files, byte for byte.

The test starts its own Ray head on a free port of 127.0.0.1, in its own temp dir and
process group, and stops exactly that process group afterwards; it never connects to,
nor stops, a Ray it did not start.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rescue import cli

pytest.importorskip("ray")

ARGS = ["--arms", "drop,pace,protect:0.5,mask", "--steps", "5", "--seeds", "2", "--no-wandb",
        "--no-plots", "--no-progress", "--groups-per-step", "4", "--concurrency", "8"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="rsim", dir="/tmp")  # short: Ray's socket paths are bounded
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", f"--temp-dir={tmp}", "--node-ip-address=127.0.0.1",
         "--disable-usage-stats", "--block"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    # Ray >= 2.5x turns token authentication on for `ray start`; the head and this driver
    # run without it (the head is local to the test)
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


def files(out: Path) -> dict[str, bytes]:
    paths = [*sorted((out / "census").glob("*.jsonl")), out / "runs.json", out / "summary.md"]
    return {p.name: p.read_bytes() for p in paths}


def test_the_grid_on_ray_gives_the_local_runs_files_byte_for_byte(ray_head, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert cli.main(["sim", "--out", str(local), "--workers", "1", *ARGS]) == 0
    assert cli.main(["sim", "--out", str(remote), "--ray", ray_head, *ARGS]) == 0
    a, b = files(local), files(remote)
    assert len(a) == 4 * 2 + 2 and a == b


def test_without_ray_installed_the_flag_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert cli.main(["sim", "--out", str(tmp_path), "--ray", "auto", *ARGS]) == 2
    assert "pip install 'rescue[ray]'" in capsys.readouterr().err


MAP_GRID = """
title = "tiny"
base = "budget-three-outcome"
seeds = 3
[config]
subsidy = true
groups-per-step = 4
concurrency = 4
[[axis]]
setting = "lr"
values = [0.1, 0.3]
[[axis]]
setting = "steps"
values = [8, 16]
"""


def test_the_map_on_ray_gives_the_local_maps_cells(ray_head, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(MAP_GRID)
    cells = []
    for where, how in (("local", ["--workers", "1"]), ("ray", ["--ray", ray_head])):
        out = tmp_path / where
        argv = ["sim", "map", "--grid", str(grid), "--out", str(out), "--no-plots", "--no-progress"]
        assert cli.main([*argv, *how]) == 0
        cells.append(json.loads((out / "map.json").read_text())["cells"])
    assert len(cells[0]) == 4 and cells[0] == cells[1]
