"""The judge against the simulator's exact quantities: known answers on the same runs.

The simulator logs each step's exact P(cap) and J; ``rescue.judge.truth`` pairs every judged
per-run value those determine with its exact value, by its own arithmetic. On a cell where
the exact trend of the cap-hit rate against b is steep (easy tasks, an 8-turn cap), the
judged values must have the exact ones' sign and, on average, their size within the
attenuation the estimator states. The same-step b (the first P3 slope) fails this family:
that is the bug it exists for. The full cells run in ``bench/judge_truth.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from rescue.judge import quantities as qs
from rescue.judge import truth
from rescue.judge.stats import slope
from rescue.sim import scenario as sc
from rescue.sim.arms import parse_arms
from rescue.sim.runner import run_arms
from rescue.sim.summary import cohort

SEEDS = 3


@pytest.fixture(scope="module")
def easy():
    """Easy tasks under an 8-turn cap (the map's first cell of issue #41), 300 steps."""
    cfg = sc.preset("budget-three-outcome").sim_config(
        difficulty=((1, 0.5), (2, 0.5)), max_turns=8, lr=0.1, steps=300, subsidy=True
    )
    return cohort(run_arms(cfg, parse_arms("zero,mask"), list(range(SEEDS)), progress=False))


@pytest.fixture(scope="module")
def pairs(easy):
    return truth.fidelity(easy, "zero")


def _agreement(pairs, quantity):
    return {a.label: a for a in truth.summary(pairs) if a.quantity == quantity}


def test_every_run_has_the_truth_and_every_quantity_is_paired(easy, pairs):
    assert all(truth.has_truth(r) for runs in easy.values() for r in runs.values())
    assert {(p.quantity, p.label) for p in pairs} == {
        (q, arm) for q in truth.QUANTITIES for arm in ("zero", "mask")
    }
    assert all(not p.reason for p in pairs)


@pytest.mark.parametrize("quantity", ["cap_trend", "cap_drift"])
def test_the_judged_trend_has_the_exact_sign_and_its_size_within_the_stated_attenuation(
    pairs, quantity
):
    lo, hi = truth.ATTENUATION
    for label, a in _agreement(pairs, quantity).items():
        assert a.exact_mean > 0, (label, a)  # the exact trend here: P(cap) rises with J
        assert a.same_sign / a.runs >= 0.8, (label, a)
        assert lo <= a.ratio <= hi, (label, a)


@pytest.mark.parametrize(
    "quantity, quantity_judged", [("final_success", "success"), ("final_cap_hit", "cap_hit")]
)
def test_the_final_levels_are_the_exact_ones_within_their_sampling_error(
    easy, pairs, quantity, quantity_judged
):
    """Pooled over the final 60 steps (about 8,000 rollouts), a rate's binomial SE is about
    0.005; rollouts of a group share a task, which can double it; 4 such SEs allowed."""
    for p in (p for p in pairs if p.quantity == quantity):
        run = easy[p.label][p.seed]
        s = qs.series(run, quantity_judged)
        n = s.den[s.step >= qs.final_start(s.last_step)].sum()
        se = 2 * np.sqrt(p.exact * (1 - p.exact) / n)
        assert abs(p.judged - p.exact) <= 4 * se, p


def test_the_same_step_b_reads_the_opposite_sign_on_the_same_runs(easy, pairs):
    """The slope on the step's own b (written out here: both axes off the same rollouts)
    against the exact trend: most runs of the wrong sign, where the prior b has none."""
    exact = {(p.label, p.seed): p.exact for p in pairs if p.quantity == "cap_trend"}
    wrong = 0
    for label, runs in easy.items():
        for seed, run in runs.items():
            b = qs.series(run, "b").trailing(1)[1]
            cap = qs.series(run, "cap_hit").trailing(1, len(b) - 1)[1]
            sel = np.flatnonzero(np.nan_to_num(b, nan=-1) > qs.B_THRESHOLD)
            same_step = slope(b[sel], cap[sel]).value
            wrong += np.sign(same_step) != np.sign(exact[(label, seed)])
    assert wrong >= 0.8 * 2 * SEEDS
    judged = _agreement(pairs, "cap_trend")
    assert all(a.same_sign == a.runs for a in judged.values())


def test_the_differences_between_arms_are_paired_by_seed(pairs):
    judged, exact = truth.differences(pairs, "cap_trend", "mask", "zero")
    assert len(judged) == len(exact) == SEEDS
    by = {(p.label, p.seed): p for p in pairs if p.quantity == "cap_trend"}
    assert exact[0] == pytest.approx(by[("mask", 0)].exact - by[("zero", 0)].exact)
    assert np.mean(exact) > 0  # the mask's exact P(cap) rises faster with J than R = 0's
