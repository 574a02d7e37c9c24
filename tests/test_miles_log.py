"""The Miles log function: the sample-level census at ``rollout/step``, Miles' logging kept.

Unit tests run without Miles (fake tracking modules, the tests' ``Sample``); one test runs
Miles' ``log_rollout_data`` with the function configured (set ``MILES_SRC``).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
from fake_sample import Sample
from miles_env import require_miles

from rescue.miles.log import PREFIX, STEP_KEY, log_rollout, sample_census
from rescue.samples import WEIGHT_KEY

S = PREFIX  # "rollout/census/samples/"


def done(**fields: Any) -> Sample:
    """A completed sample generated with weight version 1."""
    return Sample(**{"status": Sample.Status.COMPLETED, "weight_versions": ["1"], **fields})


def batch():
    """Two groups of two trajectories; trajectory (1, 7) has two samples (turns)."""
    return [
        done(group_index=1, index=10, rollout_id=7, reward=1.0),
        done(group_index=1, index=11, rollout_id=7, reward=1.0),
        done(group_index=1, index=12, status=Sample.Status.TRUNCATED, remove_sample=True),
        done(group_index=2, index=20, reward=0.0, metadata={WEIGHT_KEY: 2.0}),
        done(group_index=2, index=21, reward=1.0, metadata={WEIGHT_KEY: 2.0}),
    ]


def test_sample_census_counts_trajectories_with_their_masks_and_weights():
    m = sample_census(batch())
    assert m[f"{S}rollouts"] == 4  # 5 samples, 4 trajectories
    assert m[f"{S}outcome/solved"] == 2
    assert m[f"{S}outcome/budget_failure"] == 1
    assert m[f"{S}outcome/submitted_failure"] == 1
    assert m[f"{S}masked_frac/budget_failure"] == 1.0
    assert m[f"{S}cap_hit_rate"] == 0.25
    assert m[f"{S}turns_mean/solved"] == 1.5  # 2 generation calls, then 1
    assert m[f"{S}b_realized"] == pytest.approx(2 / 3)  # unmasked rewards 1, 0, 1
    assert m[f"{S}weighted_samples"] == 2
    assert m[f"{S}weight_mean"] == pytest.approx((1 + 1 + 1 + 2 + 2) / 5)


def test_every_key_is_under_the_samples_prefix_so_none_collides_with_the_buffer():
    assert all(k.startswith("rollout/census/samples/") for k in sample_census(batch()))


def test_sample_census_of_an_empty_batch():
    m = sample_census([])
    assert m[f"{S}rollouts"] == 0 and m[f"{S}weighted_samples"] == 0


@pytest.fixture
def fake_miles_tracking(monkeypatch):
    """Stand-ins for the two Miles modules ``log_rollout`` imports."""
    logged: list = []
    metric_utils = types.ModuleType("miles.utils.metric_utils")
    metric_utils.compute_rollout_step = lambda args, rollout_id: rollout_id * 10
    tracking = types.SimpleNamespace(
        log=lambda args, metrics, step_key: logged.append((dict(metrics), step_key))
    )
    tracking_utils = types.ModuleType("miles.utils.tracking_utils")
    tracking_utils.tracking = tracking
    for name, module in {
        "miles": types.ModuleType("miles"),
        "miles.utils": types.ModuleType("miles.utils"),
        "miles.utils.metric_utils": metric_utils,
        "miles.utils.tracking_utils": tracking_utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return logged


def test_log_rollout_logs_at_the_rollout_step_and_returns_false(fake_miles_tracking):
    args = SimpleNamespace(reward_key=None)
    assert log_rollout(3, args, batch(), {"rollout/census/groups/entered": 2.0}, 1.5) is False
    [(metrics, step_key)] = fake_miles_tracking
    assert step_key == STEP_KEY == "rollout/step"
    assert metrics[STEP_KEY] == 30
    assert metrics[f"{S}rollouts"] == 4
    assert "rollout/census/groups/entered" not in metrics  # left to Miles' own logging


def test_log_rollout_runs_on_replay_without_buffer_metrics(fake_miles_tracking):
    assert log_rollout(0, SimpleNamespace(), batch(), None, 0.0) is False
    assert len(fake_miles_tracking) == 1


@pytest.mark.parametrize(("population", "paid"), [("all", 0.5), ("survivors", 1.0)])
def test_the_baseline_paid_to_masked_rollouts_is_the_censuss(
    fake_miles_tracking, monkeypatch, population, paid
):
    samples = batch()
    samples[2].reward = 0.0  # the masked rollout of group 1, beside rollout 7 (reward 1)
    monkeypatch.setenv("RESCUE_BASELINE", population)
    log_rollout(0, SimpleNamespace(reward_key=None), samples, None, 0.0)
    metrics = fake_miles_tracking[-1][0]
    assert metrics[f"{S}b_paid/masked_rollouts"] == 1
    assert metrics[f"{S}b_paid/masked"] == pytest.approx(paid)


def test_truncated_reward_zero_is_logged_as_a_census_count(fake_miles_tracking, monkeypatch):
    samples = batch()
    samples[2].reward = 1.0  # a truncated rollout the grader credited
    args = SimpleNamespace(reward_key=None)
    monkeypatch.delenv("RESCUE_TRUNCATED_REWARD", raising=False)
    log_rollout(0, args, samples, None, 0.0)
    assert f"{S}truncated_reward_zeroed" not in fake_miles_tracking[-1][0]
    monkeypatch.setenv("RESCUE_TRUNCATED_REWARD", "zero")
    log_rollout(1, args, samples, None, 0.0)
    assert fake_miles_tracking[-1][0][f"{S}truncated_reward_zeroed"] == 1
    samples[2].reward = 0.0  # already 0: nothing changed
    log_rollout(2, args, samples, None, 0.0)
    assert fake_miles_tracking[-1][0][f"{S}truncated_reward_zeroed"] == 0


def test_miles_log_rollout_data_keeps_its_own_logging(monkeypatch):
    require_miles()
    from miles.ray.rollout import metrics as miles_metrics
    from miles.utils.tracking_utils import tracking
    from miles.utils.types import Sample

    calls: list = []
    monkeypatch.setattr(
        tracking, "log", lambda args, m, step_key: calls.append((dict(m), step_key))
    )
    samples = [
        Sample(
            group_index=g,
            index=g * 10 + i,
            response="x",
            response_length=1,
            reward=float(i),
            status=Sample.Status.TRUNCATED if i == 0 else Sample.Status.COMPLETED,
            weight_versions=["4"],
            remove_sample=i == 0,
        )
        for g in range(2)
        for i in range(2)
    ]
    args = SimpleNamespace(
        custom_rollout_log_function_path="rescue.miles.log.log_rollout",
        load_debug_rollout_data=None,
        wandb_always_use_train_step=False,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        global_batch_size=4,
        advantage_estimator="grpo",
        sglang_speculative_algorithm=None,
        log_reward_category=None,
        log_passrate=False,
        use_session_server=False,
        ci_test=False,
        reward_key=None,
        rollout_num_gpus=1,
    )
    extra = {"rollout/census/groups/entered": 2.0, "rollout/fully_async/queue_size": 0}
    miles_metrics.log_rollout_data(5, args, samples, extra, 2.0)

    assert [step_key for _, step_key in calls] == ["rollout/step", "rollout/step"]
    ours, theirs = calls[0][0], calls[1][0]
    assert ours["rollout/step"] == theirs["rollout/step"] == 5
    assert ours[f"{S}outcome/budget_failure"] == 2 and ours[f"{S}masked_frac"] == 0.5
    assert theirs["rollout/census/groups/entered"] == 2.0  # the buffer's census, by Miles
    assert set(ours) & set(theirs) == {"rollout/step"}
