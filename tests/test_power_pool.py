"""``rescue power``'s noise from simulated runs: the pool, its cache, the draws and P3's plants."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rescue.errors import InputError
from rescue.judge import power as pw
from rescue.judge.stats import AS_PREDICTED, NO_DIFFERENCE
from rescue.sim import power_pool


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "rescue" / "power"


def test_the_pool_is_simulated_once_then_read_from_the_cache(cache, monkeypatch):
    first = power_pool.pool("budget-three-outcome", "zero", 3, steps=25, progress=False)
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and [r.seed for r in first] == [0, 1, 2]
    from rescue.sim import runner

    def no_simulation(*a, **k):
        raise AssertionError("simulated again although the cache holds the pool")

    monkeypatch.setattr(runner, "run_arms", no_simulation)
    again = power_pool.pool("budget-three-outcome", "zero", 3, steps=25, progress=False)
    assert [r.rows for r in again] == [r.rows for r in first]
    # another setting is another file, simulated
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent.parent))
    power_pool.pool("budget-three-outcome", "zero", 3, steps=26, progress=False)
    assert len(list(cache.glob("*.json"))) == 2
    rows = json.loads(files[0].read_text())[0]["rows"]
    assert all(k.startswith(power_pool.KEEP) for row in rows for k in row)
    assert any("rollout/census/b_all" in row for row in rows)


def test_the_regime_of_a_reports_arms():
    assert power_pool.regime(["zero", "mask", "turn"]) == "budget"
    assert power_pool.regime(["drop", "never-drop", "protect:0.5"]) == "stale"
    assert power_pool.regime(["zero", "drop"]) == "stale"


def test_every_registered_arm_has_its_registry_regime_and_q2s_arms_are_budget_arms():
    from rescue import arms
    from rescue.sim.power_cli import question_arms

    for name in arms.names():
        assert power_pool.regime([name]) == arms.ARMS[name].regime, name
    assert power_pool.regime(question_arms("q2")) == "budget"  # step-control among them
    assert "step-control" in question_arms("q2")


def test_a_replicate_draws_distinct_runs_relabelled_as_each_arm(cache):
    pool = power_pool.pool("budget-three-outcome", "zero", 8, steps=20, progress=False)
    draw = pw.pool_null(pool)
    runs = draw(["zero", "mask"], np.random.default_rng(0), 3)
    assert [(r.label, r.seed) for r in runs] == [
        ("zero", 0), ("zero", 1), ("zero", 2), ("mask", 0), ("mask", 1), ("mask", 2)
    ]  # fmt: skip
    ids = [id(r.rows) for r in runs]
    assert len(set(ids)) == 6  # six different runs of the pool
    with pytest.raises(InputError, match="needs 9"):
        draw(["zero", "mask", "matched"], np.random.default_rng(0), 3)


def test_p3_planted_every_way_its_controls_can_go():
    """With the step-size control in the report, a drift the mask's direction carries (the
    matched control reproduces it) is P3 as predicted and a drift of step size (the
    step-size control reproduces it) a falsified P3; without it, the control clause reads
    the matched control, and the direction's drift is a falsified P3 (the plan's sentences
    as written)."""
    assert pw.PLANTS["P3 direction"].roles == ("mask", "matched")
    assert pw.truth("P3 direction", 1.0, step_control=True) == AS_PREDICTED
    assert pw.truth("P3 direction", 1.0, step_control=False) == NO_DIFFERENCE
    assert pw.truth("P3 step size", 1.0) == NO_DIFFERENCE
    assert pw.is_false("P3 step size", 1.0, AS_PREDICTED)
    both = ["zero", "mask", "matched", "step-control"]
    p = pw.power(both, seeds=(6,), effects=(3.0,), replicates=40, seed=1)
    assert {"P3", "P3 direction", "P3 step size"} <= set(p.predictions)
    assert p.decisive["P3 direction"][6][3.0][0] > 0.5  # the gate can say go on the mechanism
    assert p.false["P3 step size"][6][3.0][0] < 0.2  # chance claims, as below
    old = pw.power(["zero", "mask", "matched"], seeds=(6,), effects=(3.0,), replicates=40, seed=1)
    assert "P3 step size" not in old.predictions
    # read on the matched control, the mechanism's drift is P3 as predicted only by chance
    # (a claim of the two equal arms' difference, about 5%; below 0.2 in 40 replicates with
    # probability 0.999): the gate would say go on it no more often than with no effect
    assert old.false["P3 direction"][6][3.0][0] < 0.2
    assert old.decisive["P3 direction"][6][3.0][0] < p.decisive["P3 direction"][6][3.0][0]
    # without the matched arm there is nothing to plant the direction's way
    q = pw.power(["zero", "mask"], seeds=(3,), effects=(1.0,), replicates=3)
    assert "P3 direction" not in q.predictions


def test_seeds_needed_is_the_first_count_reaching_the_share():
    p = pw.Power(("zero", "mask"), 10, (3, 4, 5), (0.0, 1.0))
    p.decisive["P3"] = {3: {1.0: (0.5, 0.6)}, 4: {1.0: (0.79, 0.9)}, 5: {1.0: (0.85, 0.9)}}
    assert pw.seeds_needed(p, "P3", 1.0) == 5
    assert pw.seeds_needed(p, "P3", 1.0, share=0.5) == 3
    assert pw.seeds_needed(p, "P3", 1.0, share=0.9) is None
