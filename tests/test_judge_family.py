"""The family-wise rule: Holm's step-down over the deciding checks of one report."""

import numpy as np
import pytest
from synthetic_runs import make_run

from rescue.judge.checks import Check
from rescue.judge.evaluation import Result
from rescue.judge.family import ALPHA, expected_bound, holm
from rescue.judge.predictions import BY_ID
from rescue.judge.report import judge, markdown
from rescue.judge.stats import AS_PREDICTED, CLAIMS, INCONCLUSIVE, OPPOSITE, Estimate


def claim(name: str, p: float, verdict: str = AS_PREDICTED, decides: bool = True) -> Check:
    """A check that made ``verdict`` alone with claim p-value ``p`` (NaN: no claim)."""
    c = Check(name=name, expects="higher", window="", decides=decides)
    c.estimate = Estimate(1.0, 0.5, 1.5, 5, 4, 0.4, se=0.18)
    c.verdict = c.alone = verdict
    c.p = p if verdict in CLAIMS else float("nan")
    return c


def result(pid: str, *checks: Check) -> Result:
    return Result(BY_ID[pid], {}, list(checks), AS_PREDICTED)


def test_claims_whose_p_stays_under_alpha_over_the_checks_left_are_kept():
    a, b, c = claim("a", 0.001), claim("b", 0.02), claim("c", 0.04)
    rs = [result("P4", a), result("P6", b), result("P7 online", c)]
    f = holm(rs)
    assert (f.size, f.claims, f.kept, f.withdrawn) == (3, 3, 3, [])
    assert [r.verdict for r in rs] == [AS_PREDICTED] * 3


def test_the_first_claim_over_its_bar_and_every_later_one_are_withdrawn():
    a, b, c = claim("a", 0.001), claim("b", 0.03), claim("c", 0.04, OPPOSITE)
    rs = [result("P4", a), result("P6", b), result("P7 online", c)]
    f = holm(rs)
    assert a.verdict == AS_PREDICTED
    assert b.verdict == INCONCLUSIVE and b.alone == AS_PREDICTED
    assert "p > α / 2 = 0.025" in b.reason
    assert c.verdict == INCONCLUSIVE and c.alone == OPPOSITE  # 0.04 < 0.05, but after b
    assert "an earlier check in the order was not kept" in c.reason
    assert (f.claims, f.kept) == (3, 1) and len(f.withdrawn) == 2
    assert [r.verdict for r in rs] == [AS_PREDICTED, INCONCLUSIVE, INCONCLUSIVE]
    assert [r.alone for r in rs] == [AS_PREDICTED] * 3  # the verdicts before the rule


def test_checks_that_claimed_nothing_count_in_the_family():
    kept = claim("k", 0.02)
    holm([result("P4", kept), result("P6", claim("n", float("nan"), INCONCLUSIVE))])
    assert kept.verdict == AS_PREDICTED  # 0.02 <= 0.05 / 2
    lost = claim("l", 0.03)
    f = holm([result("P4", lost), result("P6", claim("n", float("nan"), INCONCLUSIVE))])
    assert lost.verdict == INCONCLUSIVE and f.size == 2


def test_checks_beside_a_prediction_and_reported_comparisons_are_not_in_the_family():
    beside = claim("beside", 0.04, decides=False)
    reported = claim("reported", 0.04)
    f = holm([result("P4", claim("a", 0.001), beside), result("protect vs pace", reported)])
    assert f.size == 1 and beside.verdict == AS_PREDICTED and reported.verdict == AS_PREDICTED


def test_applying_the_rule_twice_gives_the_same_verdicts():
    checks = [claim("a", 0.001), claim("b", 0.03), claim("c", 0.04)]
    rs = [result("P4", c) for c in checks]
    holm(rs)
    first = [c.verdict for c in checks]
    holm(rs)
    assert [c.verdict for c in checks] == first


def test_expected_false_claims_under_the_rule_with_independent_null_checks():
    """K = 16 checks, none with an effect, their p-values independent uniforms: the chance
    of any false claim is at most α (within a 99.9% binomial band of 20000 reports) and
    the mean number of false claims is under the bound the report prints."""
    rng = np.random.default_rng(3)
    k, reports = 16, 20000
    p = np.sort(rng.uniform(size=(reports, k)), axis=1)
    bars = ALPHA / (k - np.arange(k))
    ok = p <= bars
    # Rejections: the checks before the first whose p is over its bar.
    false = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))
    any_rate = (false > 0).mean()
    assert any_rate <= ALPHA + 3.3 * np.sqrt(ALPHA * (1 - ALPHA) / reports)
    assert false.mean() <= expected_bound(k)
    assert expected_bound(1) == pytest.approx(ALPHA)
    assert expected_bound(16) == pytest.approx(
        0.05 * 2 * (1 + 16 / 30 + 16 / 42 + 16 / 52 + 16 / 60 + 16 / 66 + 16 / 70 + 16 / 72)
    )


def test_the_report_states_the_rule_and_the_expected_number_of_false_claims():
    runs = [make_run(label, s) for label in ("drop", "never-drop") for s in range(4)]
    j = judge(runs)
    assert j.family is not None and j.family.size >= 2
    text = markdown(j)
    top = text.split("## sim runs")[0]
    assert "Family-wise rule: Holm's step-down over the deciding checks of the report" in top
    assert f"would make {ALPHA * j.family.size:.2g} false claims on average" in top
    assert f"at most {expected_bound(j.family.size):.2g}" in top
