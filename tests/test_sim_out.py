"""`rescue sim` as the docs write it (docs/simulator.md): settings that cannot run are
refused before the first step, the docs' example runs, each run without --out has its own
folder, and what an earlier run wrote in a folder is replaced, never mixed into the new one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rescue import cli
from rescue.errors import InputError
from rescue.sim import SimConfig, runner
from rescue.sim import run as sim_run
from rescue.sim.arms import parse_arms
from rescue.sim.cli import DEFAULT_OUT, default_out
from rescue.sim.config import DEFAULT_BUFFER_CAPACITY

QUIET = ["--seeds", "1", "--workers", "1", "--no-wandb", "--no-plots", "--no-progress"]
#: Small runs; a scenario's own --max-turns is kept (its strategy table needs it).
SMALL = [
    "--steps",
    "3",
    "--groups-per-step",
    "4",
    "--group-size",
    "2",
    "--concurrency",
    "4",
    *QUIET,
]
TINY = [*SMALL, "--max-turns", "8"]


def test_the_default_buffer_holds_the_pace_window():
    assert SimConfig().capacity == DEFAULT_BUFFER_CAPACITY == 32  # (K + 1) x B = 32: unchanged
    assert SimConfig(max_staleness=2).capacity == 48  # the docs' example: W = 3 x 16
    assert SimConfig(max_staleness=2, pace_window=20).capacity == 32
    assert SimConfig(max_staleness=2, buffer_capacity=40).capacity == 40  # as given
    with pytest.raises(InputError, match=r"--buffer-capacity=-1; allowed: an integer >= 0"):
        SimConfig(buffer_capacity=-1)


def test_the_docs_example_runs_as_written(tmp_path):
    """`rescue sim --arms drop,never-drop,protect:0.5,pace --max-staleness 2 --out runs/mine`,
    shortened (steps, group size) but with the defaults that made it fail: B = 16, capacity."""
    out = tmp_path / "mine"
    argv = ["sim", "--arms", "drop,never-drop,protect:0.5,pace", "--max-staleness", "2",
            "--out", str(out), "--steps", "2", "--group-size", "2", "--max-turns", "6", *QUIET]  # fmt: skip
    assert cli.main(argv) == 0
    names = {p.name for p in (out / "census").iterdir()}
    assert names == {f"{a}-seed0.jsonl" for a in ("drop", "never-drop", "protect-a0.5", "pace")}


def test_a_setting_an_arm_cannot_run_is_refused_before_any_step(tmp_path, monkeypatch, capsys):
    steps = []
    real = sim_run.Simulation.run

    def counted(self, *a, **k):
        steps.append(self.arm.label)
        return real(self, *a, **k)

    monkeypatch.setattr(sim_run.Simulation, "run", counted)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.md").write_text("an earlier run's summary\n")
    argv = ["sim", "--arms", "drop,never-drop,pace", "--max-staleness", "2", "--buffer-capacity",
            "40", "--out", str(out), "--steps", "2", *QUIET]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "rescue sim: error: arm pace: --buffer-capacity=40 is below the pace window 48 "
        "(--pace-window, default (K + 1) x --groups-per-step with K = --max-staleness = 2); "
        "allowed: 0 (the default: a buffer sized for the window) or at least 48"
    )
    assert steps == []  # drop and never-drop did not run first
    assert (out / "summary.md").read_text() == "an earlier run's summary\n"  # nothing removed


def test_run_arms_refuses_before_the_first_step_too(monkeypatch):
    steps = []
    monkeypatch.setattr(sim_run.Simulation, "run", lambda self, **k: steps.append(1) or [])
    cfg = SimConfig(steps=2, max_staleness=2, buffer_capacity=40)
    with pytest.raises(InputError, match="arm pace"):
        runner.run_arms(cfg, parse_arms("drop,pace"), [0], progress=False)
    assert steps == []


def namespace(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"scenario": None, "scenario_file": None, **kw})


def test_each_run_without_out_has_its_own_folder():
    assert default_out(namespace(scenario="all")) == Path(DEFAULT_OUT) == Path("runs/sim")
    assert default_out(namespace(scenario="fast-thorough")) == Path("runs/sim-fast-thorough")
    assert default_out(namespace(scenario="a, b")) == Path("runs/sim-a+b")
    assert default_out(namespace(scenario_file="x/mine.toml")) == Path("runs/sim-mine")
    assert default_out(namespace()) == Path("runs/sim-default")


def test_a_scenario_without_out_leaves_the_demos_folder_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    demo = tmp_path / "runs" / "sim"
    demo.mkdir(parents=True)
    (demo / "summary.md").write_text("the demo's index\n")
    assert cli.main(["sim", "--scenario", "fast-thorough", "--arms", "drop", *SMALL]) == 0
    assert (demo / "summary.md").read_text() == "the demo's index\n"
    assert (tmp_path / "runs" / "sim-fast-thorough" / "census" / "drop-seed0.jsonl").is_file()


def test_an_earlier_run_in_the_folder_is_replaced_not_mixed_in(tmp_path):
    out = tmp_path / "out"
    assert cli.main(["sim", "--out", str(out), "--arms", "drop,zero", *TINY]) == 0
    (out / "old.png").write_text("a plot of the earlier run")
    (out / "wandb").mkdir()
    (out / "plots").mkdir()
    (out / "plots" / "p1.png").write_text("a figure of the earlier run's judgement")
    (out / "notes.txt").write_text("mine")
    assert cli.main(["sim", "--out", str(out), "--arms", "pace", *TINY]) == 0
    assert {p.name for p in (out / "census").iterdir()} == {"pace-seed0.jsonl"}
    assert [r["arm"] for r in json.loads((out / "runs.json").read_text())] == ["pace"]
    assert not (out / "old.png").exists() and not (out / "wandb").exists()
    assert not (out / "plots").exists()  # --no-plots: the earlier figures are gone too
    assert (out / "notes.txt").read_text() == "mine"  # not written by rescue sim: kept


def test_an_earlier_runs_scenario_folders_are_replaced(tmp_path):
    out = tmp_path / "out"
    old = out / "swe-like"
    (old / "census").mkdir(parents=True)
    (old / "census" / "zero-seed0.jsonl").write_text("{}\n")
    (old / "runs.json").write_text("[]\n")
    keep = out / "mine"
    keep.mkdir()
    (keep / "data.csv").write_text("x\n")
    argv = ["sim", "--out", str(out), "--scenario", "fast-thorough,two-outcome", "--arms", "drop"]
    assert cli.main([*argv, *SMALL]) == 0
    assert not old.exists()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "fast-thorough",
        "mine",
        "two-outcome",
    ]
