"""The gradient share by difficulty bucket: known answers of the identity on two-outcome
batches (R = 0, mask, survivor), identical arms, and the Miles log function's keys."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fake_sample import Sample

from filters import mask_truncated_zero_reward
from rescue.miles.log import PREFIX, gradient_share
from rescue.share import difficulty_bin, difficulty_share

#: Two prompts of 8 rollouts: 2 of 8 solved (hard) and 6 of 8 (easy); the rest capped.
SOLVED = {0: 2, 1: 6}
G = 8


def batch() -> list:
    out = []
    for g, k in SOLVED.items():
        for i in range(G):
            won = i < k
            meta = {"exit_status": "won" if won else "max_turns", "turns": 3 if won else 50}
            s = Sample(group_index=g, index=g * G + i, reward=1.0 if won else 0.0, metadata=meta)
            s.status = Sample.Status.COMPLETED
            s.response_length, s.loss_mask = 4, [1] * 4
            out.append(s)
    return out


ARGS = SimpleNamespace(
    advantage_estimator="grpo",
    rewards_normalization=True,
    grpo_std_normalization=True,
    normalize_advantages=False,
    reward_key=None,
    n_samples_per_prompt=G,
    rollout_batch_size=2,
)


def c(J: float) -> float:
    """GRPO's 1/(unbiased std + 1e-6) of a two-outcome group with solved fraction J."""
    x = np.r_[np.ones(round(J * G)), np.zeros(G - round(J * G))]
    return 1.0 / (x.std(ddof=1) + 1e-6)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("RESCUE_TRUNCATED_REWARD", "zero")
    monkeypatch.delenv("RESCUE_ESTIMATOR", raising=False)
    monkeypatch.delenv("RESCUE_BASELINE", raising=False)


def test_r_zero_weights_each_prompt_by_its_normalizer():
    m = gradient_share(ARGS, batch())
    assert m[PREFIX + "grad_weight/j_low"] == pytest.approx(c(0.25), rel=1e-9)
    assert m[PREFIX + "grad_weight/j_high"] == pytest.approx(c(0.75), rel=1e-9)
    assert m[PREFIX + "grad_share/j_low"] == pytest.approx(0.5)  # equal σ at 1/4 and 3/4
    assert m[PREFIX + "prompts/j_low"] == m[PREFIX + "prompts/j_high"] == 1
    assert m[PREFIX + "prompts/j0"] == 0 and PREFIX + "grad_weight/j0" not in m


def test_the_mask_rescales_each_prompt_by_one_minus_J_toward_the_hard_one():
    samples = batch()
    mask_truncated_zero_reward(ARGS, [samples[:G], samples[G:]])
    m = gradient_share(ARGS, samples)
    assert m[PREFIX + "grad_weight/j_low"] == pytest.approx(c(0.25) * (1 - 0.25), rel=1e-9)
    assert m[PREFIX + "grad_weight/j_high"] == pytest.approx(c(0.75) * (1 - 0.75), rel=1e-9)
    assert m[PREFIX + "grad_share/j_low"] == pytest.approx(0.75)


def test_the_survivor_baseline_has_no_signal(monkeypatch):
    monkeypatch.setenv("RESCUE_BASELINE", "survivors")
    samples = batch()
    mask_truncated_zero_reward(ARGS, [samples[:G], samples[G:]])
    m = gradient_share(ARGS, samples)
    assert m[PREFIX + "grad_weight_total"] == 0.0
    assert m[PREFIX + "grad_weight/j_low"] == m[PREFIX + "grad_weight/j_high"] == 0.0
    assert not [k for k in m if "grad_share/" in k]


def test_the_turn_estimator_has_the_r_zero_arms_expected_weights(monkeypatch):
    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    turn = gradient_share(ARGS, batch())
    monkeypatch.delenv("RESCUE_ESTIMATOR")
    assert turn == pytest.approx(gradient_share(ARGS, batch()))


def test_a_batch_with_a_no_result_rollout_reports_nothing():
    samples = batch()
    samples[0].status = Sample.Status.ABORTED
    assert gradient_share(ARGS, samples) == {}


def test_identical_arms_have_identical_shares_and_shares_sum_to_one():
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(20), 8)
    solved = rng.random(160) < rng.random(20).repeat(8)
    weight = rng.normal(size=160)
    a = difficulty_share(group, solved, weight)
    assert a == difficulty_share(group, solved, weight.copy())
    assert sum(v for k, v in a.items() if k.startswith("grad_share/")) == pytest.approx(1.0)
    assert sum(v for k, v in a.items() if k.startswith("prompts/")) == 20


def test_difficulty_bins_match_the_replays_labels():
    assert difficulty_bin(np.array([0.0, 0.125, 0.5, 0.875, 1.0])).tolist() == [0, 1, 2, 2, 3]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="1-D and of one length"):
        difficulty_share([0, 0], [True], [1.0, 0.0])
