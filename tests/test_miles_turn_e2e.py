"""End to end on the CPU with the real Miles source: samples -> the reward hook ->
Miles' convert -> its DP split and shards -> get_rollout_data (CP slicing) ->
compute_advantages_and_returns -> micro-batches -> Miles' loss_function -> rescue's loss ->
Miles' policy_loss_function. The advantages that reach policy_loss_function must equal
``rescue.advantages.per_token_advantages`` on the same data, computed here from turn
indices this test derives itself (float32 tolerance)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from miles_env import require_miles

from rescue.advantages import per_token_advantages

KAPPA = 2.0
CHUNK = 5  # RESCUE_TURN_TOKENS for the single-turn group


def _miles():
    require_miles()
    import torch  # noqa: F401  (the integration extra)
    from miles.utils.types import Sample

    return Sample


def make_args(**overrides):
    base = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=3,
        use_dynamic_global_batch_size=False,
        global_batch_size=6,
        micro_batch_size=1,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=24,
        balance_data=False,
        balance_by_flops=False,
        allow_partial_train_step=False,
        delay_split_train_data_by_dp=False,
        enable_witness=False,
        qkv_format="thd",
        true_on_policy_mode=False,
        skip_actor_forward_only=False,
        use_rollout_logprobs=False,
        kl_coef=0.0,
        use_opd=False,
        opd_kl_coef=1.0,
        loss_type="custom_loss",
        custom_loss_function_path="rescue.miles.loss.policy_loss",
        custom_megatron_before_train_step_hook_path="rescue.miles.train_step.before_train_step",
        object_store_backend="ray",
        data_pad_size_multiplier=1,
        allgather_cp=False,
        calculate_per_token_loss=False,
        recompute_loss_function=False,
        entropy_coef=0.0,
        observe_training_entropy=False,
        rollout_temperature=1.0,
        log_probs_chunk_size=-1,
        use_opsm=False,
        eps_clip=0.2,
        eps_clip_high=0.28,
        eps_clip_c=None,
        get_mismatch_metrics=False,
        use_tis=False,
        custom_pg_loss_reducer_function_path=None,
        use_kl_loss=False,
        kl_loss_type="k1",
        use_unbiased_kl=False,
        dump_details=None,
        multi_lora=False,
    )
    return SimpleNamespace(**{**base, **overrides})


def _sample(Sample, *, g, index, rid, reward, mask, calls, prompt=3, status="completed"):
    n = len(mask)
    s = Sample(
        group_index=g,
        index=index,
        rollout_id=rid,
        reward=reward,
        tokens=list(range(1, prompt + n + 1)),
        response_length=n,
        loss_mask=list(mask),
        weight_versions=[str(v) for v in range(calls)],
    )
    s.status = Sample.Status(status)
    return s


def runs(*segments):
    """A loss mask from (ones, zeros) pairs: runs of 1s (turns) and 0s (observations)."""
    mask = []
    for ones, zeros in segments:
        mask += [1] * ones + [0] * zeros
    return mask


def build_batch(Sample):
    """Group 0: merged multi-turn samples; group 1: a rollout split into sibling samples;
    group 2: single-turn samples (one model call, chunked by CHUNK tokens)."""
    samples = []
    # group 0: 4 rollouts, turns 3, 1, 2, 3
    g0 = [
        (1.0, runs((4, 2), (3, 1), (2, 0))),
        (0.0, runs((6, 0))),
        (1.0, runs((2, 3), (5, 0))),
        (0.0, runs((1, 1), (1, 1), (3, 2))),
    ]
    for k, (r, m) in enumerate(g0):
        samples.append(_sample(Sample, g=0, index=k, rid=k, reward=r, mask=m, calls=_n_runs(m)))
    # group 1: rollout 10 is two siblings (2 turns + 2 turns); others single samples.
    samples.append(
        _sample(Sample, g=1, index=4, rid=10, reward=1.0, mask=runs((3, 2), (2, 1)), calls=2)
    )
    samples.append(
        _sample(Sample, g=1, index=5, rid=10, reward=1.0, mask=runs((2, 1), (4, 0)), calls=2)
    )
    samples.append(
        _sample(Sample, g=1, index=6, rid=11, reward=0.0, mask=runs((5, 1), (1, 0)), calls=2)
    )
    samples.append(
        _sample(
            Sample, g=1, index=7, rid=12, reward=0.5, mask=runs((2, 2), (2, 2), (2, 0)), calls=3
        )
    )
    samples.append(_sample(Sample, g=1, index=8, rid=13, reward=0.0, mask=runs((7, 0)), calls=1))
    # group 2: single-turn, response lengths 12, 3, 9, 17 (chunks of CHUNK tokens)
    for k, (r, n) in enumerate([(1.0, 12), (0.0, 3), (0.0, 9), (1.0, 17)]):
        samples.append(
            _sample(Sample, g=2, index=20 + k, rid=20 + k, reward=r, mask=[1] * n, calls=1)
        )
    return samples


def _n_runs(mask):
    return sum(1 for t, v in enumerate(mask) if v == 1 and (t == 0 or mask[t - 1] == 0))


def expected_advantages(samples, *, std, weights=None, population="all"):
    """Per sample, the per-token advantages from ``per_token_advantages`` on turn indices
    derived here: runs of 1s numbered across siblings (0 between them), or CHUNK-token
    chunks for a group whose rollouts all made one model call."""
    rollouts: dict[tuple, list[int]] = {}
    for i, s in enumerate(samples):
        rollouts.setdefault((s.group_index, s.rollout_id), []).append(i)
    groups: dict[int, list[list[int]]] = {}
    for (g, _), rows in rollouts.items():
        groups.setdefault(g, []).append(rows)
    out = [None] * len(samples)
    for members in groups.values():
        single = all(sum(len(samples[i].weight_versions) for i in rows) <= 1 for rows in members)
        R, L, T, W, P = [], [], [], [], []
        for rows in members:
            turns, ell = [], 0
            pos = 0
            for i in rows:
                m = samples[i].loss_mask
                for t, v in enumerate(m):
                    if single:
                        turns.append(pos // CHUNK + 1)
                    else:
                        if v == 1 and (t == 0 or m[t - 1] == 0):
                            ell += 1
                        turns.append(ell if v == 1 else 0)
                    pos += 1
            present = population == "all" or not all(samples[i].remove_sample for i in rows)
            turns = np.asarray(turns, dtype=np.int64) * present  # an absent rollout: all 0
            R.append(samples[rows[0]].reward)
            L.append(int(turns.max(initial=0)))
            T.append(turns)
            W.append(1.0 if weights is None else weights[rows[0]])
            P.append(present)
        A = per_token_advantages(
            np.asarray(R),
            np.asarray(L),
            T,
            kappa=KAPPA,
            std_normalize=std,
            weights=np.asarray(W),
            present=np.asarray(P),
        )
        for rows, a in zip(members, A, strict=True):
            start = 0
            for i in rows:
                n = samples[i].response_length
                out[i] = a[start : start + n]
                start += n
    return out


@pytest.fixture
def turn_env(monkeypatch):
    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    monkeypatch.setenv("RESCUE_KAPPA", str(KAPPA))
    monkeypatch.setenv("RESCUE_TURN_TOKENS", str(CHUNK))
    monkeypatch.delenv("RESCUE_BASELINE", raising=False)
    monkeypatch.delenv("RESCUE_TRUNCATED_REWARD", raising=False)


def run_pipeline(args, samples, *, dp_size, cp_size, spy):
    """Miles' rollout side, then every DP x CP rank's train side; returns what the loss saw
    per (dp, cp) rank: a list of (sample index, advantages, loss mask) per micro-batch sample."""
    import torch
    from megatron_cpu import cpu_patch, gloo_world, local_object_store, miles_parallel_state
    from miles.backends.training_utils import data as train_data_utils
    from miles.backends.training_utils.cp_utils import slice_log_prob_with_cp
    from miles.backends.training_utils.loss import compute_advantages_and_returns, loss_function
    from miles.ray.rollout import train_data_conversion as tdc

    from rescue.miles.reward import post_process_rewards
    from rescue.miles.train_step import MOMENTS

    train_data = tdc.convert_samples_to_train_data(args, samples, {}, None, post_process_rewards)
    config = {
        "dp_size": dp_size,
        "cp_size": cp_size,
        "vpp_size": 1,
        "microbatch_group_size_per_vp_stage": None,
    }
    seen = []
    with gloo_world(), cpu_patch(), local_object_store():
        refs = tdc.split_train_data_by_dp(args, train_data, config)
        for dp in range(dp_size):
            for cp in range(cp_size):
                MOMENTS.reset()
                with miles_parallel_state(cp_rank=cp, cp_size=cp_size, dp_rank=dp, dp_size=dp_size):
                    rollout_data, _ = train_data_utils.get_rollout_data(args, refs)
                    # The old-policy log-probs a forward pass would give: CP-local shapes.
                    rollout_data["log_probs"] = [
                        torch.as_tensor(
                            slice_log_prob_with_cp([0.0] * r, t, r), dtype=torch.float32
                        )
                        for t, r in zip(
                            rollout_data["total_lengths"],
                            rollout_data["response_lengths"],
                            strict=True,
                        )
                    ]
                    compute_advantages_and_returns(args, rollout_data)
                    iterators, num_microbatches = train_data_utils.get_data_iterator(
                        args, None, rollout_data
                    )
                    it = iterators[0]
                    for step, n_mb in enumerate(num_microbatches):
                        for _ in range(n_mb):
                            indices = it.micro_batch_indices[it.offset]
                            batch = train_data_utils.get_batch(
                                it,
                                [
                                    "tokens",
                                    "total_lengths",
                                    "response_lengths",
                                    "loss_masks",
                                    "log_probs",
                                    "advantages",
                                    "opd_reverse_kl",
                                    "rollout_mask_sums",
                                ],
                                args.data_pad_size_multiplier,
                                args.qkv_format,
                                allgather_cp=args.allgather_cp,
                            )
                            vocab = 11
                            logits = torch.randn(
                                1, batch["tokens"].shape[1], vocab, requires_grad=True
                            )
                            batch["tokens"] = batch["tokens"] % vocab
                            batch["unconcat_tokens"] = [t % vocab for t in batch["unconcat_tokens"]]
                            spy.calls.clear()
                            loss, _, _ = loss_function(
                                args,
                                batch,
                                n_mb,
                                logits,
                                apply_megatron_loss_scaling=True,
                                num_rollouts=rollout_data["num_rollouts"][step],
                            )
                            loss.backward()
                            (received,) = spy.calls
                            for j, a in zip(indices, received, strict=True):
                                index = int(rollout_data["sample_indices"][j])
                                seen.append(
                                    (dp, cp, index, a.detach().clone(), (dp, step, it.offset))
                                )
    return seen


class Spy:
    """Records the advantages Miles' policy_loss_function receives, then runs it."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, args, batch, logits, sum_of_sample_mean):
        self.calls.append([a.detach().clone() for a in batch["advantages"]])
        return self.real(args, batch, logits, sum_of_sample_mean)


@pytest.fixture
def spy(monkeypatch):
    _miles()
    from miles.backends.training_utils.loss_hub import losses

    s = Spy(losses.policy_loss_function)
    monkeypatch.setattr(losses, "policy_loss_function", s)
    return s


def _check(samples, seen, expected, *, cp_size):
    from miles.backends.training_utils.cp_utils import get_logits_and_tokens_offset_with_cp

    by_index = {s.index: i for i, s in enumerate(samples)}
    covered = {}
    for _dp, cp, sample_index, a, _mb in seen:
        i = by_index[sample_index]
        full = np.asarray(expected[i], dtype=np.float32)
        s = samples[i]
        n, total = s.response_length, len(s.tokens)
        if cp_size == 1:
            want = full
        else:
            _, _, logits_offset, _ = get_logits_and_tokens_offset_with_cp(
                total, n, "thd", None, cp_rank=cp, cp_size=cp_size
            )
            p = total - n
            want = np.concatenate([full[lo - (p - 1) : hi - (p - 1)] for lo, hi in logits_offset])
        # float32: the trainer adds 0 (the scalar part) to the float32 channel.
        np.testing.assert_allclose(
            a.numpy(), want, rtol=0, atol=1e-6 * max(1.0, np.abs(full).max())
        )
        covered[i] = covered.get(i, 0) + a.numel()
    assert sorted(covered) == list(range(len(samples)))
    assert all(covered[i] == samples[i].response_length for i in covered)


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize(("dp_size", "cp_size"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_trained_advantages_equal_per_token_advantages(turn_env, spy, std, dp_size, cp_size):
    Sample = _miles()
    samples = build_batch(Sample)
    expected = expected_advantages(samples, std=std)
    assert all(np.any(expected[i]) for i in (0, 4, 9))  # nothing trivially zero
    args = make_args(grpo_std_normalization=std)
    seen = run_pipeline(args, samples, dp_size=dp_size, cp_size=cp_size, spy=spy)
    _check(samples, seen, expected, cp_size=cp_size)
    assert len(seen) == len(samples) * cp_size
    # Group members were trained in different micro-batches (and, with DP, on different ranks).
    group_of = {s.index: s.group_index for s in samples}
    for g in (0, 1, 2):
        assert len({mb for _, _, index, _, mb in seen if group_of[index] == g}) > 1
    if dp_size > 1:
        assert {dp for dp, *_ in seen} == set(range(dp_size))


def test_weights_and_survivors_compose(turn_env, spy, monkeypatch):
    Sample = _miles()
    samples = build_batch(Sample)
    weights = [4.0 if s.group_index == 1 else 1.0 for s in samples]
    for s, w in zip(samples, weights, strict=True):
        s.metadata["rescue_weight"] = w
    samples[1].remove_sample = True  # a masked rollout of group 0
    monkeypatch.setenv("RESCUE_BASELINE", "survivors")
    expected = expected_advantages(samples, std=True, weights=weights, population="survivors")
    seen = run_pipeline(make_args(), samples, dp_size=2, cp_size=1, spy=spy)
    _check(samples, seen, expected, cp_size=1)
    assert not np.any(expected[1])  # the masked rollout neither votes nor trains


def test_group_estimator_trains_the_group_advantages_through_the_same_loss(spy, monkeypatch):
    """RESCUE_ESTIMATOR=group with rescue's loss: no channel, Miles' broadcast scalar."""
    Sample = _miles()
    monkeypatch.delenv("RESCUE_ESTIMATOR", raising=False)
    from rescue.miles.reward import post_process_rewards

    samples = build_batch(Sample)
    _, scalars = post_process_rewards(make_args(), build_batch(Sample))
    expected = [
        np.full(s.response_length, r, dtype=np.float32)
        for s, r in zip(samples, scalars, strict=True)
    ]
    seen = run_pipeline(make_args(), samples, dp_size=2, cp_size=2, spy=spy)
    _check(samples, seen, expected, cp_size=2)
    assert all(s.opd_reverse_kl is None for s in samples)
