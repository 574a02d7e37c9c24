"""The judge's intervals and verdict rules, against scipy and hand-computed values."""

import numpy as np
import pytest
from scipy import stats as sps

from rescue.judge.stats import (
    AS_PREDICTED,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    NOT_JUDGEABLE,
    OPPOSITE,
    Estimate,
    claim_p,
    combine,
    decide,
    paired,
    seed_sd,
    slope,
    t_interval,
    threshold_verdict,
    variance_ratio,
)


def test_t_interval_uses_n_minus_one_degrees_of_freedom():
    x = np.array([1.0, 2.0, 4.0])
    e = t_interval(x)
    half = sps.t.ppf(0.975, 2) * x.std(ddof=1) / np.sqrt(3)
    assert (e.value, e.n, e.dof) == (pytest.approx(7 / 3), 3, 2)
    assert e.lo == pytest.approx(7 / 3 - half) and e.hi == pytest.approx(7 / 3 + half)
    # 2 dof is 4.30, not the 2 of a normal approximation
    assert half / (x.std(ddof=1) / np.sqrt(3)) == pytest.approx(4.303, abs=1e-3)


def test_t_interval_ignores_nan_and_has_no_interval_for_one_value():
    e = t_interval([np.nan, 2.0])
    assert e.n == 1 and e.value == 2.0 and not e.finite


def test_paired_keeps_only_seeds_both_arms_have_a_finite_value_for():
    seeds, d = paired({0: 1.0, 1: 2.0, 2: np.nan, 3: 5.0}, {0: 0.5, 1: 1.0, 2: 1.0, 4: 9.0})
    assert seeds == [0, 1] and d.tolist() == [0.5, 1.0]


def test_seed_sd_needs_two_seeds():
    assert np.isnan(seed_sd({0: 1.0}))
    assert seed_sd({0: 1.0, 1: 3.0}) == pytest.approx(np.sqrt(2))


def test_slope_matches_linregress_with_n_minus_two_dof():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, 12)
    y = 2 * x + rng.normal(0, 0.1, 12)
    e = slope(x, y)
    fit = sps.linregress(x, y)
    assert e.value == pytest.approx(fit.slope) and e.dof == 10
    assert e.hi - e.value == pytest.approx(sps.t.ppf(0.975, 10) * fit.stderr)


def test_variance_ratio_interval_is_the_f_interval():
    x, y = np.array([1.0, 3.0, 5.0, 7.0]), np.array([1.0, 2.0, 3.0])
    e = variance_ratio(x, y)
    r = x.var(ddof=1) / y.var(ddof=1)
    assert e.value == pytest.approx(r)
    assert e.lo == pytest.approx(r / sps.f.ppf(0.975, 3, 2))
    assert e.hi == pytest.approx(r / sps.f.ppf(0.025, 3, 2))


def est(lo, hi, n=5):
    return Estimate((lo + hi) / 2, lo, hi, n, n - 1)


@pytest.mark.parametrize(
    "expects, lo, hi, margin, verdict",
    [
        ("higher", 0.1, 0.3, 1.0, AS_PREDICTED),
        ("higher", -0.3, -0.1, 1.0, OPPOSITE),
        ("higher", -0.1, 0.1, 0.5, NO_DIFFERENCE),
        ("higher", -0.1, 0.6, 0.5, INCONCLUSIVE),
        ("higher", -0.1, 0.1, float("nan"), INCONCLUSIVE),
        ("lower", -0.3, -0.1, 1.0, AS_PREDICTED),
        ("lower", 0.1, 0.3, 1.0, OPPOSITE),
        ("same", -0.1, 0.1, 0.2, AS_PREDICTED),
        ("same", 0.3, 0.5, 0.2, OPPOSITE),
        ("same", 0.1, 0.3, 0.2, INCONCLUSIVE),
        ("same", -0.1, 0.1, float("nan"), INCONCLUSIVE),
        ("not lower", -0.1, 0.5, 0.2, AS_PREDICTED),
        ("not lower", -0.5, -0.3, 0.2, OPPOSITE),
        ("not lower", -0.3, 0.1, 0.2, INCONCLUSIVE),
        ("lower by m", -0.5, -0.3, 0.2, AS_PREDICTED),
        ("lower by m", -0.1, 0.1, 0.2, OPPOSITE),
    ],
)
def test_decide_reads_the_interval_against_zero_and_the_margin(expects, lo, hi, margin, verdict):
    assert decide(est(lo, hi), expects, margin=margin)[0] == verdict


@pytest.mark.parametrize(
    "lo, hi, verdict",
    [
        (0.2, 0.4, AS_PREDICTED),
        (0.0, 0.09, OPPOSITE),
        (0.12, 0.3, INCONCLUSIVE),
        (0.05, 0.3, INCONCLUSIVE),
    ],
)
def test_threshold_rule_of_p7(lo, hi, verdict):
    assert decide(est(lo, hi), "at least", supports=0.2, falsifies=0.1)[0] == verdict


def test_cosine_rule_separates_aligned_isotropic_and_reversed():
    kw = {"margin": 0.1, "supports": 0.5}
    assert decide(est(0.6, 0.8), "cosine", **kw)[0] == AS_PREDICTED
    assert decide(est(-0.05, 0.05), "cosine", **kw)[0] == NO_DIFFERENCE
    assert decide(est(-0.6, -0.2), "cosine", **kw)[0] == OPPOSITE
    assert decide(est(0.2, 0.6), "cosine", **kw)[0] == INCONCLUSIVE


def test_too_few_replicates_decide_nothing_even_with_a_clear_interval():
    verdict, reason = decide(est(5.0, 6.0, n=2), "higher", margin=1.0)
    assert verdict == INCONCLUSIVE and "2 replicate(s)" in reason


def test_an_unknown_expectation_is_an_error_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: higher, lower"):
        decide(est(0, 1), "bigger")


def test_point_threshold_verdict():
    assert threshold_verdict(0.2, supports=0.2, falsifies=0.1) == AS_PREDICTED
    assert threshold_verdict(0.1, supports=0.2, falsifies=0.1) == INCONCLUSIVE
    assert threshold_verdict(0.0999, supports=0.2, falsifies=0.1) == OPPOSITE
    assert threshold_verdict(float("nan"), supports=0.2, falsifies=0.1) == INCONCLUSIVE


def test_combine_any_falsifies_on_one_check_all_needs_every_one():
    assert combine([AS_PREDICTED, AS_PREDICTED]) == AS_PREDICTED
    assert combine([AS_PREDICTED, OPPOSITE]) == OPPOSITE
    assert combine([AS_PREDICTED, NO_DIFFERENCE], "any") == NO_DIFFERENCE
    assert combine([AS_PREDICTED, NO_DIFFERENCE], "all") == INCONCLUSIVE
    assert combine([NO_DIFFERENCE, NO_DIFFERENCE], "all") == NO_DIFFERENCE
    assert combine([AS_PREDICTED, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([]) == INCONCLUSIVE


def test_combine_a_check_whose_condition_did_not_occur_makes_the_prediction_not_judgeable():
    assert combine([NOT_JUDGEABLE, AS_PREDICTED]) == NOT_JUDGEABLE
    assert combine([NOT_JUDGEABLE], "all") == NOT_JUDGEABLE


@pytest.mark.parametrize(
    "lo, hi, verdict",
    [(0.0, 0.08, AS_PREDICTED), (0.6, 0.9, OPPOSITE), (0.05, 0.3, INCONCLUSIVE)],
)
def test_at_most_rule_of_the_controls_collapse(lo, hi, verdict):
    assert decide(est(lo, hi), "at most", supports=0.1, falsifies=0.5)[0] == verdict


# ---------------------------------------------------------------- replicates that do not vary


def test_values_equal_by_construction_do_not_differ_by_their_rounding():
    """0.1 + 0.2 and 0.3 are one value: their difference is 0 in every seed, so the check
    says no difference. Today's rule read the rounding error (5.6e-17 in every seed, an
    interval of width 0 above 0) as a difference: as predicted."""
    arm = {s: 0.1 + 0.2 for s in range(5)}
    ref = {s: 0.3 for s in range(5)}
    _, d = paired(arm, ref)
    assert list(d) == [0.0] * 5
    e = t_interval(d)
    assert e.exact and decide(e, "higher", margin=float("nan")) == (
        NO_DIFFERENCE,
        "the difference is 0 in every replicate",
    )


def test_a_constant_difference_is_decided_by_its_sign():
    e = t_interval([-0.25] * 5)
    assert e.exact and (e.lo, e.hi, e.sd) == (-0.25, -0.25, 0.0)
    assert decide(e, "lower", margin=0.0)[0] == AS_PREDICTED
    assert decide(e, "higher", margin=1.0)[0] == OPPOSITE  # never "inside the margin"
    noisy = t_interval([0.7 + 1e-16, 0.7, 0.7 - 1e-16])  # the same up to rounding
    assert noisy.exact and noisy.value == 0.7


@pytest.mark.parametrize(
    "expects, value, margin, verdict",
    [
        ("not lower", 0.0, 0.0, AS_PREDICTED),  # equal is not lower (today: inconclusive)
        ("not lower", -0.1, 0.05, OPPOSITE),
        ("not lower", 0.0, float("nan"), AS_PREDICTED),
        ("same", 0.0, 0.0, AS_PREDICTED),
        ("same", 0.2, 0.1, OPPOSITE),
        ("lower by m", -0.3, 0.1, AS_PREDICTED),
        ("lower by m", -0.05, 0.1, OPPOSITE),
    ],
)
def test_equivalence_checks_on_a_value_that_does_not_vary(expects, value, margin, verdict):
    e = t_interval([value] * 4)
    assert e.exact and decide(e, expects, margin=margin)[0] == verdict


# ---------------------------------------------------------------- p-values of claims


@pytest.mark.parametrize(
    "expects, kw",
    [
        ("higher", {"margin": 0.3}),
        ("lower", {"margin": 0.3}),
        ("same", {"margin": 0.5}),
        ("not lower", {"margin": 0.2}),
        ("lower by m", {"margin": 0.2}),
        ("at least", {"supports": 0.2, "falsifies": 0.1}),
        ("at most", {"supports": 0.1, "falsifies": 0.5}),
        ("cosine", {"margin": 0.1, "supports": 0.5}),
    ],
)
def test_claim_p_is_the_level_at_which_the_claim_stops(expects, kw):
    """At the level 1 − p − ε the interval still makes the claim, at 1 − p + ε it no longer
    does; and a claim is made at 95% exactly when p < 0.05."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        x = rng.normal(rng.normal(0, 0.5), rng.uniform(0.05, 0.5), size=int(rng.integers(3, 9)))
        e = t_interval(x)
        verdict = decide(e, expects, **kw)[0]
        p = claim_p(e, expects, verdict, **kw)
        if verdict not in (AS_PREDICTED, OPPOSITE, NO_DIFFERENCE):
            assert np.isnan(p)
            continue
        assert 0 <= p < 0.05
        checked += 1
        for eps, same in ((1e-6, True), (-1e-6, False)):
            level = 1 - p - eps
            if not 0 < level < 1:
                continue
            at = t_interval(x, level=level)
            assert (decide(at, expects, **kw)[0] == verdict) is same, (expects, p, eps)
    assert checked > 20


def test_claim_p_of_an_exact_value_is_0():
    e = t_interval([0.3] * 5)
    assert claim_p(e, "higher", AS_PREDICTED) == 0.0
    assert np.isnan(claim_p(e, "higher", INCONCLUSIVE))
