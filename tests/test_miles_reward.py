"""The reward post-process hook: Miles' normalization, the baseline population, the weights."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from fake_sample import Sample
from miles_env import require_miles

from rescue.miles.reward import post_process_rewards
from rescue.reward import ENV_BASELINE


def make_args(**overrides):
    base = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=2,
    )
    return SimpleNamespace(**{**base, **overrides})


_UNSET = object()


def group(rewards, g, *, start=0, removed=(), weight=_UNSET):
    out = []
    for k, r in enumerate(rewards):
        s = Sample(reward=r, group_index=g, index=start + k, remove_sample=k in removed)
        if weight is not _UNSET:
            s.metadata["rescue_weight"] = weight
        out.append(s)
    return out


@pytest.fixture(autouse=True)
def _baseline_env(monkeypatch):
    monkeypatch.delenv(ENV_BASELINE, raising=False)


def grpo(rewards):
    r = np.asarray(rewards, dtype=float)
    a = r - r.mean()
    sd = r.std(ddof=1) if len(r) > 1 else 0.0
    return a / (sd + 1e-6) if sd > 0 else a


def test_groups_are_normalized_separately_by_group_index():
    samples = group([1, 0, 0, 1], g=5) + group([1, 1, 1, 0], g=9, start=4)
    raw, rewards = post_process_rewards(make_args(), samples)
    assert raw == [1, 0, 0, 1, 1, 1, 1, 0]
    np.testing.assert_allclose(rewards, np.r_[grpo([1, 0, 0, 1]), grpo([1, 1, 1, 0])], rtol=1e-12)


def test_interleaved_group_members_are_grouped_by_group_index_not_position():
    a, b = group([1.0, 0.0], g=1), group([3.0, 5.0], g=2, start=2)
    _, rewards = post_process_rewards(make_args(), [a[0], b[0], a[1], b[1]])
    np.testing.assert_allclose(
        rewards, [grpo([1, 0])[0], grpo([3, 5])[0], grpo([1, 0])[1], grpo([3, 5])[1]]
    )


def test_siblings_sharing_a_rollout_id_count_as_one_rollout():
    turns = [Sample(reward=1.0, group_index=0, index=10 + k, rollout_id=7) for k in range(3)]
    others = group([0.0, 0.0], g=0, start=20)
    _, rewards = post_process_rewards(make_args(), turns + others)
    expected = grpo([1.0, 0.0, 0.0])  # three rollouts, not five samples
    np.testing.assert_allclose(rewards, [expected[0]] * 3 + list(expected[1:]))


def test_siblings_with_different_rewards_are_an_error():
    bad = [Sample(reward=r, group_index=0, index=k, rollout_id=3) for k, r in enumerate([1.0, 0.0])]
    with pytest.raises(ValueError, match="must share one reward"):
        post_process_rewards(make_args(), bad + group([0.0], g=0, start=5))


def test_disable_grpo_std_normalization_only_subtracts_the_mean():
    _, rewards = post_process_rewards(
        make_args(grpo_std_normalization=False), group([3.0, 1.0, 2.0], g=0)
    )
    np.testing.assert_allclose(rewards, [1.0, -1.0, 0.0])


def test_disable_rewards_normalization_passes_rewards_through():
    samples = group([3.0, 1.0, 2.0], g=0)
    raw, rewards = post_process_rewards(make_args(rewards_normalization=False), samples)
    assert rewards == raw == [3.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        ("gspo", grpo([3.0, 1.0, 2.0])),
        ("cispo", grpo([3.0, 1.0, 2.0])),
        ("reinforce_plus_plus_baseline", [1.0, -1.0, 0.0]),
        ("reinforce_plus_plus", [3.0, 1.0, 2.0]),
        ("ppo", [3.0, 1.0, 2.0]),
    ],
)
def test_which_estimators_center_and_scale(estimator, expected):
    _, rewards = post_process_rewards(
        make_args(advantage_estimator=estimator), group([3.0, 1.0, 2.0], g=0)
    )
    np.testing.assert_allclose(rewards, expected, rtol=1e-12)


def test_a_single_rollout_or_equal_rewards_give_zero():
    samples = group([1.0], g=0) + group([0.5, 0.5, 0.5], g=1, start=1)
    _, rewards = post_process_rewards(make_args(), samples)
    assert rewards == [0.0, 0.0, 0.0, 0.0]


def test_without_group_index_a_full_batch_is_split_into_fixed_fanout_groups():
    samples = [Sample(reward=r, index=k) for k, r in enumerate([1, 0, 0, 0, 1, 1, 1, 0])]
    _, rewards = post_process_rewards(
        make_args(n_samples_per_prompt=4, rollout_batch_size=2), samples
    )
    np.testing.assert_allclose(rewards, np.r_[grpo([1, 0, 0, 0]), grpo([1, 1, 1, 0])])


def test_without_group_index_a_partial_batch_is_one_group():
    samples = [Sample(reward=r, index=k) for k, r in enumerate([1, 0, 0, 0, 1])]
    _, rewards = post_process_rewards(
        make_args(n_samples_per_prompt=4, rollout_batch_size=2), samples
    )
    np.testing.assert_allclose(rewards, grpo([1, 0, 0, 0, 1]))


def test_reward_key_selects_from_dict_rewards():
    samples = [
        Sample(reward={"acc": r, "fmt": 1.0}, group_index=0, index=k)
        for k, r in enumerate([1.0, 0.0])
    ]
    raw, rewards = post_process_rewards(make_args(reward_key="acc"), samples)
    assert raw == [1.0, 0.0]
    np.testing.assert_allclose(rewards, grpo([1.0, 0.0]))


def test_a_missing_reward_is_an_error_naming_the_sample():
    with pytest.raises(ValueError, match=r"sample 1 \(group_index=0\)"):
        post_process_rewards(make_args(), group([1.0, None], g=0))


# ---------------------------------------------------------------- baseline population


def test_all_population_lets_masked_rollouts_vote(monkeypatch):
    monkeypatch.setenv(ENV_BASELINE, "all")
    _, rewards = post_process_rewards(make_args(), group([1.0, 0.0, 0.0, 0.0], g=0, removed={2, 3}))
    np.testing.assert_allclose(rewards, grpo([1.0, 0.0, 0.0, 0.0]))


def test_survivor_population_uses_only_unmasked_rollouts(monkeypatch):
    monkeypatch.setenv(ENV_BASELINE, "survivors")
    _, rewards = post_process_rewards(make_args(), group([1.0, 0.0, 0.0, 0.0], g=0, removed={2, 3}))
    # b and σ over the survivors {1, 0}: mean 0.5, σ = sqrt(0.5); applied to every member.
    sd = math.sqrt(0.5) + 1e-6
    np.testing.assert_allclose(rewards, [0.5 / sd, -0.5 / sd, -0.5 / sd, -0.5 / sd])


def test_survivor_population_gives_zero_to_a_group_with_no_survivor(monkeypatch):
    monkeypatch.setenv(ENV_BASELINE, "survivors")
    samples = group([1.0, 0.0], g=0, removed={0, 1}) + group([1.0, 0.0], g=1, start=2)
    _, rewards = post_process_rewards(make_args(), samples)
    np.testing.assert_allclose(rewards, [0.0, 0.0, *grpo([1.0, 0.0])])


def test_a_rollout_survives_when_any_of_its_siblings_is_unmasked(monkeypatch):
    monkeypatch.setenv(ENV_BASELINE, "survivors")
    turns = [
        Sample(reward=1.0, group_index=0, index=k, rollout_id=9, remove_sample=k == 0)
        for k in range(2)
    ]
    masked = group([0.0], g=0, start=5, removed={0})
    kept = group([0.0], g=0, start=6)
    _, rewards = post_process_rewards(make_args(), turns + masked + kept)
    survivors = grpo([1.0, 0.0])
    np.testing.assert_allclose(rewards, [survivors[0], survivors[0], survivors[1], survivors[1]])


def test_an_unknown_baseline_setting_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV_BASELINE, "loo")
    with pytest.raises(ValueError, match="RESCUE_BASELINE='loo'; allowed: all, survivors"):
        post_process_rewards(make_args(), group([1.0, 0.0], g=0))


# ---------------------------------------------------------------- weights


def test_weights_multiply_after_normalization():
    plain = group([1.0, 0.0, 0.0, 1.0], g=0) + group([1.0, 0.0], g=1, start=4)
    weighted = group([1.0, 0.0, 0.0, 1.0], g=0, weight=4.0) + group([1.0, 0.0], g=1, start=4)
    _, base = post_process_rewards(make_args(), plain)
    _, out = post_process_rewards(make_args(), weighted)
    np.testing.assert_allclose(out, np.r_[4.0 * np.asarray(base[:4]), base[4:]])
    assert out[0] != 0.0


def test_weights_apply_without_normalization_too():
    samples = group([1.0, 0.0], g=0, weight=2.0)
    _, rewards = post_process_rewards(make_args(rewards_normalization=False), samples)
    assert rewards == [2.0, 0.0]


def test_weight_with_normalize_advantages_is_refused():
    with pytest.raises(ValueError, match="--normalize-advantages"):
        post_process_rewards(
            make_args(normalize_advantages=True), group([1.0, 0.0], g=0, weight=2.0)
        )


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "ppo", "cispo"])
def test_weight_with_another_estimator_is_refused(estimator):
    with pytest.raises(ValueError, match="allowed: grpo, gspo"):
        post_process_rewards(
            make_args(advantage_estimator=estimator), group([1.0, 0.0], g=0, weight=2.0)
        )


def test_unit_weights_are_accepted_with_normalize_advantages():
    _, rewards = post_process_rewards(
        make_args(normalize_advantages=True), group([1.0, 0.0], g=0, weight=1.0)
    )
    np.testing.assert_allclose(rewards, grpo([1.0, 0.0]))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "heavy", None])
def test_invalid_weights_are_an_error_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"sample 0: metadata\['rescue_weight'\]"):
        post_process_rewards(make_args(), group([1.0, 0.0], g=0, weight=bad))


# ---------------------------------------------------------------- against Miles' own code


def _miles():
    require_miles()
    from miles.ray.rollout import train_data_conversion
    from miles.utils.types import Sample

    return train_data_conversion, Sample


def _random_batch(rng, Sample, kind):
    """Groups of 1-16 rollouts; some rollouts split into sibling samples sharing rollout_id."""
    samples, index = [], 0
    for g in rng.permutation(50)[: rng.integers(1, 7)]:
        for _ in range(rng.integers(1, 17)):
            if kind == "binary":
                r = float(rng.integers(0, 2))
            elif kind == "scaled":
                r = float(rng.normal() * 10.0 ** rng.integers(-3, 3))
            else:
                r = float(rng.random())
            rid = index
            for _ in range(rng.integers(1, 3)):
                samples.append(Sample(group_index=int(g), index=index, rollout_id=rid, reward=r))
                index += 1
    return samples


def _float32_tolerance(samples, miles_rewards, args):
    """Miles computes in torch float32, the hook in float64.

    Each float32 step rounds with relative error u = 2^-24: the rewards themselves, the
    mean (a sum of n terms, error <= n·u·max|R|), the difference, the std and the quotient.
    The absolute error of (R - mean)/(σ + 1e-6) is therefore at most about
    (n + 4)·u·max|R| / (σ + 1e-6) plus u·|A|. We allow twice that, per group.
    """
    u = 2.0**-24
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group_index, []).append(i)
    tol = np.zeros(len(samples))
    for rows in groups.values():
        per_rollout = {samples[i].rollout_id: samples[i].reward for i in rows}
        r = np.array(list(per_rollout.values()))
        sd = r.std(ddof=1) if len(r) > 1 else 0.0
        scale = (sd + 1e-6) if (args.grpo_std_normalization and sd > 0) else 1.0
        for i in rows:
            tol[i] = 2 * ((len(r) + 4) * u * np.abs(r).max() / scale + u * abs(miles_rewards[i]))
    return tol


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize("kind", ["binary", "scaled", "uniform"])
def test_matches_miles_post_process_rewards(kind, std):
    tdc, Sample = _miles()
    args = make_args(grpo_std_normalization=std)
    rng = np.random.default_rng(["binary", "scaled", "uniform"].index(kind) * 2 + std)
    for _ in range(40):
        samples = _random_batch(rng, Sample, kind)
        miles_raw, miles_rewards = tdc._post_process_rewards(args, samples, None)
        raw, rewards = post_process_rewards(args, samples)
        assert raw == miles_raw
        diff = np.abs(np.asarray(rewards) - np.asarray(miles_rewards))
        assert np.all(diff <= _float32_tolerance(samples, miles_rewards, args))


@pytest.mark.parametrize(
    "estimator", ["gspo", "reinforce_plus_plus_baseline", "reinforce_plus_plus", "ppo"]
)
def test_matches_miles_for_every_estimator(estimator):
    tdc, Sample = _miles()
    args = make_args(advantage_estimator=estimator)
    samples = _random_batch(np.random.default_rng(3), Sample, "binary")
    _, miles_rewards = tdc._post_process_rewards(args, samples, None)
    _, rewards = post_process_rewards(args, samples)
    np.testing.assert_allclose(rewards, miles_rewards, rtol=1e-6, atol=1e-6)


def _train_samples(Sample, rewards, *, weights=None, removed=()):
    out = []
    for k, r in enumerate(rewards):
        s = Sample(group_index=k // 4, index=k, reward=r, tokens=[1, 2, 3, 4, 5], response_length=3)
        s.status = Sample.Status.COMPLETED
        s.remove_sample = k in removed
        if weights is not None:
            s.metadata["rescue_weight"] = weights[k]
        out.append(s)
    return out


def test_through_miles_convert_samples_to_train_data(monkeypatch):
    tdc, Sample = _miles()
    args = make_args(use_dynamic_global_batch_size=False)
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    ours = tdc.convert_samples_to_train_data(
        args, _train_samples(Sample, rewards), {}, None, post_process_rewards
    )
    theirs = tdc.convert_samples_to_train_data(
        args, _train_samples(Sample, rewards), {}, None, None
    )
    assert ours.keys() == theirs.keys()
    np.testing.assert_allclose(ours["rewards"], theirs["rewards"], rtol=1e-6)
    assert ours["raw_reward"] == theirs["raw_reward"] == rewards

    # A protected group (weight 1/a = 4) and masked rows: weights after normalization,
    # masked rows still vote (RESCUE_BASELINE=all) and get a zero loss mask.
    weights = [4.0] * 4 + [1.0] * 4
    weighted = tdc.convert_samples_to_train_data(
        args,
        _train_samples(Sample, rewards, weights=weights, removed={1}),
        {},
        None,
        post_process_rewards,
    )
    np.testing.assert_allclose(
        weighted["rewards"], np.asarray(theirs["rewards"]) * weights, rtol=1e-6
    )
    assert weighted["loss_masks"][1] == [0, 0, 0] and weighted["loss_masks"][0] == [1, 1, 1]

    monkeypatch.setenv(ENV_BASELINE, "survivors")
    survivors = tdc.convert_samples_to_train_data(
        args, _train_samples(Sample, rewards, removed={1, 2}), {}, None, post_process_rewards
    )
    # Group 0 survivors {1, 1}: b = 1, σ = 0, so A = R - 1 for every member.
    np.testing.assert_allclose(survivors["rewards"][:4], [0.0, -1.0, -1.0, 0.0])
    np.testing.assert_allclose(survivors["rewards"][4:], theirs["rewards"][4:], rtol=1e-6)
