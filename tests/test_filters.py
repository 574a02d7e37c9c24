"""Sample filters: which trajectories get masked, and the random-fraction coin."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fake_sample import Sample
from miles_env import require_miles

import filters
from rescue.gate import coin
from rescue.mask import DEFAULT_MASK_RHO, ENV_MASK_RHO, mask_decision, rho_from_env
from rescue.outcomes import Classification, Outcome, classify, is_capped

ARGS = SimpleNamespace(reward_key=None)


S = Sample.Status


def graded(reward: Any = 0.0, status: Any = S.COMPLETED, **fields: Any) -> Sample:
    """A finished sample of group 0 with a grade (the filters see finished samples)."""
    return Sample(reward=reward, status=status, **{"group_index": 0, **fields})


CAPPED = Classification(Outcome.BUDGET_FAILURE, "turn_cap")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(ENV_MASK_RHO, raising=False)
    monkeypatch.delenv("RESCUE_SEED", raising=False)


def one_of_each():
    """One trajectory per kind; the first two are capped."""
    return [
        graded(status=S.TRUNCATED, reward=0.0, index=0),  # length limit
        graded(reward=0.0, metadata={"exit_status": "LimitsExceeded"}, index=1),  # turn cap
        graded(reward=0.0, metadata={"end_reason": "max_turns"}, index=2),  # OpenEnv turn cap
        graded(reward=0.0, metadata={"exit_status": "RepeatedFormatError"}, index=3),
        graded(reward=1.0, index=4),  # solved
        graded(reward=0.0, index=5),  # submitted failure
        graded(reward=0.0, metadata={"instance_id": "x"}, index=6),  # agent returned nothing
        graded(status=S.ABORTED, reward=None, index=7),
    ]


def test_mask_arm_masks_exactly_the_capped_trajectories():
    group = one_of_each()
    filters.mask_truncated_zero_reward(ARGS, [group])
    assert [s.remove_sample for s in group] == [True, True, True, False, False, False, False, False]


def test_mask_arm_keeps_rewards_and_groups_untouched():
    groups = [one_of_each(), one_of_each()]
    before = [[(s.reward, s.index, s.status) for s in g] for g in groups]
    filters.mask_truncated_zero_reward(ARGS, groups)
    assert [[(s.reward, s.index, s.status) for s in g] for g in groups] == before


def test_capped_means_what_the_classifier_says():
    group = one_of_each()
    filters.mask_truncated_zero_reward(ARGS, [group])
    for s in group:
        c = classify(status=s.status, reward=s.reward, metadata=s.metadata)
        assert s.remove_sample == is_capped(c)


def test_a_list_of_samples_trajectory_is_masked_as_one():
    capped = [graded(index=10 + k, rollout_id=10) for k in range(3)]
    capped[-1].status = S.TRUNCATED  # the merged status is the last turn's
    finished = [graded(index=20 + k, rollout_id=20, reward=1.0) for k in range(2)]
    group = [capped, finished, graded(status=S.TRUNCATED, index=30)]
    filters.mask_truncated_zero_reward(ARGS, [group])
    assert [s.remove_sample for s in capped] == [True, True, True]
    assert [s.remove_sample for s in finished] == [False, False]
    assert group[2].remove_sample


def test_filters_never_unmask():
    already = graded(reward=1.0, index=0, remove_sample=True)
    filters.mask_truncated_zero_reward(ARGS, [[already]])
    filters.mask_random_fraction(ARGS, [[already]])
    assert already.remove_sample


def test_a_dict_reward_needs_reward_key():
    s = graded(reward={"acc": 0.0}, status=S.TRUNCATED, index=0)
    filters.mask_truncated_zero_reward(SimpleNamespace(reward_key="acc"), [[s]])
    assert s.remove_sample
    with pytest.raises(ValueError, match="--reward-key"):
        filters.mask_truncated_zero_reward(SimpleNamespace(reward_key=None), [[s]])


def test_a_group_that_is_not_a_list_is_an_error():
    with pytest.raises(ValueError, match=r"groups\[0\] is a Sample"):
        filters.mask_truncated_zero_reward(ARGS, [graded()])


# ---------------------------------------------------------------- random fraction


def capped_group(n, start=0):
    return [graded(status=S.TRUNCATED, index=start + k) for k in range(n)]


def test_random_fraction_rate_converges_to_rho(monkeypatch):
    # n capped trajectories, each masked with probability rho by an independent coin:
    # the masked fraction has sd sqrt(rho(1-rho)/n); allow 5 sd.
    n = 4000
    for rho in (0.1, 0.5, 0.8):
        monkeypatch.setenv(ENV_MASK_RHO, str(rho))
        groups = [capped_group(8, start=8 * g) for g in range(n // 8)]
        filters.mask_random_fraction(ARGS, groups)
        masked = sum(s.remove_sample for g in groups for s in g)
        assert abs(masked / n - rho) < 5 * math.sqrt(rho * (1 - rho) / n)


def test_random_fraction_masks_only_capped_trajectories(monkeypatch):
    monkeypatch.setenv(ENV_MASK_RHO, "1")
    group = one_of_each()
    filters.mask_random_fraction(ARGS, [group])
    assert [s.remove_sample for s in group] == [True, True, True, False, False, False, False, False]
    monkeypatch.setenv(ENV_MASK_RHO, "0")
    group = one_of_each()
    filters.mask_random_fraction(ARGS, [group])
    assert not any(s.remove_sample for s in group)


def test_random_fraction_is_deterministic_and_matches_mask_decision(monkeypatch):
    monkeypatch.setenv(ENV_MASK_RHO, "0.3")
    monkeypatch.setenv("RESCUE_SEED", "5")
    first, second = capped_group(200), capped_group(200)
    filters.mask_random_fraction(ARGS, [first])
    filters.mask_random_fraction(ARGS, [second[100:], second[:100]])  # other grouping, same keys
    assert [s.remove_sample for s in first] == [s.remove_sample for s in second]
    assert [s.remove_sample for s in first] == [
        mask_decision(CAPPED, k, 0.3, 5) for k in range(200)
    ]


def test_random_fraction_keys_a_trajectory_on_its_rollout_id(monkeypatch):
    monkeypatch.setenv(ENV_MASK_RHO, "0.5")
    trajectories = [
        [graded(index=1000 + 2 * r + k, rollout_id=r, status=S.TRUNCATED) for k in range(2)]
        for r in range(100)
    ]
    filters.mask_random_fraction(ARGS, [trajectories])
    for r, turns in enumerate(trajectories):
        assert turns[0].remove_sample == turns[1].remove_sample == mask_decision(CAPPED, r, 0.5, 0)


def test_the_seed_changes_the_coin(monkeypatch):
    monkeypatch.setenv(ENV_MASK_RHO, "0.5")
    a, b = capped_group(200), capped_group(200)
    filters.mask_random_fraction(ARGS, [a])
    monkeypatch.setenv("RESCUE_SEED", "1")
    filters.mask_random_fraction(ARGS, [b])
    assert [s.remove_sample for s in a] != [s.remove_sample for s in b]


def test_mask_coin_is_independent_of_the_gate_coin_of_the_same_number():
    # Independent uniforms: the correlation has sd 1/sqrt(n); allow 5 sd. The mask key is
    # prefixed, so trajectory 17 and group 17 do not share a coin.
    n = 20_000
    mask = np.array([mask_decision(CAPPED, k, 0.5, 0) for k in range(n)], dtype=float)
    gate = np.array([coin(0, k) < 0.5 for k in range(n)], dtype=float)
    assert abs(np.corrcoef(mask, gate)[0, 1]) < 5 / math.sqrt(n)


def test_mask_decision_is_identical_in_another_process():
    keys = [0, 1, 17, "g-42", 10**12]
    here = [mask_decision(CAPPED, k, 0.5, 7) for k in keys]
    code = (
        "from rescue.mask import mask_decision\n"
        "from rescue.outcomes import Classification, Outcome\n"
        "c = Classification(Outcome.BUDGET_FAILURE, 'turn_cap')\n"
        f"print([mask_decision(c, k, 0.5, 7) for k in {keys!r}])"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert eval(there.stdout) == here


def test_mask_decision_never_masks_an_uncapped_trajectory():
    for c in (
        Classification(Outcome.SOLVED, "reward"),
        Classification(Outcome.SUBMITTED_FAILURE, "reward"),
        Classification(Outcome.INFRA_NO_RESULT, "aborted"),
        Classification(Outcome.BUDGET_FAILURE, "format"),
    ):
        assert not any(mask_decision(c, k, 1.0, 0) for k in range(50))


def test_rho_default_and_validation():
    assert rho_from_env({}) == DEFAULT_MASK_RHO == 0.5
    assert rho_from_env({ENV_MASK_RHO: " "}) == 0.5
    assert rho_from_env({ENV_MASK_RHO: "0.25"}) == 0.25
    for bad in ("1.5", "-0.1", "nan", "half"):
        with pytest.raises(ValueError, match=f"{ENV_MASK_RHO}='{bad}'.*allowed: 0 <= rho <= 1"):
            rho_from_env({ENV_MASK_RHO: bad})


def test_an_invalid_rho_fails_the_filter(monkeypatch):
    monkeypatch.setenv(ENV_MASK_RHO, "2")
    with pytest.raises(ValueError, match=ENV_MASK_RHO):
        filters.mask_random_fraction(ARGS, [capped_group(2)])


def test_an_invalid_seed_fails_the_filter(monkeypatch):
    monkeypatch.setenv("RESCUE_SEED", "abc")
    with pytest.raises(ValueError, match="RESCUE_SEED='abc'"):
        filters.mask_random_fraction(ARGS, [capped_group(2)])


# ---------------------------------------------------------------- on real Miles samples


def _miles():
    require_miles()
    from miles.ray.rollout import train_data_conversion
    from miles.utils.types import Sample

    return train_data_conversion, Sample


def test_filter_on_real_miles_samples_zeroes_their_loss_mask():
    tdc, Sample = _miles()

    def sample(index, status, reward, **metadata):
        s = Sample(
            group_index=index // 4,
            index=index,
            reward=reward,
            tokens=[1, 2, 3, 4],
            response_length=2,
        )
        s.status = status
        s.metadata.update(metadata)
        s.weight_versions = ["3"]
        return s

    S = Sample.Status
    groups = [
        [
            sample(0, S.TRUNCATED, 0.0),
            sample(1, S.COMPLETED, 1.0),
            sample(2, S.COMPLETED, 0.0, exit_status="LimitsExceeded"),
            sample(3, S.COMPLETED, 0.0),
        ],
        [
            [sample(4, S.COMPLETED, 0.0), sample(5, S.TRUNCATED, 0.0)],  # one trajectory, two turns
            sample(6, S.COMPLETED, 1.0, exit_status="Submitted"),
            sample(7, S.COMPLETED, 0.0, exit_status="RepeatedFormatError"),
        ],
    ]
    for s in groups[1][0]:
        s.rollout_id = 4
    filters.mask_truncated_zero_reward(SimpleNamespace(reward_key=None), groups)
    flat = [s for g in groups for t in g for s in (t if isinstance(t, list) else [t])]
    assert [s.remove_sample for s in flat] == [True, False, True, False, True, True, False, False]
    assert [s.reward for s in flat] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]

    args = SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=2,
        use_dynamic_global_batch_size=False,
    )
    data = tdc.convert_samples_to_train_data(args, flat, {}, None, None)
    assert [sum(m) for m in data["loss_masks"]] == [0, 2, 0, 2, 0, 0, 2, 2]
