"""``rescue sim map``: P3 over a grid declared in a file, the exact subsidy beside it.

- The grid file: every cell a valid configuration, bad input one line naming the file and
  what is allowed; the shipped default grid loads and says what it runs.
- What a cell reads is what the judge reads: a run's first n steps are a run of n steps
  (every key but the launch view, written at a run's end), and P3 judged on the kept keys
  is P3 judged on every key.
- Known answer: without learning (lr = 0) the mask and zero arms are the same runs and J
  does not move: no exact trend of P(cap) against J exists, the judged one is not judged
  (b moves by its noise alone; the note says why), and the subsidy ratio is the exact
  terms' at the initial policy.
- The output is written whole or not at all: a failed map leaves the earlier one.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from rescue import cli
from rescue.errors import InputError
from rescue.judge.evaluation import evaluate
from rescue.judge.predictions import BY_ID
from rescue.sim import drift_map, map_report
from rescue.sim import grid as gd
from rescue.sim import scenario as sc
from rescue.sim.arms import ArmSpec
from rescue.sim.run import run_one
from rescue.sim.subsidy import terms
from rescue.sim.summary import cohort

SMALL = """
title = "small"
base = "budget-three-outcome"
seeds = 3
rule = "the largest subsidy ratio at 12 steps"
[placement]
steps = 12
min-ratio = 0.0
min-b = 0.0
[config]
subsidy = true
groups-per-step = 4
concurrency = 4
[[axis]]
setting = "lr"
values = [0.0, 0.3]
[[axis]]
setting = "max-turns"
values = [8, 12]
[[axis]]
setting = "steps"
values = [12, 24]
"""


def small(tmp_path, text: str = SMALL):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "change, named",
    [
        ('title = "small"', "unknown key"),  # replaced by a bad top key below
        ("values = [8, 12]", "max-turns"),
        ("seeds = 3", "seeds"),
        ('base = "budget-three-outcome"', "base"),
        ("min-b = 0.0", "[placement]"),
        ('setting = "lr"', "is not a setting"),
    ],
)
def test_a_bad_grid_is_one_error_naming_the_file_and_what_is_allowed(tmp_path, change, named):
    bad = {
        'title = "small"': 'title = "small"\ncolour = "red"',
        "values = [8, 12]": "values = [8, 0]",
        "seeds = 3": "seeds = 0",
        'base = "budget-three-outcome"': 'base = "nowhere"',
        "min-b = 0.0": "",
        'setting = "lr"': 'setting = "learning-rate"',
    }[change]
    path = small(tmp_path, SMALL.replace(change, bad, 1))
    with pytest.raises(InputError) as e:
        gd.load(path)
    assert str(path) in str(e.value) and named in str(e.value)


def test_the_default_grid_declares_its_axes_seeds_and_rule():
    grid = gd.load(None)
    assert [a.setting for a in grid.axes] == ["difficulty", "max_turns", "lr", "steps"]
    assert len(grid.cells()) == 54 and len(grid.seeds) >= 5
    assert [a.label for a in grid.arms] == ["zero", "mask", "matched", "step-control"]
    assert grid.placement is not None and "before the map ran" in grid.rule
    assert all(c.simulated.steps == 600 and c.config.subsidy for c in grid.cells())


def test_a_runs_first_steps_are_a_shorter_run(tmp_path):
    cfg = sc.preset("budget-three-outcome").sim_config(groups_per_step=4, concurrency=4,
                                                       subsidy=True)  # fmt: skip
    for arm in ("mask", "matched"):
        short = run_one(cfg.replace(steps=10), ArmSpec(arm), 4).steps
        long = run_one(cfg.replace(steps=25), ArmSpec(arm), 4).steps[:10]
        for a, b in zip(short, long, strict=True):
            keys = {k for k in a.keys() | b.keys() if not k.startswith("sim/launched/")}
            assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}


def test_p3_on_the_kept_keys_is_p3_on_every_key():
    cfg = sc.preset("budget-three-outcome").sim_config(groups_per_step=4, concurrency=4,
                                                       steps=40, subsidy=True)  # fmt: skip
    full, kept = {}, {}
    for arm in ("zero", "mask", "matched"):
        full[arm] = [run_one(cfg, ArmSpec(arm), s) for s in range(3)]
        kept[arm] = [run_one(cfg, ArmSpec(arm), s, keep=drift_map.KEEP) for s in range(3)]
    assert len(kept["mask"][0].steps[5]) < len(full["mask"][0].steps[5]) / 3
    (a,) = evaluate([BY_ID["P3"]], cohort(full))
    (b,) = evaluate([BY_ID["P3"]], cohort(kept))
    assert a.verdict == b.verdict
    assert [c.estimate for c in a.checks] == [c.estimate for c in b.checks]


def test_the_small_map_end_to_end_and_its_known_answer(tmp_path, capsys):
    out = tmp_path / "map"
    argv = ["sim", "map", "--grid", str(small(tmp_path)), "--out", str(out), "--workers", "2",
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert (out / "grid.toml").read_text() == SMALL
    data = json.loads((out / "map.json").read_text())
    assert len(data["cells"]) == 8 and data["grid"]["seeds"] == [0, 1, 2]
    md = (out / "map.md").read_text()
    assert "| lr | max-turns | steps |" in md and "The placement rule" in md
    assert (out / "map.png").stat().st_size > 10_000
    grid = gd.load(out / "grid.toml")
    frozen = 0
    for cell in data["cells"]:
        v = cell["values"]
        if v["lr"] == "0":  # no learning: mask and zero are one run, the effect exactly 0
            # as it is: the exact J does not move, so P(cap) has no trend against it ...
            assert cell["exact_difference"] is None or np.isnan(cell["exact_difference"])
            # ... and as judged: b moves by its own noise alone, so no trend is read, with
            # the reason (or b never reached the threshold, or not for long enough)
            assert cell["alone"] == "not judgeable"
            assert any(why in cell["note"] for why in ("moved too little", "never exceeded",
                                                       "share no range"))  # fmt: skip
            cfg = next(c.config for c in grid.cells() if gd.values_of(grid, c) == v)
            init = terms(np.array(cfg.initial_logits)[None], cfg)
            assert cell["subsidy_ratio"] == pytest.approx(init["term"][0] / abs(init["task"][0]))
            frozen += 1
    assert frozen == 4
    chosen = data["placement"]["chosen"]
    assert chosen is not None and chosen["steps"] == "12"
    best = max((c for c in data["cells"] if c["values"]["steps"] == "12"),
               key=lambda c: c["subsidy_ratio"])  # fmt: skip
    assert chosen == best["values"]
    assert "P3 under the rule" in capsys.readouterr().out


def test_a_failed_map_leaves_the_earlier_one(tmp_path, monkeypatch):
    out = tmp_path / "map"
    out.mkdir()
    (out / "map.md").write_text("the earlier map")

    def broken(*args, **kwargs):
        raise RuntimeError("the heat map failed")

    monkeypatch.setattr(map_report, "markdown", broken)
    grid = gd.load(small(tmp_path))
    with pytest.raises(RuntimeError):
        map_report.write(out, grid, [], None, {}, plots=False)
    assert (out / "map.md").read_text() == "the earlier map"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "map"]


def test_a_missing_grid_is_one_line(tmp_path, capsys):
    assert cli.main(["sim", "map", "--grid", str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--grid" in err


def test_describe_prints_the_grid_and_runs_nothing(tmp_path, capsys):
    assert cli.main(["sim", "map", "--grid", str(small(tmp_path)), "--describe"]) == 0
    out = capsys.readouterr().out
    assert "8 cells × 3 arms" in out and "36 runs simulated" in out
    assert not (tmp_path / "runs").exists()


def test_cells_of_the_steps_axis_share_their_simulated_runs(tmp_path):
    grid = gd.load(small(tmp_path))
    cells = grid.cells()
    assert len({c.simulated for c in cells}) == 4
    assert {c.config.steps for c in cells} == {12, 24}
    assert all(replace(c.config, steps=24) == c.simulated for c in cells)
