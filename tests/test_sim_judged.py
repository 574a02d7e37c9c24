"""The judge on the simulator, in cases whose answer is known before the runs.

- No learning (lr = 0): every arm generates the same episodes from the same seed (the
  policy never moves, and the arms draw nothing at random of their own), so the one b
  every arm is judged on is the same number in every arm, step by step, and a behaviour
  difference between arms can only come from what an arm keeps, never from what it does.
- Two outcomes: every survivor of the survivor-baseline arm scored 1, so its advantages
  and its update are exactly 0, and b is 1 − the trained cap-hit rate.
"""

import numpy as np
import pytest

from rescue.judge.evaluation import evaluate
from rescue.judge.predictions import BY_ID
from rescue.judge.stats import (
    AS_PREDICTED,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    NOT_JUDGEABLE,
    OPPOSITE,
    t_interval,
)
from rescue.judge.windows import whole
from rescue.sim import scenario as sc
from rescue.sim.arms import parse_arms
from rescue.sim.runner import run_arms
from rescue.sim.summary import cohort

C = "rollout/census/"


def runs(scenario: str, arms: str, seeds: int, **settings):
    cfg = sc.preset(scenario).sim_config(**settings)
    return cohort(run_arms(cfg, parse_arms(arms), list(range(seeds)), progress=False))


def check(result, start):
    return next(c for c in result.checks if c.name.startswith(start))


@pytest.fixture(scope="module")
def frozen_budget():
    """budget-three-outcome without learning: zero, mask and matched see the same batches."""
    return runs("budget-three-outcome", "zero,mask,matched", 4, lr=0.0, steps=60, groups_per_step=8)


def test_without_learning_b_is_the_same_number_for_every_arm(frozen_budget):
    for s in range(4):
        zero, mask = frozen_budget["zero"][s], frozen_budget["mask"][s]
        assert np.array_equal(zero.column(C + "b_all"), mask.column(C + "b_all"))
        # What the old axes read differs although the batches are the same: the masked
        # arm's baseline paid to the masked rollouts, and the unmasked rollouts' mean.
        assert not np.allclose(mask.column(C + "b_realized"), zero.column(C + "b_realized"))


def test_without_learning_p3_reads_no_trend_against_a_b_that_does_not_move(frozen_budget):
    """Without learning b stays where it started: its prior value varies by its own noise
    alone, and a slope against it would be shrunk to nothing whatever the truth, so the
    trend is not judged (the reason says why); the level at matched b, on the same batches
    in both arms, differs by exactly 0."""
    [r] = evaluate([BY_ID["P3"]], frozen_budget)
    c = check(r, "cap-hit trend against b at matched b, mask − zero")
    assert c.verdict in (NOT_JUDGEABLE, INCONCLUSIVE) and c.verdict != AS_PREDICTED
    assert any("moved too little" in n for n in c.notes) or "moved too little" in c.reason
    level = check(r, "cap-hit rate at matched b, mask − zero")
    assert level.estimate.exact and level.estimate.value == 0.0
    assert r.verdict not in (AS_PREDICTED, OPPOSITE)


@pytest.fixture(scope="module")
def frozen_stale():
    """fast-thorough without learning: drop and never-drop generate the same rollouts; drop
    trains only those that arrive in time, which are the short ones."""
    return runs("fast-thorough", "drop,never-drop", 5, lr=0.0)


def test_without_learning_drop_and_never_drop_generate_the_same_turns(frozen_stale):
    """The same policy generates both arms' rollouts: every generated rollout shows no
    difference in the turns of successes (the interval holds 0), while the trained ones of
    drop, its survivors, are shorter by about 13 turns in every seed (its late successes
    are the ones dropped): the bias the generated view removes."""
    drop, nd = frozen_stale["drop"], frozen_stale["never-drop"]
    gen = whole("turns_solved", ("rollout/census/generated/",))
    d = t_interval([np.subtract(*gen(drop[s], nd[s])) for s in nd])
    assert d.lo < 0 < d.hi and abs(d.value) < 0.2
    trained = whole("turns_solved", ("rollout/census/",))
    assert all(a < b - 10 for a, b in (trained(drop[s], nd[s]) for s in nd))


def test_without_learning_p5_is_not_as_predicted_on_every_generated_rollout(frozen_stale):
    [r] = evaluate([BY_ID["P5"]], frozen_stale)
    for name in ("turns of successes over the run", "trend of the turns of successes"):
        c = check(r, name)
        assert c.estimate.lo < 0 < c.estimate.hi and c.verdict not in (AS_PREDICTED, OPPOSITE)
    for name in ("turns of failures (submitted or capped) over the run", "trend of the turns of f"):
        f = check(r, name)  # 5 turns by construction, in both arms
        assert f.estimate.exact and f.estimate.value == 0.0 and f.verdict == NO_DIFFERENCE
    assert r.verdict != AS_PREDICTED


def test_two_outcome_control_on_the_simulator():
    arms = runs("two-outcome", "zero,mask,survivor", 3, steps=60, groups_per_step=8)
    for run in arms["zero"].values():  # two outcomes: b is 1 − the trained cap-hit rate
        b, cap = run.column(C + "b_all"), run.column(C + "cap_hit_rate")
        assert np.allclose(b + cap, 1.0)
        assert np.nansum(run.column(C + "generated/outcome/submitted_failure")) == 0
    results = {
        r.prediction.id: r for r in evaluate([BY_ID[p] for p in ("P3", "P4", "control")], arms)
    }
    assert results["P3"].verdict is None and results["P4"].verdict is None
    collapse = check(results["control"], "update norm, survivor / zero")
    assert collapse.estimate.exact and collapse.estimate.value == 0.0
    assert collapse.verdict == AS_PREDICTED
    # Two outcomes: the exact cap-hit rate is 1 − J, a slope of −1 against b in every arm,
    # and b moves by a few hundredths over these 60 steps, less than its own noise. Read off
    # the same rollouts the two arms' slopes were both −1 by construction (b + cap = 1 row
    # by row), which judged the noise, not the policy; against the prior b nothing can be
    # read here, and the check says why instead of a verdict.
    drift = check(results["control"], "cap-hit trend against b at matched b")
    assert drift.verdict == NOT_JUDGEABLE and "moved too little" in drift.reason
    assert results["control"].verdict == NOT_JUDGEABLE
