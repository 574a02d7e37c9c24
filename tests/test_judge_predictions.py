"""Each prediction's rule on constructed runs whose right verdict is known.

The runs are synthetic (``tests/synthetic_runs.py``): per-step census rows whose levels,
trends and seed noise the test sets, so the true difference is known.
"""

import numpy as np
import pytest
from synthetic_runs import arm, cohort, make_run

from rescue.judge.evaluation import evaluate
from rescue.judge.offline import Report
from rescue.judge.predictions import BY_ID, PREDICTIONS
from rescue.judge.stats import (
    AS_PREDICTED,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    NOT_JUDGEABLE,
    OPPOSITE,
)


def judged(pid: str, arms: dict | None, replays=()) -> list:
    """``arms``: judge on that cohort; None: judge on the replay reports."""
    return evaluate([BY_ID[pid]], arms, replays)


def one(pid: str, arms: dict, replays=()):
    [r] = judged(pid, arms, replays)
    return r


def check(result, start: str):
    return next(c for c in result.checks if c.name.startswith(start))


# ---------------------------------------------------------------- P3

B_RISING = lambda t: 0.1 + 0.6 * t / 60  # noqa: E731 - crosses 0.3 at step 20


def p3_arms(mask_slope: float, zero_slope: float, seeds=5, **kw):
    """Cap-hit rate linear in b after b crosses 0.3: slope ``mask_slope`` vs ``zero_slope``;
    both arms log the same b (``b_all``)."""

    def cap(slope):
        return lambda t: 0.25 + slope * (B_RISING(t) - 0.3)

    common = dict(steps=60, b=B_RISING, success=0.3, step_noise=0.01, **kw)
    return cohort(
        mask=arm("mask", seeds, cap_hit=cap(mask_slope), **common),
        zero=arm("zero", seeds, cap_hit=cap(zero_slope), **common),
    )


def test_p3_mask_drifting_up_while_zero_keeps_falling_is_as_predicted():
    r = one("P3", p3_arms(0.3, -0.3))
    c = check(r, "cap-hit trend against b at matched b, mask − zero")
    assert c.verdict == AS_PREDICTED and c.estimate.value == pytest.approx(0.6, abs=0.05)
    assert c.estimate.n == 5 and c.estimate.dof == 4
    assert r.verdict == AS_PREDICTED
    assert any("`rollout/census/generated/`" in n for n in c.notes)  # the view it read


def test_p3_the_other_way_round_is_opposite():
    r = one("P3", p3_arms(-0.3, 0.3))
    assert check(r, "cap-hit trend").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_p3_is_judged_only_where_b_exceeds_the_threshold():
    # Below b = 0.3 (steps < 20) mask falls steeply; above it, as zero: no difference.
    def cap(t):
        b = B_RISING(t)
        return np.where(b < 0.3, 0.6 - 3.0 * b, 0.25 - 0.3 * (b - 0.3))

    common = dict(steps=60, b=B_RISING, step_noise=0.005)
    arms = cohort(
        mask=arm("mask", 8, cap_hit=cap, **common),
        zero=arm("zero", 8, cap_hit=lambda t: 0.25 - 0.3 * (B_RISING(t) - 0.3), **common),
    )
    c = check(one("P3", arms), "cap-hit trend")
    assert abs(c.estimate.value) < 0.05, "the steps below b = 0.3 leaked into the trend"


def test_p3_reads_one_b_for_every_arm_not_the_baseline_paid_to_the_masked():
    """The masking arm's b_paid and the R = 0 arm's b_realized move apart; the cap-hit rate
    depends on the realized all-members b alone, the same way in both arms (the
    two-outcome algebra: no drift). Today's rule put the arms on different axes and read
    a drift; one b for both reads none."""
    b = lambda t: 0.3 + 0.5 * t / 80  # noqa: E731
    common = dict(steps=80, b=b, success=b, cap_hit=lambda t: 0.9 - b(t), step_noise=0.004)
    arms = cohort(
        mask=arm("mask", 12, b_paid=lambda t: 0.25 + 0.25 * t / 80, **common),
        zero=arm("zero", 12, b_realized=b, **common),
    )
    c = check(one("P3", arms), "cap-hit trend against b at matched b, mask − zero")
    assert c.verdict in (NO_DIFFERENCE, INCONCLUSIVE), (c.verdict, c.reason)
    assert c.estimate.lo < 0 < c.estimate.hi and abs(c.estimate.value) < 0.01


def test_p3_when_the_arms_share_no_b_above_the_threshold_is_not_judgeable():
    arms = cohort(
        mask=arm("mask", 5, b=0.2, cap_hit=lambda t: 0.3 + 0.001 * t),
        zero=arm("zero", 5, b=0.5),
    )
    r = one("P3", arms)
    c = check(r, "cap-hit trend")
    assert c.verdict == NOT_JUDGEABLE and c.reason.startswith("not judgeable: mask never exceeded")
    assert r.verdict == NOT_JUDGEABLE and c.p != c.p  # no claim, no p-value
    disjoint = cohort(
        mask=arm("mask", 5, steps=60, b=lambda t: 0.35 + 0.1 * t / 60),
        zero=arm("zero", 5, steps=60, b=lambda t: 0.6 + 0.1 * t / 60),
    )
    c = check(one("P3", disjoint), "cap-hit trend")
    assert c.verdict == NOT_JUDGEABLE and "share no range of b" in c.reason


def test_p3_reads_older_runs_through_b_realized_and_the_masked_fraction():
    """Runs logged before ``b_all``: b = b_realized × (1 − masked_frac)."""
    arms = p3_arms(0.3, -0.3, legacy=True)
    for runs in arms.values():
        for run in runs.values():
            for row in run.rows:
                row["rollout/census/b_realized"] = 2 * row["rollout/census/b_realized"]
                row["rollout/census/masked_frac"] = 0.5
    for runs in arms.values():  # b_realized 2b, half masked: the same b as before
        for run in runs.values():
            for row, t in zip(run.rows, range(60), strict=True):
                row["rollout/census/b_realized"] = 2 * B_RISING(t)
    c = check(one("P3", arms), "cap-hit trend against b at matched b, mask − zero")
    assert c.verdict == AS_PREDICTED and c.estimate.value == pytest.approx(0.6, abs=0.05)
    assert any("`sim/generated/`" in n for n in c.notes)


def test_p3_matched_control_reproducing_the_drift_falsifies():
    arms = p3_arms(0.3, -0.3)
    matched = p3_arms(0.3, -0.3)["mask"]
    from rescue.judge.runs import Condition

    for run in matched.values():
        run.condition = Condition("sim", "matched")
    arms["matched"] = matched
    r = one("P3", arms)
    c = check(r, "cap-hit trend against b at matched b, matched − mask")
    assert c.verdict in (NO_DIFFERENCE, INCONCLUSIVE)
    assert r.verdict != AS_PREDICTED


def test_p3_two_seeds_are_inconclusive():
    r = one("P3", p3_arms(0.3, -0.3, seeds=2))
    assert r.verdict == INCONCLUSIVE


# ---------------------------------------------------------------- which cohorts


def two_outcome_arms(seeds=5, survivor_norm=0.0):
    """Solved or capped only: cap-hit = 1 − success, no submitted failure; the survivor
    arm's update norm is ``survivor_norm`` times R = 0's at every step."""
    b = lambda t: 0.35 + 0.3 * t / 60  # noqa: E731
    common = dict(steps=60, b=b, success=b, two_outcome=True, step_noise=0.01)
    arms = cohort(
        mask=arm("mask", seeds, **common),
        zero=arm("zero", seeds, **common),
        survivor=arm("survivor", seeds, **common),
    )
    for s, run in arms["survivor"].items():
        for row, ref in zip(run.rows, arms["zero"][s].rows, strict=True):
            row["sim/update_norm"] = survivor_norm * ref["sim/update_norm"]
    return arms


def test_p3_and_p4_do_not_apply_to_a_two_outcome_cohort_and_the_control_does():
    arms = two_outcome_arms()
    for pid in ("P3", "P4"):
        r = one(pid, arms)
        assert r.verdict is None and r.note.startswith("does not apply: two outcomes")
    r = one("control", arms)
    assert r.verdict == AS_PREDICTED, [(c.name, c.verdict, c.reason) for c in r.checks]
    collapse = check(r, "update norm, survivor / zero")
    assert collapse.estimate.exact and collapse.estimate.value == 0.0
    assert collapse.verdict == AS_PREDICTED
    drift = check(r, "cap-hit trend against b at matched b, mask − zero")
    assert drift.verdict == AS_PREDICTED and drift.expects == "same"


def test_the_control_does_not_apply_where_there_is_a_third_outcome():
    r = one("control", p3_arms(0.3, -0.3))
    assert r.verdict is None and "three outcomes" in r.note


def test_the_control_is_opposite_when_the_survivors_keep_their_signal():
    r = one("control", two_outcome_arms(survivor_norm=1.0))
    assert check(r, "update norm, survivor").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_the_control_is_opposite_when_the_mask_drifts_on_two_outcome_data():
    arms = two_outcome_arms()
    b = lambda t: 0.35 + 0.3 * t / 60  # noqa: E731
    for run in arms["mask"].values():  # the mask's cap-hit rises with b: a drift
        for row, t in zip(run.rows, range(60), strict=True):
            row["rollout/census/generated/cap_hit_rate"] = 0.2 + 0.5 * (b(t) - 0.35)
    r = one("control", arms)
    assert check(r, "cap-hit trend").verdict == OPPOSITE and r.verdict == OPPOSITE


# ---------------------------------------------------------------- P4


def test_p4_survivor_drifting_faster_is_as_predicted_and_equal_curves_no_difference():
    up = lambda s: lambda t: 0.1 + s * t / 100  # noqa: E731
    r = one(
        "P4",
        cohort(
            survivor=arm("survivor", 5, cap_hit=up(0.3), step_noise=0.01),
            mask=arm("mask", 5, cap_hit=up(0.1), step_noise=0.01),
        ),
    )
    assert check(r, "cap-hit drift").verdict == AS_PREDICTED and r.verdict == AS_PREDICTED
    same = one(
        "P4",
        cohort(
            survivor=arm("survivor", 12, cap_hit=up(0.1), step_noise=0.01, noise=0.0),
            mask=arm("mask", 12, cap_hit=up(0.1), step_noise=0.01, noise=0.0),
        ),
    )
    assert same.verdict in (NO_DIFFERENCE, INCONCLUSIVE)
    assert check(same, "cap-hit drift").estimate.lo < 0 < check(same, "cap-hit drift").estimate.hi


def test_p4_gap_growth_is_unbiased_for_arms_that_do_not_differ():
    """Two arms with the same cap-hit curve and independent noise: the gap does not grow
    with the arms' mean rate, so over many seeds the slope's interval holds 0. Regressed on
    one side of the gap the slope is biased negative: its interval lies below 0 on the same
    runs."""
    from rescue.judge import quantities as qs
    from rescue.judge.rules import _gap_growth
    from rescue.judge.stats import slope, t_interval

    curve = lambda t: 0.3 + 0.02 * t / 80  # noqa: E731
    arms = cohort(
        survivor=arm("survivor", 40, steps=80, cap_hit=curve, step_noise=0.03, noise=0.0),
        mask=arm("mask", 40, steps=80, cap_hit=curve, step_noise=0.03, noise=0.0),
    )
    c = check(one("P4", arms), "growth of the cap-hit gap")
    assert len(c.values[next(iter(c.values))]) == 40  # judged per seed, through the report
    # The per-seed slope's SD is about 0.6 here: 1000 seeds give an interval of about ±0.04.
    many = [
        _gap_growth(
            make_run("survivor", s, steps=80, cap_hit=curve, step_noise=0.03, noise=0.0),
            make_run("mask", s, steps=80, cap_hit=curve, step_noise=0.03, noise=0.0),
        )
        for s in range(1000)
    ]
    est = t_interval(many)
    assert est.lo < 0 < est.hi, est

    def one_sided(s, m):
        ss, sm = qs.series(s, "cap_hit"), qs.series(m, "cap_hit")
        _, ys = ss.trailing(qs.B_SMOOTH, 79)
        _, ym = sm.trailing(qs.B_SMOOTH, 79)
        return slope(ym, ys - ym).value

    old = t_interval([one_sided(arms["survivor"][s], arms["mask"][s]) for s in range(40)])
    assert old.hi < 0, old


def test_p4_gap_growth_does_not_read_a_noisier_arm_as_growth():
    """The survivor arm's cap-hit rate noisier than the mask's (more rollouts capped, a
    larger binomial variance), the curves the same: read off the same steps, the gap's
    noise and the mean rate's are correlated by the difference of the variances, and the
    slope reads growth that is not there (about +1.2 here); against the rate of the steps
    before it does not (the sign is the other way: conservative)."""
    from rescue.judge import quantities as qs
    from rescue.judge.rules import _gap_growth
    from rescue.judge.stats import slope, t_interval

    curve = lambda t: 0.3 + 0.02 * t / 80  # noqa: E731
    pairs = [
        (
            make_run("survivor", s, steps=80, cap_hit=curve, step_noise=0.06, noise=0.0),
            make_run("mask", s, steps=80, cap_hit=curve, step_noise=0.02, noise=0.0),
        )
        for s in range(200)
    ]

    def same_steps(s, m):
        ss, sm = qs.series(s, "cap_hit"), qs.series(m, "cap_hit")
        _, ys = ss.trailing(qs.B_SMOOTH, 79)
        _, ym = sm.trailing(qs.B_SMOOTH, 79)
        return slope((ys + ym) / 2, ys - ym).value

    assert t_interval([same_steps(s, m) for s, m in pairs]).lo > 0.5
    assert t_interval([_gap_growth(s, m) for s, m in pairs]).hi < 0


# ---------------------------------------------------------------- P5


def test_p5_successes_shortening_and_failures_lengthening_over_training_is_as_predicted():
    down = lambda t: 6.0 - 2.0 * t / 40  # noqa: E731
    up = lambda a: lambda t: a + 3.0 * t / 40  # noqa: E731
    arms = cohort(
        drop=arm(
            "drop", 5, turns_solved=down, turns_submitted=up(10.0), turns_capped=up(20.0),
            ran_tests=lambda t: 0.8 - 0.2 * t / 40, step_noise=0.2,
        ),
        nd=arm("never-drop", 5, step_noise=0.2),
    )  # fmt: skip
    r = one("P5", arms)
    assert check(r, "trend of the turns of successes").verdict == AS_PREDICTED
    assert check(r, "trend of the turns of failures").verdict == AS_PREDICTED
    assert check(r, "trend of the turns of successes").estimate.value == pytest.approx(
        -5.0, abs=0.5
    )  # −2 turns over 40 steps: −5 per 100
    assert check(r, "trend of the test-run rate").verdict == AS_PREDICTED
    assert r.verdict == AS_PREDICTED


def test_p5_is_decided_on_the_level_and_reports_the_trends():
    """drop's successes are shorter by a constant over the run, with no trend: P5 is
    decided on the level (``rules.P5_DECIDES``), and its trends are reported beside it."""
    arms = cohort(
        drop=arm("drop", 8, turns_solved=4.0, turns_submitted=12.0, step_noise=0.2),
        nd=arm("never-drop", 8, turns_solved=6.0, turns_submitted=10.0, step_noise=0.2),
    )
    r = one("P5", arms)
    level = check(r, "turns of successes over the run")
    trend = check(r, "trend of the turns of successes")
    assert level.decides and level.verdict == AS_PREDICTED
    assert not trend.decides and trend.verdict in (NO_DIFFERENCE, INCONCLUSIVE)
    assert r.verdict == AS_PREDICTED


def test_p5_the_other_way_is_opposite():
    arms = cohort(
        drop=arm("drop", 5, turns_solved=lambda t: 6.0 + 2.0 * t / 40, step_noise=0.2),
        nd=arm("never-drop", 5, step_noise=0.2),
    )
    r = one("P5", arms)
    assert check(r, "turns of successes over the run").verdict == OPPOSITE
    assert check(r, "trend of the turns of successes").verdict == OPPOSITE
    assert r.verdict == OPPOSITE


def test_p5_equal_turns_over_many_seeds_is_no_difference():
    # Submitted and capped failures equally long, so the step-to-step mix of the two (the
    # synthetic outcome counts are noisy too) does not move the failures' turns.
    same = dict(noise=0.1, step_noise=0.1, turns_submitted=12.0, turns_capped=12.0)
    arms = cohort(drop=arm("drop", 40, **same), nd=arm("never-drop", 40, **same))
    r = one("P5", arms)
    assert check(r, "turns of successes over the run").verdict == NO_DIFFERENCE
    assert check(r, "turns of failures (submitted or capped) over the run").verdict == NO_DIFFERENCE
    assert check(r, "trend of the turns of successes").verdict == NO_DIFFERENCE
    assert r.verdict == NO_DIFFERENCE


def test_p5_refuses_runs_that_logged_only_the_trained_groups():
    """A drop arm's trained rollouts are its survivors: P5 on them compares drop's
    survivors with never-drop's everything. Today's rule fell back to them and judged."""
    arms = cohort(
        drop=arm("drop", 5, turns_solved=lambda t: 6 - 2 * t / 40, trained_only=True, family="swe"),
        nd=arm("never-drop", 5, trained_only=True, family="swe"),
    )
    r = one("P5", arms)
    c = check(r, "turns of successes over the run")
    assert c.verdict == INCONCLUSIVE and c.decides
    assert c.reason.startswith("missing key rollout/census/generated/")
    assert "survivors" in c.reason
    assert r.verdict == INCONCLUSIVE


def test_p5_reads_the_simulators_older_generated_keys():
    arms = cohort(
        drop=arm("drop", 5, turns_solved=lambda t: 6 - 2 * t / 40, step_noise=0.1, legacy=True),
        nd=arm("never-drop", 5, step_noise=0.1, legacy=True),
    )
    c = check(one("P5", arms), "turns of successes over the run")
    assert c.verdict == AS_PREDICTED and any("`sim/generated/`" in n for n in c.notes)


# ---------------------------------------------------------------- P6


def test_p6_protect_within_seed_noise_of_never_drop_is_as_predicted():
    arms = cohort(
        p5=arm("protect-a0.5", 40, success=0.6, step_time=9.0, noise=0.02),
        nd=arm("never-drop", 40, success=0.6, step_time=10.0, noise=0.02),
        p1=arm("protect-a0.1", 40, success=0.4, noise=0.02),
    )
    # "within seed noise" with independent seeds needs many of them: the interval of a
    # difference is about t·√2·σ/√n wide, the margin σ, and the difference's own mean must
    # fit inside what is left.
    r = one("P6", arms)
    c = check(r, "final success, protect-a0.5")
    assert c.expects == "same" and c.verdict == AS_PREDICTED
    assert check(r, "final success, protect-a0.1").verdict == AS_PREDICTED
    assert r.verdict == AS_PREDICTED
    assert not any("sandbox" in c.name for c in r.checks)  # not logged by the simulator


def test_p6_protect_far_below_never_drop_is_opposite():
    arms = cohort(p5=arm("protect-a0.5", 5, success=0.4), nd=arm("never-drop", 5, success=0.6))
    r = one("P6", arms)
    assert check(r, "final success").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_p6_reports_the_cost_per_unit_of_improvement_and_does_not_decide_on_it():
    """Finished-but-stale protection keeps rollouts already paid for: it cannot be cheaper
    than never-drop. Today's rule decided P6 on the wall-clock, so equal success at a
    higher clock read opposite; the cost is reported, with its interval, and no verdict."""
    rise = lambda t: 0.3 + 0.3 * t / 40  # noqa: E731
    arms = cohort(
        p5=arm("protect-a0.5", 40, success=rise, step_time=12.0, noise=0.02),
        nd=arm("never-drop", 40, success=rise, step_time=10.0, noise=0.02),
    )
    r = one("P6", arms)
    cost = check(r, "wall-clock per unit of reward improvement")
    assert cost.verdict is None and not cost.decides and cost.reason == "the interval excludes 0"
    gain = 0.3 * (36 - 4) / 40  # final 8 steps minus first 8, of a rise of 0.3 over 40
    assert cost.estimate.value == pytest.approx(40 * 2.0 / gain, rel=0.1)
    assert r.verdict == AS_PREDICTED


def test_p6_reports_the_sandbox_seconds_per_unit_of_improvement_when_miles_logged_them():
    rise = lambda t: 0.3 + 0.3 * t / 40  # noqa: E731
    arms = cohort(p5=arm("protect-a0.5", 5, success=rise), nd=arm("never-drop", 5, success=rise))
    for runs, secs in ((arms["protect-a0.5"], 30.0), (arms["never-drop"], 40.0)):
        for run in runs.values():
            for i, row in enumerate(run.rows):
                row["perf/non_generation_time/mean"] = secs + 0.1 * ((i + run.seed) % 3)
    c = check(one("P6", arms), "sandbox seconds per unit")
    assert c.verdict is None and not c.decides and c.estimate.value < 0


def test_p6_is_judged_once_per_staleness_limit_with_matching_k():
    arms = {
        **cohort(nd=arm("never-drop", 3, family="swe")),
        "protect-a0.5-k1": {s: make_run("protect-a0.5-k1", s, family="swe") for s in range(3)},
        "protect-a0.5-k2": {s: make_run("protect-a0.5-k2", s, family="swe") for s in range(3)},
        "protect-a0.1-k2": {s: make_run("protect-a0.1-k2", s, family="swe") for s in range(3)},
    }
    results = judged("P6", arms)
    bound = sorted((r.binding["protect-0.5"], r.binding["protect-0.1"]) for r in results)
    assert bound == [("protect-a0.5-k1", None), ("protect-a0.5-k2", "protect-a0.1-k2")]


# ---------------------------------------------------------------- P7


def test_p7_online_turn_matching_mask_and_tracking_zero():
    arms = cohort(
        turn=arm("turn-baseline", 8, success=0.6, cap_hit=0.1, noise=0.02),
        mask=arm("mask", 8, success=0.6, cap_hit=0.3, noise=0.02),
        zero=arm("zero", 8, success=0.55, cap_hit=0.1, noise=0.02),
    )
    r = one("P7 online", arms)
    assert check(r, "final success").verdict == AS_PREDICTED and r.verdict == AS_PREDICTED
    assert check(r, "final cap-hit rate").expects == "same"


def test_p7_online_mask_beating_the_turn_baseline_is_opposite():
    arms = cohort(turn=arm("turn-baseline", 5, success=0.4), mask=arm("mask", 5, success=0.6))
    r = one("P7 online", arms)
    assert r.verdict == OPPOSITE
    assert len(r.checks) == 1  # no zero arm: the tracking checks are not run


@pytest.mark.parametrize(
    "turn, verdict", [(0.84, AS_PREDICTED), (1.14, OPPOSITE), (1.02, INCONCLUSIVE)]
)
def test_p7_offline_from_the_simulators_variances(turn, verdict):
    arms = cohort(zero=arm("zero", 5))
    for s, run in arms["zero"].items():
        run.offline["p7"] = {
            "group_mean": 1.0,
            "leave_one_out": 1.2,
            "turn_reached": turn + 0.002 * s,
        }
    r = one("P7 offline", arms)
    c = check(r, "reduction vs the leave-one-out mean")
    assert c.verdict == verdict and c.decides and r.verdict == verdict
    assert not check(r, "reduction vs the group mean").decides


def test_p7_offline_is_decided_on_the_leave_one_out_scale():
    """At G = 8 the group mean with the rollout's own reward has 0.766 times the
    leave-one-out variance. A turn-reached baseline that cuts 30% of the leave-one-out
    variance is a real lever; against the group mean it reads 8.6%, opposite."""
    arms = cohort(zero=arm("zero", 5))
    for s, run in arms["zero"].items():
        run.offline["p7"] = {
            "group_mean": 0.7656 + 1e-4 * s,
            "leave_one_out": 1.0 + 1e-4 * s,
            "turn_reached": 0.70 + 1e-4 * s,
        }
    r = one("P7 offline", arms)
    assert check(r, "reduction vs the leave-one-out mean").verdict == AS_PREDICTED
    assert check(r, "reduction vs the group mean").verdict == OPPOSITE
    assert r.verdict == AS_PREDICTED


def test_p7_offline_does_not_apply_to_a_two_outcome_cohort():
    arms = two_outcome_arms()
    for run in arms["zero"].values():
        run.offline["p7"] = {"group_mean": 1.0, "leave_one_out": 1.2, "turn_reached": 0.5}
    r = one("P7 offline", arms)
    assert r.verdict is None and r.note.startswith("does not apply")


def _p7_arms(group_size=None):
    arms = cohort(zero=arm("zero", 5))
    for s, run in arms["zero"].items():
        run.offline["p7"] = {"group_mean": 1.0, "leave_one_out": 1.2, "turn_reached": 0.8 + s / 1e3}
        if group_size is not None:
            run.config["group_size"] = group_size
    return arms


def test_p7_offline_does_not_apply_to_groups_of_one():
    """With one rollout per group the turn-reached baseline has no other member: its
    reduction is 0 by construction, which says nothing about the lever."""
    r = one("P7 offline", _p7_arms(group_size=1))
    assert r.verdict is None and r.note.startswith("does not apply: groups of one")
    assert one("P7 offline", _p7_arms(group_size=8)).verdict == AS_PREDICTED
    assert one("P7 offline", _p7_arms()).verdict == AS_PREDICTED  # G not logged: judged


def test_three_outcome_predictions_do_not_apply_where_nothing_reached_the_cap():
    arms = cohort(
        mask=arm("mask", 5, cap_hit=0.0, noise=0.0, b=B_RISING),
        zero=arm("zero", 5, cap_hit=0.0, noise=0.0, b=B_RISING),
    )
    r = one("P3", arms)
    assert r.verdict is None and "no budget failure" in r.note


def advantages_report(reductions):
    steps = [
        {"step": i, "reduction": x, "reduction_vs_loo": x + 0.1} for i, x in enumerate(reductions)
    ]
    return Report("advantages", {"steps": steps, "total": {"var_e": 1.0}, "arms": {}}, "adv.json")


def test_p7_offline_from_replay_reports_uses_each_step_as_a_replicate():
    r = one("P7 offline", None, [advantages_report([0.21, 0.19, 0.23, 0.20])])
    c = check(r, "reduction vs the leave-one-out mean")
    assert c.estimate.n == 4 and c.verdict == AS_PREDICTED and c.decides
    r = one("P7 offline", None, [advantages_report([-0.05, -0.04, -0.06])])
    assert r.verdict == OPPOSITE
    r = one("P7 offline", None, [])
    assert r.verdict == INCONCLUSIVE and "no `rescue replay advantages" in r.checks[0].reason


# ---------------------------------------------------------------- P1, P2


def gradients_report(name, *, cos=0.8, norm=1.0, b=0.4, check=(1e-7, 1e-4)):
    data = {
        "rollouts": 64,
        "parameters": 10,
        "baseline_paid": b,
        "buckets": [
            {"bucket": "all", "arms": {}, "b_minus_a": {"norm": norm, "cos_cap": cos, "beta": b}}
        ],
    }
    if check:
        data["check"] = {"prompts": 8, "max_residual": check[0], "rtol": check[1]}
    return Report("gradients", data, name)


def test_p1_within_tolerance_is_as_predicted_and_above_it_opposite():
    assert one("P1", None, [gradients_report("a"), gradients_report("b")]).verdict == AS_PREDICTED
    bad = one("P1", None, [gradients_report("a"), gradients_report("b", check=(3e-3, 1e-4))])
    assert bad.verdict == OPPOSITE and "b: 0.003 > 0.0001" in bad.checks[0].reason
    assert one("P1", None, [gradients_report("a", check=None)]).verdict == INCONCLUSIVE
    assert one("P1", None, []).verdict == INCONCLUSIVE


def test_p2_aligned_difference_whose_norm_grows_with_b():
    reports = [
        gradients_report(f"s{i}", cos=0.7 + 0.02 * i, norm=2.0 * b + 0.01 * i, b=b)
        for i, b in enumerate((0.2, 0.3, 0.4, 0.5))
    ]
    r = one("P2", None, reports)
    assert [c.verdict for c in r.checks] == [
        AS_PREDICTED,
        AS_PREDICTED,
    ] and r.verdict == AS_PREDICTED


def test_p2_isotropic_difference_and_flat_norm_are_no_difference():
    reports = [
        gradients_report(f"s{i}", cos=c, norm=1.0 + 0.01 * (i % 2), b=b)
        for i, (c, b) in enumerate(
            zip((0.01, -0.02, 0.015, -0.005), (0.2, 0.3, 0.4, 0.5), strict=True)
        )
    ]
    r = one("P2", None, reports)
    assert [c.verdict for c in r.checks] == [NO_DIFFERENCE, NO_DIFFERENCE]
    assert r.verdict == NO_DIFFERENCE


def test_p2_with_one_subset_is_inconclusive():
    assert one("P2", None, [gradients_report("only")]).verdict == INCONCLUSIVE


# ---------------------------------------------------------------- the comparison and coverage


def test_protect_vs_pace_is_reported_without_a_verdict_when_both_ran():
    arms = cohort(p5=arm("protect-a0.5", 5, success=0.5), pace=arm("pace", 5, success=0.6))
    r = one("protect vs pace", arms)
    assert r.verdict is None and [c.verdict for c in r.checks] == [None, None]
    assert r.checks[0].reason == "the interval excludes 0"
    missing = one("protect vs pace", cohort(p5=arm("protect-a0.5", 5)))
    assert missing.note.startswith("not run") and "`pace`" in missing.note


def test_every_prediction_p1_to_p7_is_present_once():
    ids = [p.id for p in PREDICTIONS]
    assert ids == [
        "P1", "P2", "P3", "P4", "control", "P5", "P6", "P7 online", "P7 offline",
        "protect vs pace",
    ]  # fmt: skip
    for p in PREDICTIONS:
        assert p.rule.startswith(p.id.split()[0]) or not p.prediction
        assert p.window and p.margin and p.depends


def test_an_old_run_without_the_census_is_inconclusive_for_every_prediction_never_an_error():
    from rescue.judge.runs import Condition, Run

    def bare(label, seed):
        run = make_run(label, seed)
        return Run(
            run.condition, seed, [{"rollout/step": float(i), "train/loss": 1.0} for i in range(20)]
        )

    labels = (
        "drop",
        "never-drop",
        "protect-a0.5",
        "protect-a0.1",
        "mask",
        "zero",
        "survivor",
        "turn-baseline",
        "pace",
    )
    arms = {lbl: {s: bare(lbl, s) for s in range(4)} for lbl in labels}
    assert isinstance(arms["drop"][0].condition, Condition)
    results = evaluate(PREDICTIONS, arms)
    for r in results:
        if r.prediction.id == "control":  # two outcomes or three: the runs cannot tell
            assert r.verdict is None and "logged no outcome counts" in r.note
        elif r.prediction.prediction:
            assert r.verdict == INCONCLUSIVE, r.prediction.id
        for c in r.checks:
            if c.verdict == INCONCLUSIVE and c.estimate is None:
                assert "missing key" in c.reason or "no offline" in c.reason


def test_a_quantity_whose_population_is_always_empty_is_inconclusive_and_plots_skip_it(tmp_path):
    from rescue.judge.plots import write_plots
    from rescue.judge.report import judge

    runs = [make_run(label, s, success=0.0) for label in ("drop", "never-drop") for s in range(3)]
    j = judge(runs)
    p5 = next(r for r in j.cohorts[0].results if r.prediction.id == "P5")
    c = check(p5, "turns of successes over the run")
    assert c.verdict == INCONCLUSIVE and "0 replicate(s)" in c.reason
    assert any("without a value" in n for n in c.notes)
    assert write_plots(j, tmp_path)  # the other curves are still drawn


# ---------------------------------------------------------------- P3's control clause


def _as(arms: dict, source: str, label: str) -> dict:
    """A copy of the ``source`` arm's runs relabelled as arm ``label`` (same rows)."""
    import copy

    from rescue.judge.runs import Condition

    out = {}
    for s, run in arms[source].items():
        twin = copy.copy(run)
        twin.condition = Condition("sim", label)
        out[s] = twin
    return out


def _controls(matched_from: str, step_from: str) -> dict:
    arms = p3_arms(0.3, -0.3)
    arms["matched"] = _as(arms, matched_from, "matched")
    arms["step-control"] = _as(arms, step_from, "step-control")
    return arms


def test_p3_a_drift_the_direction_carries_is_as_predicted_and_the_gate_says_go():
    """The mask drifts, the matched control (the mask's direction at R = 0's step size)
    reproduces it and the step-size control (R = 0's direction at the mask's step size)
    does not: the subsidy's own mechanism. P3's control clause reads the step-size control,
    so P3 is as predicted and q2's gate says go; the matched control's reproduction is
    reported as the direction check, never counted against P3."""
    from rescue.judge.report import as_json, judge
    from rescue.questions.rehearsal import gate_decision

    arms = _controls(matched_from="mask", step_from="zero")
    r = one("P3", arms)
    assert r.verdict == AS_PREDICTED
    clause = check(r, "cap-hit trend against b at matched b, step-control − mask")
    assert clause.decides and clause.verdict == AS_PREDICTED
    assert any("step-size control" in n for n in clause.notes)
    direction = check(r, "cap-hit trend against b at matched b, matched − zero")
    assert not direction.decides and direction.alone == AS_PREDICTED
    assert not any(c.name.startswith("cap-hit trend against b at matched b, matched − mask")
                   for c in r.checks)  # fmt: skip
    runs = [run for seeds in arms.values() for run in seeds.values()]
    decision = gate_decision(as_json(judge(runs)))
    assert decision["go"] is True and decision["control"] == "step-control"


def test_p3_a_drift_of_step_size_is_not_as_predicted_and_the_gate_says_no():
    """The step-size control reproduces the mask's drift and the matched control does not:
    the drift is the step size's, P3's control clause falsifies it."""
    from rescue.judge.report import as_json, judge
    from rescue.questions.rehearsal import gate_decision

    arms = _controls(matched_from="zero", step_from="mask")
    r = one("P3", arms)
    clause = check(r, "cap-hit trend against b at matched b, step-control − mask")
    assert clause.verdict in (NO_DIFFERENCE, INCONCLUSIVE) and r.verdict != AS_PREDICTED
    runs = [run for seeds in arms.values() for run in seeds.values()]
    assert gate_decision(as_json(judge(runs)))["go"] is False


def test_p3_without_the_step_size_control_reads_the_clause_on_arm_iii_and_says_so():
    arms = p3_arms(0.3, -0.3)
    arms["matched"] = _as(arms, "mask", "matched")
    r = one("P3", arms)
    clause = check(r, "cap-hit trend against b at matched b, matched − mask")
    assert clause.decides and any("no step-size control" in n for n in clause.notes)
    assert r.verdict != AS_PREDICTED
