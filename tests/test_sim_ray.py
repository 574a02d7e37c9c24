"""``rescue sim --ray``: the arm-seed grid as Ray tasks gives the local run's files, byte for byte.

The test starts its own Ray head on a free port of 127.0.0.1, in its own temp dir and
process group, and stops exactly that process group afterwards; it never connects to,
nor stops, a Ray it did not start.
"""

import json
import sys
from pathlib import Path

import pytest
from ray_head import local_ray_head

from rescue import cli

pytest.importorskip("ray")

ARGS = ["--arms", "drop,pace,protect:0.5,mask", "--steps", "5", "--seeds", "2", "--no-wandb",
        "--no-plots", "--no-progress", "--groups-per-step", "4", "--concurrency", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def ray_head():
    with local_ray_head(num_cpus=2, prefix="rsim") as address:
        yield address


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
