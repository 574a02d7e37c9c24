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
from rescue.judge.stats import AS_PREDICTED, INCONCLUSIVE, NO_DIFFERENCE, OPPOSITE


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
    """Cap-hit rate linear in b after b crosses 0.3: slope ``mask_slope`` vs ``zero_slope``."""

    def cap(slope):
        return lambda t: 0.25 + slope * (B_RISING(t) - 0.3)

    return cohort(
        mask=arm(
            "mask",
            seeds,
            steps=60,
            b_paid=B_RISING,
            cap_hit=cap(mask_slope),
            success=0.3,
            step_noise=0.01,
            **kw,
        ),
        zero=arm(
            "zero",
            seeds,
            steps=60,
            b_realized=B_RISING,
            cap_hit=cap(zero_slope),
            success=0.3,
            step_noise=0.01,
            **kw,
        ),
    )


def test_p3_mask_drifting_up_while_zero_keeps_falling_is_as_predicted():
    r = one("P3", p3_arms(0.3, -0.3))
    c = check(r, "cap-hit trend against b, mask − zero")
    assert c.verdict == AS_PREDICTED and c.estimate.value == pytest.approx(0.6, abs=0.05)
    assert c.estimate.n == 5 and c.estimate.dof == 4
    assert r.verdict == AS_PREDICTED


def test_p3_the_other_way_round_is_opposite():
    r = one("P3", p3_arms(-0.3, 0.3))
    assert check(r, "cap-hit trend").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_p3_is_judged_only_after_b_crosses_the_threshold():
    # Before the crossing (steps < 20) mask falls steeply; after it, as zero: no difference.
    def cap(t):
        b = B_RISING(t)
        return np.where(b < 0.3, 0.6 - 3.0 * b, 0.25 - 0.3 * (b - 0.3))

    arms = cohort(
        mask=arm("mask", 8, steps=60, b_paid=B_RISING, cap_hit=cap, step_noise=0.005),
        zero=arm(
            "zero",
            8,
            steps=60,
            b_realized=B_RISING,
            cap_hit=lambda t: 0.25 - 0.3 * (B_RISING(t) - 0.3),
            step_noise=0.005,
        ),
    )
    c = check(one("P3", arms), "cap-hit trend")
    assert abs(c.estimate.value) < 0.05, "the steps before b > 0.3 leaked into the trend"


def test_p3_when_b_never_exceeds_the_threshold_no_seed_has_a_value():
    arms = cohort(
        mask=arm("mask", 5, b_paid=0.2, cap_hit=lambda t: 0.3 + 0.001 * t),
        zero=arm("zero", 5, b_realized=0.2),
    )
    c = check(one("P3", arms), "cap-hit trend")
    assert c.verdict == INCONCLUSIVE and "0 replicate(s)" in c.reason
    assert any("left out" in n for n in c.notes)
    assert any(n.startswith("mask seed 0: its b") and "never exceeded 0.3" in n for n in c.notes)


def test_p3_reads_the_b_paid_to_masked_rollouts_and_names_it_when_missing():
    arms = p3_arms(0.3, -0.3, drop=("rollout/census/b_paid/masked",))
    r = one("P3", arms)
    c = check(r, "cap-hit trend")
    assert c.verdict == INCONCLUSIVE and "rollout/census/b_paid/masked" in c.reason
    assert r.verdict == INCONCLUSIVE


def test_p3_matched_control_reproducing_the_drift_falsifies():
    arms = p3_arms(0.3, -0.3)
    matched = p3_arms(0.3, -0.3)["mask"]
    from rescue.judge.runs import Condition

    for run in matched.values():
        run.condition = Condition("sim", "matched")
    arms["matched"] = matched
    r = one("P3", arms)
    c = check(r, "cap-hit trend against b, matched − mask")
    assert c.verdict in (NO_DIFFERENCE, INCONCLUSIVE)
    assert r.verdict != AS_PREDICTED


def test_p3_two_seeds_are_inconclusive():
    r = one("P3", p3_arms(0.3, -0.3, seeds=2))
    assert r.verdict == INCONCLUSIVE


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


# ---------------------------------------------------------------- P5


def test_p5_shorter_successes_and_longer_failures_under_drop_is_as_predicted():
    arms = cohort(
        drop=arm(
            "drop", 5, turns_solved=5.0, turns_submitted=12.0, turns_capped=22.0, ran_tests=0.6
        ),
        nd=arm(
            "never-drop",
            5,
            turns_solved=6.0,
            turns_submitted=10.0,
            turns_capped=20.0,
            ran_tests=0.8,
        ),
    )
    r = one("P5", arms)
    assert [c.verdict for c in r.checks] == [AS_PREDICTED, AS_PREDICTED, AS_PREDICTED]
    assert check(r, "turns of successes").estimate.value == pytest.approx(-1.0, abs=0.05)
    assert r.verdict == AS_PREDICTED


def test_p5_separating_the_other_way_is_opposite():
    arms = cohort(drop=arm("drop", 5, turns_solved=7.0), nd=arm("never-drop", 5, turns_solved=6.0))
    r = one("P5", arms)
    assert check(r, "turns of successes").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_p5_equal_turns_over_many_seeds_is_no_difference():
    arms = cohort(drop=arm("drop", 20, noise=0.1), nd=arm("never-drop", 20, noise=0.1))
    r = one("P5", arms)
    assert check(r, "turns of successes").verdict == NO_DIFFERENCE
    assert check(r, "turns of failures").verdict == NO_DIFFERENCE
    assert r.verdict == NO_DIFFERENCE


def test_p5_without_turn_keys_is_inconclusive_naming_the_key():
    G = "sim/generated/"
    C = "rollout/census/"
    keys = tuple(p + "turns_mean/solved" for p in (G, C))
    arms = cohort(drop=arm("drop", 5, drop=keys), nd=arm("never-drop", 5, drop=keys))
    r = one("P5", arms)
    c = check(r, "turns of successes")
    assert c.verdict == INCONCLUSIVE and "turns_mean/solved" in c.reason
    assert r.verdict in (INCONCLUSIVE, OPPOSITE, AS_PREDICTED, NO_DIFFERENCE)


def test_p5_falls_back_to_the_census_of_trained_groups_on_real_runs():
    G = "sim/generated/"
    keys = tuple(
        G + k
        for k in ("rollouts", "outcome/solved", "outcome/submitted_failure", "outcome/budget_failure",
                  "turns_mean/solved", "turns_mean/submitted_failure", "turns_mean/budget_failure",
                  "ran_tests_rate/solved", "cap_hit_rate", "outcome/infra_no_result")
    )  # fmt: skip
    arms = cohort(
        drop=arm("drop", 5, turns_solved=5.0, drop=keys, family="swe"),
        nd=arm("never-drop", 5, turns_solved=6.0, drop=keys, family="swe"),
    )
    assert check(one("P5", arms), "turns of successes").verdict == AS_PREDICTED


# ---------------------------------------------------------------- P6


def test_p6_protect_matching_never_drop_sooner_is_as_predicted():
    arms = cohort(
        p5=arm("protect-a0.5", 16, success=0.6, step_time=9.0, noise=0.02),
        nd=arm("never-drop", 16, success=0.6, step_time=10.0, noise=0.02),
        p1=arm("protect-a0.1", 16, success=0.4, noise=0.02),
    )
    # "within seed noise" with independent seeds needs about 10 of them: the interval of a
    # difference is about t·√2·σ/√n wide, the margin σ.
    r = one("P6", arms)
    assert check(r, "final success, protect-a0.5").verdict == AS_PREDICTED
    assert check(r, "wall-clock").verdict == AS_PREDICTED
    assert check(r, "final success, protect-a0.1").verdict == AS_PREDICTED
    assert r.verdict == AS_PREDICTED
    assert not any("sandbox" in c.name for c in r.checks)  # not logged by the simulator


def test_p6_protect_far_below_never_drop_is_opposite():
    arms = cohort(p5=arm("protect-a0.5", 5, success=0.4), nd=arm("never-drop", 5, success=0.6))
    r = one("P6", arms)
    assert check(r, "final success").verdict == OPPOSITE and r.verdict == OPPOSITE


def test_p6_never_drop_cheaper_is_opposite():
    arms = cohort(
        p5=arm("protect-a0.5", 5, step_time=12.0), nd=arm("never-drop", 5, step_time=10.0)
    )
    assert check(one("P6", arms), "wall-clock").verdict == OPPOSITE


def test_p6_reports_the_sandbox_seconds_when_miles_logged_them():
    arms = cohort(p5=arm("protect-a0.5", 5), nd=arm("never-drop", 5))
    for runs, secs in ((arms["protect-a0.5"], 30.0), (arms["never-drop"], 40.0)):
        for run in runs.values():
            for i, row in enumerate(run.rows):
                row["perf/non_generation_time/mean"] = secs + 0.1 * ((i + run.seed) % 3)
    c = check(one("P6", arms), "sandbox seconds")
    assert c.verdict == AS_PREDICTED and not c.decides


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
    "turn, verdict", [(0.7, AS_PREDICTED), (0.95, OPPOSITE), (0.85, INCONCLUSIVE)]
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
    assert check(r, "reduction vs the group mean").verdict == verdict and r.verdict == verdict
    assert not check(r, "reduction vs the leave-one-out").decides


def advantages_report(reductions):
    steps = [
        {"step": i, "reduction": x, "reduction_vs_loo": x + 0.1} for i, x in enumerate(reductions)
    ]
    return Report("advantages", {"steps": steps, "total": {"var_e": 1.0}, "arms": {}}, "adv.json")


def test_p7_offline_from_replay_reports_uses_each_step_as_a_replicate():
    r = one("P7 offline", None, [advantages_report([0.31, 0.29, 0.33, 0.30])])
    c = check(r, "reduction vs the group mean")
    assert c.estimate.n == 4 and c.verdict == AS_PREDICTED
    r = one("P7 offline", None, [advantages_report([0.05, 0.06, 0.04])])
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
    assert ids == ["P1", "P2", "P3", "P4", "P5", "P6", "P7 online", "P7 offline", "protect vs pace"]
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
        if r.prediction.prediction:
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
    c = check(p5, "turns of successes")
    assert c.verdict == INCONCLUSIVE and "0 replicate(s)" in c.reason
    assert any("without a value" in n for n in c.notes)
    assert write_plots(j, tmp_path)  # the other curves are still drawn
