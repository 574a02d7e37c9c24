"""The arms' advantages on a small batch, against values computed by hand."""

import numpy as np
import pytest

from rescue.advantages import group_advantages
from rescue.judge.offline import p7_verdict as verdict
from rescue.mask import mask_decision
from rescue.outcomes import Classification
from rescue.replay.arms import (
    advantages_report,
    build_batch,
    explained_share,
    frozen_scale,
    scalar_arms,
    token_advantages,
)
from rescue.replay.dumps import parse_payload
from rescue.replay.synthetic import sample_dict, synthetic_step


def _rollout(group, index, turns, reward, status, obs=1):
    """``turns`` turns of 2 action tokens, ``obs`` observation tokens between turns."""
    mask = []
    for t in range(turns):
        mask += [1, 1] + ([0] * obs if t < turns - 1 else [])
    return sample_dict(group_index=group, index=index, tokens=[0] + [1] * len(mask),
                       response_length=len(mask), loss_mask=mask, reward=reward, status=status)  # fmt: skip


@pytest.fixture
def batch():
    """Group 0: solved in 1 turn, submitted failure in 2, two capped at 3 turns (one with a
    stray reward 0.3 that arm (a) must zero). Group 1: two solved rollouts (no signal)."""
    samples = [
        _rollout(0, 0, 1, 1.0, "completed"),
        _rollout(0, 1, 2, 0.0, "completed"),
        _rollout(0, 2, 3, 0.3, "truncated"),
        _rollout(0, 3, 3, 0.0, "truncated"),
        _rollout(1, 4, 1, 1.0, "completed"),
        _rollout(1, 5, 2, 1.0, "completed"),
    ]
    return build_batch(parse_payload({"rollout_id": 0, "samples": samples}).trajectories)


def test_scalar_arms_match_hand_values(batch):
    assert batch.R0.tolist() == [1, 0, 0, 0, 1, 1]  # R = 0 on cap
    arms = scalar_arms(batch, rhos=(0.0, 1.0), std_normalize=False)
    np.testing.assert_allclose(arms["a"], [0.75, -0.25, -0.25, -0.25, 0, 0])
    np.testing.assert_allclose(arms["b"], [0.75, -0.25, 0, 0, 0, 0])  # all-G mean 1/4
    np.testing.assert_allclose(arms["c"], [0.5, -0.5, 0, 0, 0, 0])  # survivors' mean 1/2
    np.testing.assert_allclose(arms["d0"], arms["a"])
    np.testing.assert_allclose(arms["d1"], arms["b"])


def test_std_normalization_uses_the_frozen_unmasked_group_std(batch):
    # group 0: R0 = [1,0,0,0], unbiased std = sqrt(0.75/3) = 0.5; group 1: std 0 -> no division
    arms = scalar_arms(batch, rhos=(), std_normalize=True)
    s = 1 / (0.5 + 1e-6)
    np.testing.assert_allclose(arms["a"], [0.75 * s, -0.25 * s, -0.25 * s, -0.25 * s, 0, 0])
    np.testing.assert_allclose(arms["c"], [0.5 * s, -0.5 * s, 0, 0, 0, 0])  # not the survivors' std


def test_turn_reached_tokens_match_hand_values(batch):
    """κ = 2. b_{i,ℓ} = n/(n+2)·m_ℓ + 2/(n+2)·b̄_i over the others that reached ℓ.

    rollout 0 (R=1, 1 turn): n=3, m=0, b̄=0 -> b=0, A=1.
    rollout 1 (R=0, 2 turns): b̄=1/3; ℓ=1: n=3, m=1/3 -> 1/3; ℓ=2: n=2 (2,3), m=0 -> 1/6.
    rollouts 2, 3 (R0=0, 3 turns): ℓ=1: 1/3; ℓ=2: others 1 and 3/2, m=0 -> 1/6;
    ℓ=3: n=1, m=0 -> (2/3)(1/3) = 2/9.
    """
    tok = token_advantages(batch, rhos=(), std_normalize=False, kappa=2.0)
    e = tok["e"]
    expected = [
        [1, 1],
        [-1 / 3, -1 / 3, 0, -1 / 6, -1 / 6],
        [-1 / 3, -1 / 3, 0, -1 / 6, -1 / 6, 0, -2 / 9, -2 / 9],
        [-1 / 3, -1 / 3, 0, -1 / 6, -1 / 6, 0, -2 / 9, -2 / 9],
        [0, 0],
        [0, 0, 0, 0, 0],  # equal rewards: b = 1 everywhere
    ]
    np.testing.assert_allclose(e, np.concatenate(expected), atol=1e-7)
    # scalar arms broadcast over loss tokens, 0 on observations
    np.testing.assert_allclose(tok["a"][2:7], [-0.25, -0.25, 0, -0.25, -0.25])


def test_mask_fraction_arm_uses_the_filters_coin(batch):
    arms = scalar_arms(batch, rhos=(0.5,), seed=3, std_normalize=False)
    for i, t in enumerate(batch.trajectories):
        masked = mask_decision(Classification(t.record.outcome, t.record.reason), t.key, 0.5, 3)
        assert arms["d0.5"][i] == (0.0 if masked else arms["a"][i])


def test_frozen_scale_is_the_group_advantages_normalizer():
    rng = np.random.default_rng(0)
    R = rng.integers(0, 2, 60).astype(float)
    R[:4] = 1.0  # one group with equal rewards
    g = np.repeat(np.arange(15), 4)
    np.testing.assert_allclose(
        group_advantages(R, g, std_normalize=True),
        frozen_scale(R, g) * group_advantages(R, g, std_normalize=False),
        rtol=1e-12,
    )


def test_rollouts_without_reward_are_counted_not_lost():
    payload = synthetic_step(p_abort=0.3, seed=4)
    d = parse_payload(payload)
    b = build_batch(d.trajectories)
    aborted = sum(s["status"] == "aborted" for s in payload["samples"])
    assert aborted > 0 and b.n + len(b.excluded) == len(d.trajectories)
    assert len(b.excluded) == aborted


def test_explained_share_and_the_judges_p7_thresholds():
    turns = np.array([1, 1, 2, 2])
    assert explained_share(np.array([0.0, 0.0, 1.0, 1.0]), turns) == pytest.approx(1.0)
    assert explained_share(np.array([0.0, 1.0, 0.0, 1.0]), turns) == pytest.approx(0.0)
    assert verdict(0.25) == "as predicted" and verdict(0.20) == "as predicted"
    assert verdict(0.15) == "inconclusive" and verdict(0.10) == "inconclusive"
    assert verdict(0.05) == "opposite" and verdict(float("nan")) == "inconclusive"


def test_report_variances_are_those_of_the_token_arrays():
    payload = synthetic_step(groups=6, G=8, cap=8, seed=2)
    d = parse_payload(payload)
    report = advantages_report([d], std_normalize=False)
    b = build_batch(d.trajectories)
    tok = token_advantages(b, std_normalize=False)
    loss = b.token_turns > 0
    total = report["total"]
    assert total["var_a"] == pytest.approx(tok["a"][loss].astype(float).var())
    assert total["var_e"] == pytest.approx(tok["e"][loss].astype(float).var())
    assert total["reduction"] == pytest.approx(1 - total["var_e"] / total["var_a"])
    assert total["verdict"] == verdict(total["reduction"])
    # leave-one-out reference: G/(G-1) times (a) in every group of G = 8
    assert total["var_loo"] == pytest.approx(total["var_a"] * (8 / 7) ** 2, rel=1e-6)
    assert report["steps"][0]["var_a"] == total["var_a"]
