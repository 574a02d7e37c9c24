"""The turn-reached advantages in slime, with the real slime source on a CPU: slime
``Sample``s -> rescue's reward hook -> the per-sample ``teacher_log_probs`` list slime's
conversion packages (``slime/ray/rollout.py``: ``[s.teacher_log_probs for s in samples]``) ->
slime's actor-side CP slicing -> slime's ``compute_advantages_and_returns`` ->
``--custom-advantage-function-path rescue.slime.advantages.turn_advantages``."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
from miles_env import require_slime

from rescue.advantages import per_token_advantages
from rescue.slime.advantages import ADVANTAGE_PATH


@contextlib.contextmanager
def megatron_world():
    from megatron.core import mpu
    from megatron_cpu import cpu_patch, gloo_world

    with gloo_world(), cpu_patch():
        mpu.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            mpu.destroy_model_parallel()


def make_args(**overrides):
    base = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=3,
        rollout_batch_size=1,
        use_opd=False,
        use_rollout_logprobs=False,
        kl_coef=0.0,
        custom_advantage_function_path=ADVANTAGE_PATH,
    )
    return SimpleNamespace(**{**base, **overrides})


MASKS = [[1, 1, 0, 1, 0, 1], [1, 1, 1], [1, 0, 0, 1, 1, 0, 1]]
TURNS = [[1, 1, 0, 2, 0, 3], [1, 1, 1], [1, 0, 0, 2, 2, 0, 3]]
REWARDS = [1.0, 0.0, 0.5]


def slime_samples(Sample):
    out = []
    for k, (r, m, t) in enumerate(zip(REWARDS, MASKS, TURNS, strict=True)):
        s = Sample(
            group_index=0,
            index=k,
            reward=r,
            tokens=list(range(2 + len(m))),
            response_length=len(m),
            loss_mask=list(m),
            weight_versions=["0"] * max(t),
        )
        s.status = Sample.Status.COMPLETED
        out.append(s)
    return out


def slime_advantages(args, samples):
    import torch
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns

    from rescue.reward import post_process_rewards

    _, rewards = post_process_rewards(args, samples)
    channel = [s.teacher_log_probs for s in samples]  # slime's conversion
    with megatron_world():
        rollout_data = {
            "rewards": rewards,
            "response_lengths": [s.response_length for s in samples],
            "total_lengths": [len(s.tokens) for s in samples],
            "loss_masks": [torch.tensor(s.loss_mask, dtype=torch.int) for s in samples],
            "log_probs": [torch.zeros(s.response_length) for s in samples],
        }
        if channel[0] is not None:
            rollout_data["teacher_log_probs"] = [
                slice_log_prob_with_cp(c, t, n).to(dtype=torch.float32)
                for c, t, n in zip(
                    channel,
                    rollout_data["total_lengths"],
                    rollout_data["response_lengths"],
                    strict=True,
                )
            ]
        compute_advantages_and_returns(args, rollout_data)
    return rewards, rollout_data["advantages"]


@pytest.mark.parametrize("std", [True, False])
def test_slime_trains_the_turn_reached_advantages(monkeypatch, std):
    require_slime()
    from slime.utils.types import Sample

    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    args = make_args(grpo_std_normalization=std)
    rewards, advantages = slime_advantages(args, slime_samples(Sample))
    assert rewards == [0.0] * 3
    want = per_token_advantages(
        np.asarray(REWARDS),
        np.asarray([max(t) for t in TURNS]),
        [np.asarray(t) for t in TURNS],
        std_normalize=std,
    )
    for a, w in zip(advantages, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), w)
    assert any(np.any(w) for w in want)


def test_group_estimator_through_the_hook_is_slimes_grpo(monkeypatch):
    require_slime()
    from slime.utils.types import Sample

    monkeypatch.delenv("RESCUE_ESTIMATOR", raising=False)
    rewards, advantages = slime_advantages(make_args(), slime_samples(Sample))
    for r, a, m in zip(rewards, advantages, MASKS, strict=True):
        np.testing.assert_array_equal(a.numpy(), np.full(len(m), r, dtype=np.float32))


def test_use_opd_is_refused_naming_the_flags(monkeypatch):
    require_slime()
    from slime.utils.types import Sample

    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    with pytest.raises(ValueError, match="--use-opd"):
        slime_advantages(make_args(use_opd=True), slime_samples(Sample))
    from rescue.slime.advantages import turn_advantages

    with pytest.raises(ValueError, match=f"{ADVANTAGE_PATH} with --use-opd"):
        turn_advantages(make_args(use_opd=True), {"kl": [], "rewards": []})
