"""The simulator's summary: pooled figures, and the predictions as the judge reads them."""

import numpy as np
import pytest

from rescue.judge import quantities as qs
from rescue.sim import ArmSpec, SimConfig
from rescue.sim.runner import RunResult, run_arms
from rescue.sim.summary import PREDICTIONS, cohort, judged, summary_markdown, to_run

G = "sim/generated/"


def step(solved: float, n: float, turns_solved: float, ran: float) -> dict:
    return {
        f"{G}rollouts": n,
        f"{G}outcome/solved": solved,
        f"{G}turns_mean/solved": turns_solved,
        f"{G}ran_tests_rate/solved": ran,
        f"{G}outcome/submitted_failure": n - solved,
        f"{G}turns_mean/submitted_failure": 3.0,
        f"{G}outcome/budget_failure": 0.0,
    }


def result(arm: str, seed: int, steps: list[dict], p7=None) -> RunResult:
    p7 = p7 or {"group_mean": 1.0, "leave_one_out": 1.2, "turn_reached": 0.7}
    return RunResult(arm, seed, steps, {}, p7, 0.0)


def test_window_values_pool_counts_rather_than_average_rates():
    run = to_run(result("zero", 0, [step(1, 10, 4.0, 1.0), step(9, 10, 8.0, 0.0)]))
    assert qs.series(run, "success").pooled() == 0.5
    assert qs.series(run, "turns_solved").pooled() == (1 * 4.0 + 9 * 8.0) / 10
    assert qs.series(run, "ran_tests_solved").pooled() == 0.1


def test_the_realized_baseline_is_pooled_over_the_unmasked_trained_rollouts():
    C = "rollout/census/"
    steps = [
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 28 / 128, f"{C}b_realized": 0.2},  # 100
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 108 / 128, f"{C}b_realized": 0.8},  # 20
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 1.0},  # every trained rollout masked: no b
    ]
    run = to_run(result("mask", 0, steps))
    assert qs.series(run, "b_realized").pooled() == pytest.approx((0.2 * 100 + 0.8 * 20) / 120)


def test_b_is_the_all_members_baseline_and_older_runs_derive_it():
    """``b_all`` where logged; else ``b_realized × (1 − masked_frac)``, which is the same
    number when the masked rollouts are budget failures scored 0."""
    C = "rollout/census/"
    steps = [
        {f"{C}rollouts": 100.0, f"{C}b_all": 0.3, f"{C}b_realized": 0.6, f"{C}masked_frac": 0.5},
        {f"{C}rollouts": 100.0, f"{C}b_realized": 0.5, f"{C}masked_frac": 0.2},  # older: 0.4
    ]
    run = to_run(result("mask", 0, steps))
    assert list(qs.series(run, "b").values()) == pytest.approx([0.3, 0.4])


def test_a_window_without_its_population_is_nan_not_zero():
    run = to_run(result("zero", 0, [step(0, 10, 0.0, 0.0)]))
    assert np.isnan(qs.series(run, "turns_solved").pooled())


def fake(arm: str, per_seed_turns: list[float]) -> list[RunResult]:
    return [result(arm, s, [step(5, 10, t, 0.5)] * 10) for s, t in enumerate(per_seed_turns)]


def section(text: str, pid: str) -> str:
    start = text.index(f"### {pid}:")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else None]


def test_p5_is_judged_by_the_judge_in_the_predicted_direction():
    results = {
        "drop": fake("drop", [5.0, 5.1, 4.9]),
        "never-drop": fake("never-drop", [8.0, 8.2, 7.9]),
    }
    text = summary_markdown(results, SimConfig(steps=10), [0, 1, 2])
    row = next(x for x in section(text, "P5").splitlines() if x.startswith("| turns of successes"))
    assert "| as predicted (p = " in row and "-3.03 [" in row and "(n=3)" in row
    assert "| yes |" in row  # P5 is decided on the level (rules.P5_DECIDES)


def test_p5_reports_the_opposite_direction_too():
    results = {
        "drop": fake("drop", [9.0, 9.1, 8.9]),
        "never-drop": fake("never-drop", [6.0, 6.2, 5.9]),
    }
    text = summary_markdown(results, SimConfig(steps=10), [0, 1, 2])
    row = next(x for x in section(text, "P5").splitlines() if x.startswith("| turns of successes"))
    assert "| opposite (p = " in row


def test_two_seeds_never_give_a_verdict():
    results = {"drop": fake("drop", [5.0, 5.1]), "never-drop": fake("never-drop", [8.0, 8.2])}
    text = summary_markdown(results, SimConfig(steps=10), [0, 1])
    assert "### P5: signature of staleness drops — **inconclusive**" in text
    assert "2 replicate(s); a verdict needs at least 3" in section(text, "P5")


def test_predictions_whose_arms_did_not_run_say_so():
    capped = {**step(5, 10, 5.0, 0.5), f"{G}outcome/budget_failure": 1.0}  # three outcomes
    zero = [result("zero", 0, [capped] * 10)]
    text = summary_markdown({"zero": zero}, SimConfig(steps=10), [0])
    # P3, P4, the control, P5, P6, P7 online and the comparisons need arms that did not run.
    assert (
        "Not run here (their arms are not in this run): P3, P4, P5, P6, P7 online, control, "
        "protect vs pace, strategy share." in text
    )
    assert "### P3" not in text and "| P7 offline | zero |" in text
    p7 = section(text, "P7 offline")
    assert "| reduction vs the leave-one-out mean | yes |" in p7 and "0.417 (n=1)" in p7
    assert "| reduction vs the group mean | no |" in p7 and "0.3 (n=1)" in p7
    assert "1 replicate(s); a verdict needs at least 3" in p7


def test_the_summary_judges_every_prediction_that_reads_runs():
    assert [p.id for p in PREDICTIONS] == [
        "P3",
        "P4",
        "control",
        "P5",
        "P6",
        "P7 online",
        "P7 offline",
        "protect vs pace",
        "strategy share",
    ]


def test_summary_of_a_real_run_names_the_parameters_each_prediction_depends_on():
    cfg = SimConfig(steps=6, groups_per_step=4, group_size=4, concurrency=4, max_turns=12)
    arms = [
        ArmSpec.parse(a)
        for a in ("drop", "never-drop", "protect:0.5", "protect:0.1", "mask", "zero")
    ]
    results = run_arms(cfg, arms, [0, 1], progress=False)
    text = summary_markdown(results, cfg, [0, 1])
    _, ran, missing = judged(results)
    assert text.count("Depends on:") == len(ran) and missing == [
        "P4",
        "P7 online",
        "protect vs pace",
    ]
    for arm in ("drop", "never-drop", "protect-a0.5", "protect-a0.1", "mask", "zero"):
        assert f"| {arm} |" in text
    assert "nan" not in text.lower().replace("n/a", "")
    assert "± 0.000" not in text
    arms_seen = cohort(results)
    assert sorted(arms_seen["protect-a0.5"]) == [0, 1]
    assert arms_seen["protect-a0.5"][0].condition.a == 0.5
