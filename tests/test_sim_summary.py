"""The summary: pooled figures, verdicts in either direction, predictions that cannot be read."""

import math

import numpy as np
import pytest

from rescue.sim import ArmSpec, SimConfig
from rescue.sim.runner import RunResult, run_arms
from rescue.sim.summary import summary_markdown, verdict, window_value

G = "sim/generated/"


def step(solved: float, n: float, turns_solved: float, ran: float) -> dict:
    return {
        f"{G}rollouts": n,
        f"{G}outcome/solved": solved,
        f"{G}turns_mean/solved": turns_solved,
        f"{G}ran_tests_rate/solved": ran,
        f"{G}outcome/submitted_failure": n - solved,
        f"{G}turns_mean/submitted_failure": 3.0,
    }


def test_window_values_pool_counts_rather_than_average_rates():
    steps = [step(1, 10, 4.0, 1.0), step(9, 10, 8.0, 0.0)]
    assert window_value(steps, "success") == 0.5
    assert window_value(steps, "turns_solved") == (1 * 4.0 + 9 * 8.0) / 10
    assert window_value(steps, "ran_tests_solved") == 0.1


def test_the_realized_baseline_is_pooled_over_the_unmasked_trained_rollouts():
    C = "rollout/census/"
    steps = [
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 28 / 128, f"{C}b_realized": 0.2},  # 100
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 108 / 128, f"{C}b_realized": 0.8},  # 20
        {f"{C}rollouts": 128.0, f"{C}masked_frac": 1.0},  # every trained rollout masked: no b
    ]
    assert window_value(steps, "b") == pytest.approx((0.2 * 100 + 0.8 * 20) / 120)


def test_a_window_without_its_population_is_nan_not_zero():
    assert math.isnan(window_value([step(0, 10, 0.0, 0.0)], "turns_solved"))


def test_verdicts_report_either_direction():
    assert verdict(-1.0, 0.1, -1) == "as predicted"
    assert verdict(+1.0, 0.1, -1) == "opposite to the prediction"
    assert verdict(0.1, 0.1, -1) == "no difference within seed noise"


def fake(arm: str, per_seed_turns: list[float]) -> list[RunResult]:
    p7 = {"group_mean": 1.0, "leave_one_out": 1.2, "turn_reached": 0.7}
    return [
        RunResult(arm, s, [step(5, 10, t, 0.5)] * 10, {}, p7, 0.0)
        for s, t in enumerate(per_seed_turns)
    ]


def test_p5_reports_shorter_successes_under_drop_when_the_runs_show_it():
    results = {
        "drop": fake("drop", [5.0, 5.1, 4.9]),
        "never-drop": fake("never-drop", [8.0, 8.2, 7.9]),
    }
    text = summary_markdown(results, SimConfig(steps=10), [0, 1, 2])
    row = next(line for line in text.splitlines() if line.startswith("| turns of successes"))
    assert "as predicted" in row and "-3.0" in row


def test_p5_reports_the_opposite_direction_too():
    results = {
        "drop": fake("drop", [9.0, 9.1, 8.9]),
        "never-drop": fake("never-drop", [6.0, 6.2, 5.9]),
    }
    text = summary_markdown(results, SimConfig(steps=10), [0, 1, 2])
    row = next(line for line in text.splitlines() if line.startswith("| turns of successes"))
    assert "opposite to the prediction" in row


def test_predictions_whose_arms_did_not_run_say_so():
    text = summary_markdown({"zero": fake("zero", [5.0])}, SimConfig(steps=10), [0])
    assert text.count("Not run") == 3  # P3, P5, P6
    assert "| zero |" in text and "30.0%" in text and "supports" in text  # P7 from any arm


def test_summary_of_a_real_run_names_the_parameters_each_prediction_depends_on():
    cfg = SimConfig(steps=6, groups_per_step=4, group_size=4, concurrency=4, max_turns=12)
    arms = [
        ArmSpec.parse(a)
        for a in ("drop", "never-drop", "protect:0.5", "protect:0.1", "mask", "zero")
    ]
    results = run_arms(cfg, arms, [0, 1], progress=False)
    text = summary_markdown(results, cfg, [0, 1])
    assert text.count("Depends on:") == 4
    for arm in ("drop", "never-drop", "protect-a0.5", "protect-a0.1", "mask", "zero"):
        assert f"| {arm} |" in text
    assert "nan" not in text.lower().replace("n/a", "")
    assert np.isfinite(results["drop"][0].p7["turn_reached"])
