"""RESCUE_ESTIMATOR=turn and RESCUE_TRUNCATED_REWARD in the reward hook, without Miles."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from fake_sample import Sample as FakeSample
from fake_sample import check_against
from hypothesis import given, settings
from hypothesis import strategies as st

from rescue.advantages import per_token_advantages
from rescue.miles.reward import post_process_rewards
from rescue.reward import ENV_TRUNCATED_REWARD, zero_budget_failures
from rescue.turn_reward import (
    ENV_ESTIMATOR,
    ENV_KAPPA,
    ENV_TURN_TOKENS,
    MILES_LOSS_PATH,
    SLIME_ADVANTAGE_PATH,
)
from rescue.turns import mask_turn_spans, turn_spans


@dataclass
class MilesSample(FakeSample):
    """Miles' ``Sample`` as rescue's stand-in has it, plus the per-token channel Miles has."""

    opd_reverse_kl: list[float] | None = None


@dataclass
class SlimeSample(FakeSample):
    """slime's ``Sample``: ``teacher_log_probs``, and no ``opd_reverse_kl``."""

    teacher_log_probs: list[float] | None = None


def test_the_channel_fields_are_the_frameworks():
    """Miles' Sample has ``opd_reverse_kl`` (default None) and slime's has only
    ``teacher_log_probs``: the hook tells them apart by that field."""
    import dataclasses

    from miles_env import require_miles, require_slime

    require_miles()
    from miles.utils.types import Sample as Miles

    fields = {f.name: f.default for f in dataclasses.fields(Miles)}
    assert fields["opd_reverse_kl"] is None and fields["teacher_log_probs"] is None
    assert check_against(Miles) == []
    require_slime()
    from slime.utils.types import Sample as Slime

    fields = {f.name: f.default for f in dataclasses.fields(Slime)}
    assert "opd_reverse_kl" not in fields and fields["teacher_log_probs"] is None


def ms(reward, g, index, rid, n, mask, versions):
    """A completed Miles sample by position: reward, group, index, rollout id, length,
    loss mask, weight versions."""
    return MilesSample(
        reward=reward,
        group_index=g,
        index=index,
        rollout_id=rid,
        response_length=n,
        loss_mask=mask,
        weight_versions=versions,
        status=MilesSample.Status.COMPLETED,
    )


def make_args(**overrides):
    base = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=1,
        use_opd=False,
        loss_type="custom_loss",
        custom_loss_function_path=MILES_LOSS_PATH,
        object_store_backend="ray",
    )
    return SimpleNamespace(**{**base, **overrides})


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in (
        ENV_ESTIMATOR,
        ENV_KAPPA,
        ENV_TURN_TOKENS,
        ENV_TRUNCATED_REWARD,
        "RESCUE_BASELINE",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def turn(monkeypatch):
    monkeypatch.setenv(ENV_ESTIMATOR, "turn")


def multi_turn(rewards, masks, *, g=0, cls=MilesSample, calls=None):
    out = []
    for k, (r, m) in enumerate(zip(rewards, masks, strict=True)):
        n_runs = len(mask_turn_spans(m).starts)
        out.append(
            cls(
                reward=r,
                group_index=g,
                index=100 * g + k,
                response_length=len(m),
                loss_mask=list(m),
                weight_versions=["0"] * (n_runs if calls is None else calls[k]),
                status=cls.Status.COMPLETED,
            )
        )
    return out


MASKS = [[1, 1, 0, 1, 0, 1], [1, 1, 1], [1, 0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 1]]
REWARDS = [1.0, 0.0, 1.0, 0.0]


def reference(rewards, masks, **kwargs):
    turns = []
    for m in masks:
        ell, t = 0, []
        for k, v in enumerate(m):
            ell += v == 1 and (k == 0 or m[k - 1] == 0)
            t.append(ell if v else 0)
        turns.append(np.asarray(t, dtype=np.int64))
    lengths = [int(t.max(initial=0)) for t in turns]
    return per_token_advantages(np.asarray(rewards), np.asarray(lengths), turns, **kwargs)


def test_turn_estimator_writes_per_token_advantages_and_zero_scalars(turn):
    samples = multi_turn(REWARDS, MASKS)
    raw, rewards = post_process_rewards(make_args(), samples)
    assert raw == REWARDS and rewards == [0.0] * 4
    for s, want in zip(samples, reference(REWARDS, MASKS, std_normalize=True), strict=True):
        np.testing.assert_array_equal(s.opd_reverse_kl.numpy(), want)


def test_group_estimator_leaves_the_channel_alone():
    samples = multi_turn(REWARDS, MASKS)
    _, rewards = post_process_rewards(make_args(), samples)
    assert all(s.opd_reverse_kl is None for s in samples) and any(rewards)


def test_std_off_and_kappa_are_read(turn, monkeypatch):
    monkeypatch.setenv(ENV_KAPPA, "0.5")
    samples = multi_turn(REWARDS, MASKS)
    post_process_rewards(make_args(grpo_std_normalization=False), samples)
    want = reference(REWARDS, MASKS, std_normalize=False, kappa=0.5)
    for s, w in zip(samples, want, strict=True):
        np.testing.assert_array_equal(s.opd_reverse_kl.numpy(), w)
    other = reference(REWARDS, MASKS, std_normalize=False, kappa=2.0)
    assert not all(np.array_equal(a, b) for a, b in zip(want, other, strict=True))


def test_weights_multiply_after_normalization(turn):
    samples = multi_turn(REWARDS, MASKS)
    for s in samples:
        s.metadata["rescue_weight"] = 4.0
    post_process_rewards(make_args(), samples)
    want = reference(REWARDS, MASKS, std_normalize=True)
    for s, w in zip(samples, want, strict=True):
        np.testing.assert_allclose(s.opd_reverse_kl.numpy(), 4.0 * w, rtol=1e-6)


def test_siblings_continue_the_turn_index(turn):
    # Rollout 7 = two samples; its turns 1-2 are in the first, 3 in the second.
    a = ms(1.0, 0, 0, 7, 5, [1, 0, 1, 1, 0], ["0", "0"])
    b = ms(1.0, 0, 1, 7, 2, [1, 1], ["1"])
    others = multi_turn([0.0, 1.0], [[1, 0, 1, 0, 1], [1]], g=0)
    for k, s in enumerate(others):
        s.index, s.rollout_id = 10 + k, 10 + k
    post_process_rewards(make_args(), [a, b, *others])
    want = reference(
        [1.0, 0.0, 1.0],
        [a.loss_mask + b.loss_mask, *[s.loss_mask for s in others]],
        std_normalize=True,
    )
    np.testing.assert_array_equal(
        np.r_[a.opd_reverse_kl.numpy(), b.opd_reverse_kl.numpy()], want[0]
    )


def test_single_turn_groups_use_token_chunks(turn, monkeypatch):
    monkeypatch.setenv(ENV_TURN_TOKENS, "3")
    lengths = [7, 2, 5, 9]
    samples = [
        ms(r, 0, k, None, n, None, ["0"])
        for k, (r, n) in enumerate(zip(REWARDS, lengths, strict=True))
    ]
    post_process_rewards(make_args(), samples)
    turns = [np.arange(n) // 3 + 1 for n in lengths]
    want = per_token_advantages(
        np.asarray(REWARDS), np.asarray([t.max() for t in turns]), turns, std_normalize=True
    )
    for s, w in zip(samples, want, strict=True):
        np.testing.assert_array_equal(s.opd_reverse_kl.numpy(), w)
    # Another chunk size gives another answer: the setting is read.
    monkeypatch.setenv(ENV_TURN_TOKENS, "4")
    post_process_rewards(make_args(), samples)
    assert not np.array_equal(samples[3].opd_reverse_kl.numpy(), want[3])


def test_runs_disagreeing_with_model_calls_is_an_error_naming_the_sample(turn):
    samples = multi_turn(REWARDS, MASKS, calls=[3, 1, 3, 2])  # sample 2 has 2 runs, 3 calls
    with pytest.raises(
        ValueError, match=r"sample 2 \(group_index=0, index=2.*2 runs of 1s but 3 model calls"
    ):
        post_process_rewards(make_args(), samples)


def test_siblings_with_different_rewards_are_an_error(turn):
    a = ms(1.0, 0, 0, 7, 2, [1, 1], ["0"])
    b = ms(0.0, 0, 1, 7, 2, [1, 1], ["0"])
    with pytest.raises(ValueError, match="must share one reward"):
        post_process_rewards(make_args(), [a, b, *multi_turn([0.0], [[1, 0, 1]])])


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"use_opd": True}, "--use-opd"),
        ({"normalize_advantages": True}, "--normalize-advantages"),
        (
            {"loss_type": "policy_loss"},
            f"--loss-type custom_loss --custom-loss-function-path {MILES_LOSS_PATH}",
        ),
        ({"custom_loss_function_path": "x.y"}, "--custom-loss-function-path"),
        ({"advantage_estimator": "ppo"}, "--advantage-estimator ppo"),
        ({"rewards_normalization": False}, "--disable-rewards-normalization"),
    ],
)
def test_misconfigured_runs_stop_at_the_first_call_naming_the_flag(turn, overrides, flag):
    with pytest.raises(ValueError, match=flag.replace("-", r"\-").replace(".", r"\.")):
        post_process_rewards(make_args(**overrides), multi_turn(REWARDS, MASKS))


def test_slime_samples_use_teacher_log_probs_and_slimes_advantage_hook(turn):
    args = make_args(custom_advantage_function_path=SLIME_ADVANTAGE_PATH)
    samples = multi_turn(REWARDS, MASKS, cls=SlimeSample)
    post_process_rewards(args, samples)
    np.testing.assert_array_equal(
        samples[0].teacher_log_probs.numpy(), reference(REWARDS, MASKS, std_normalize=True)[0]
    )
    with pytest.raises(
        ValueError, match=f"--custom-advantage-function-path {SLIME_ADVANTAGE_PATH}"
    ):
        post_process_rewards(make_args(), multi_turn(REWARDS, MASKS, cls=SlimeSample))


def test_mooncake_store_gets_plain_lists(turn):
    samples = multi_turn(REWARDS, MASKS)
    post_process_rewards(make_args(object_store_backend="mooncake"), samples)
    assert isinstance(samples[0].opd_reverse_kl, list) and len(samples[0].opd_reverse_kl) == 6


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        (ENV_ESTIMATOR, "loo", "group, turn"),
        (ENV_KAPPA, "-1", ">= 0"),
        (ENV_TURN_TOKENS, "0", ">= 1"),
    ],
)
def test_bad_settings_are_errors_naming_them(turn, monkeypatch, name, value, allowed):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}=.*{allowed}"):
        post_process_rewards(make_args(), multi_turn(REWARDS, MASKS))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=60))
def test_mask_turn_spans_equals_turn_spans(mask):
    a, b = mask_turn_spans(mask), turn_spans(np.asarray(mask, dtype=np.int64))
    assert a.n_tokens == b.n_tokens
    np.testing.assert_array_equal(a.starts, b.starts)
    np.testing.assert_array_equal(a.stops, b.stops)


@pytest.mark.parametrize("bad", [[0, 2], [1, 0.5], [1, None]])
def test_mask_turn_spans_rejects_values_other_than_0_and_1(bad):
    with pytest.raises(ValueError, match="token 1; allowed: 0"):
        mask_turn_spans(bad)


# ---------------------------------------------------------------- R = 0 on truncation


def truncated_batch():
    s = [ms(r, 0, k, None, 1, [1], ["0"]) for k, r in enumerate([1.0, 1.0, 0.0, 0.0])]
    s[0].status = MilesSample.Status.TRUNCATED  # graded 1 on the cut text
    s[2].status = MilesSample.Status.TRUNCATED  # already 0
    return s


def test_truncated_reward_zero_scores_budget_failures_zero_before_normalization(monkeypatch):
    monkeypatch.setenv(ENV_TRUNCATED_REWARD, "zero")
    samples = truncated_batch()
    raw, rewards = post_process_rewards(make_args(), samples)
    assert raw == [0.0, 1.0, 0.0, 0.0]
    r = np.array(raw)
    np.testing.assert_allclose(rewards, (r - r.mean()) / (r.std(ddof=1) + 1e-6))


def test_truncated_reward_keep_is_the_default():
    raw, _ = post_process_rewards(make_args(), truncated_batch())
    assert raw == [1.0, 1.0, 0.0, 0.0]


def test_zeroed_count_counts_rollouts_whose_reward_changed():
    samples = truncated_batch()
    rewards, zeroed = zero_budget_failures([0] * 4, samples, [1.0, 1.0, 0.0, 0.0], setting="zero")
    assert rewards == [0.0, 1.0, 0.0, 0.0] and zeroed == 1
    with pytest.raises(ValueError, match="RESCUE_TRUNCATED_REWARD='drop'; allowed: keep, zero"):
        zero_budget_failures([0] * 4, samples, [1.0] * 4, setting="drop")


def test_truncated_reward_zero_applies_under_the_turn_estimator(turn, monkeypatch):
    monkeypatch.setenv(ENV_TRUNCATED_REWARD, "zero")
    samples = multi_turn(REWARDS, MASKS)
    samples[2].status = MilesSample.Status.TRUNCATED
    raw, _ = post_process_rewards(make_args(), samples)
    assert raw == [1.0, 0.0, 0.0, 0.0]
    want = reference(raw, MASKS, std_normalize=True)
    np.testing.assert_array_equal(samples[0].opd_reverse_kl.numpy(), want[0])


def test_survivors_population_lets_only_unmasked_rollouts_vote(turn, monkeypatch):
    monkeypatch.setenv("RESCUE_BASELINE", "survivors")
    samples = multi_turn(REWARDS, MASKS)
    samples[1].remove_sample = True
    post_process_rewards(make_args(), samples)
    kept = [0, 2, 3]
    want = reference([REWARDS[i] for i in kept], [MASKS[i] for i in kept], std_normalize=True)
    for i, w in zip(kept, want, strict=True):
        np.testing.assert_array_equal(samples[i].opd_reverse_kl.numpy(), w)
    assert not samples[1].opd_reverse_kl.numpy().any()
