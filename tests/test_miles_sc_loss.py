"""TIS + score centering through Miles' own loss path, on the CPU with the real Miles source.

Samples with recorded heads -> rescue's publication (``rescue.miles.log.publish_heads``)
-> Miles' convert, DP split and shards -> ``get_rollout_data`` (CP slicing) ->
``compute_advantages_and_returns`` -> micro-batches (``get_data_iterator``, ``get_batch``)
-> Miles' ``loss_function`` -> ``rescue.miles.sc_loss.policy_loss``.

The model is a bigram table ``θ [V, V]``: the logits at a position are ``θ[input token]``,
so every DP x CP layout computes them from the same ``θ``, and the sum over ranks and
micro-batches of the unscaled policy-gradient losses' gradients must equal the gradient of
one reference loss over whole samples, written here from the paper's formula
(``test_score_centering.reference_loss``) with the advantages derived by this file.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from miles_env import require_miles

V = 11  # vocabulary
K = 4  # head size
TEMPERATURE = 0.7
PROMPT = 3


def _miles():
    require_miles()
    import torch  # noqa: F401  (the integration extra)
    from miles.utils.types import Sample

    return Sample


def make_args(**overrides):
    from test_miles_turn_e2e import make_args as turn_args

    base = dict(
        custom_loss_function_path="rescue.miles.sc_loss.policy_loss",
        custom_generate_function_path="rescue.miles.topk.generate",
        custom_rollout_log_function_path="rescue.miles.log.log_rollout",
        rollout_temperature=TEMPERATURE,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        use_kl_loss=False,
        use_opsm=False,
        true_on_policy_mode=False,
        multi_lora=False,
        partial_rollout=False,
        use_session_server=False,
        sglang_speculative_algorithm=None,
        use_miles_router=False,
    )
    return turn_args(**{**base, **overrides})


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def runs(*segments):
    mask = []
    for ones, zeros in segments:
        mask += [1] * ones + [0] * zeros
    return mask


def build_samples(Sample, seed=0):
    """Three groups of four; multi-turn masks (0-runs are observations); one pair of
    samples with identical tokens but different sampled log-probs (another sampler)."""
    rng = np.random.default_rng(seed)
    masks = [
        runs((4, 2), (3, 0)), runs((6, 0)), runs((2, 3), (5, 0)), runs((9, 0)),
        runs((3, 1), (3, 0)), runs((5, 0)), runs((2, 2), (2, 2), (2, 0)), runs((7, 0)),
        runs((8, 0)), runs((4, 0)), runs((6, 1), (1, 0)), runs((8, 0)),
    ]  # fmt: skip
    rewards = [1, 0, 1, 0, 1, 0, 0.5, 0, 1, 1, 0, 0]
    samples = []
    for k, (mask, r) in enumerate(zip(masks, rewards, strict=True)):
        if k == 9:  # sample 9 repeats sample 8's tokens
            mask = list(samples[8].loss_mask)
        n = len(mask)
        tokens = [int(t) for t in rng.integers(0, V, size=PROMPT + n)]
        if k == 9:
            tokens = list(samples[8].tokens)
        sampled, positions, ids, lps = [], [], [], []
        for t in range(n):
            q = softmax(rng.normal(size=V) * 1.5 / TEMPERATURE)
            y = tokens[PROMPT + t]
            sampled.append(float(np.log(q[y])) if mask[t] else 0.0)
            if mask[t]:
                head = np.argsort(-q)[:K]
                positions.append(t)
                ids.append(head)
                lps.append(np.log(q[head]))
        from rescue.miles.topk import KEY, token_digest

        s = Sample(
            group_index=k // 4, index=k, rollout_id=k, reward=float(r), tokens=tokens,
            response_length=n, loss_mask=list(mask), rollout_log_probs=sampled,
            weight_versions=[str(v) for v in range(sum(
                1 for t, v in enumerate(mask) if v and (t == 0 or not mask[t - 1])))],
        )  # fmt: skip
        s.status = Sample.Status.COMPLETED
        s.metadata[KEY] = {
            "positions": np.asarray(positions, dtype=np.int32),
            "ids": np.asarray(ids, dtype=np.int32).reshape(-1, K),
            "logprobs": np.asarray(lps, dtype=np.float32).reshape(-1, K),
            "digest": token_digest(tokens),
        }
        samples.append(s)
    assert samples[8].tokens == samples[9].tokens
    assert samples[8].rollout_log_probs != samples[9].rollout_log_probs
    return samples


def group_advantages(samples, std=True):
    """GRPO's advantage by hand: (R - group mean) / (group std + 1e-6), std with n - 1."""
    out = []
    for s in samples:
        group = [x.reward for x in samples if x.group_index == s.group_index]
        sd = np.std(group, ddof=1) if std else 0.0
        out.append(np.full(s.response_length, (s.reward - np.mean(group)) / (sd + 1e-6)))
    return out


def reference_grad(samples, advantages, theta0, *, cap, divisor=None, temperature=TEMPERATURE):
    """∇θ of Σ_i (1/D_i) Σ_t -A_t s_t over whole samples, s_t from the paper's formula
    (the logits of a position: the bigram row of its input token, over the temperature)."""
    import torch
    from test_score_centering import reference_loss

    theta = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
    total = 0.0
    for s, adv in zip(samples, advantages, strict=True):
        if s.remove_sample:
            continue
        heads = s.metadata["rescue_topk"]
        row = {int(p): j for j, p in enumerate(heads["positions"])}
        d = divisor if divisor is not None else max(1, sum(s.loss_mask))
        prompt = len(s.tokens) - s.response_length
        for t, m in enumerate(s.loss_mask):
            if not m:
                continue
            y = s.tokens[prompt + t]
            logits = theta[s.tokens[prompt + t - 1]] / temperature
            head = heads["ids"][row[t]].astype(np.int64)
            q = np.full(theta0.shape[0], 1e-3)
            q[head] = np.exp(heads["logprobs"][row[t]].astype(np.float64))
            q[y] = np.exp(np.float64(np.float32(s.rollout_log_probs[t])))
            total = total + reference_loss(logits, q, y, head, float(adv[t]), cap) / d
    total.backward()
    return theta.grad.numpy()


def run_pipeline(args, samples, theta0, *, dp_size, cp_size, rollout_id=5):
    """Every DP x CP rank's micro-batches through Miles' loss_function; returns the sum of
    the unscaled policy-gradient losses' gradients in θ, and the logged figures."""
    import torch
    from megatron_cpu import cpu_patch, gloo_world, local_object_store, miles_parallel_state
    from miles.backends.training_utils import data as train_data_utils
    from miles.backends.training_utils.cp_utils import slice_log_prob_with_cp
    from miles.backends.training_utils.loss import compute_advantages_and_returns, loss_function
    from miles.ray.rollout import train_data_conversion as tdc

    from rescue.miles import topk_store
    from rescue.miles.log import publish_heads
    from rescue.miles.reward import post_process_rewards
    from rescue.miles.sc_loss import SC_STATS
    from rescue.miles.train_step import before_train_step

    topk_store._LOCAL.steps.clear()  # each run publishes afresh (the registry is per process)
    published = publish_heads(rollout_id, args, samples)
    hook = post_process_rewards if args._reward_hook else None
    train_data = tdc.convert_samples_to_train_data(args, samples, {}, None, hook)
    config = {"dp_size": dp_size, "cp_size": cp_size, "vpp_size": 1,
              "microbatch_group_size_per_vp_stage": None}  # fmt: skip
    theta = torch.tensor(theta0, dtype=torch.float32, requires_grad=True)
    grad = np.zeros_like(theta0)
    stats = np.zeros(5)
    keys = ["tokens", "total_lengths", "response_lengths", "loss_masks", "log_probs",
            "advantages", "opd_reverse_kl", "rollout_mask_sums", "rollout_log_probs"]  # fmt: skip
    with gloo_world(), cpu_patch(), local_object_store():
        refs = tdc.split_train_data_by_dp(args, train_data, config)
        for dp in range(dp_size):
            for cp in range(cp_size):
                with miles_parallel_state(cp_rank=cp, cp_size=cp_size, dp_rank=dp, dp_size=dp_size):
                    before_train_step(args, rollout_id, 0, None, None, None)
                    rollout_data, _ = train_data_utils.get_rollout_data(args, refs)
                    rollout_data["log_probs"] = [
                        torch.as_tensor(slice_log_prob_with_cp([0.0] * r, t, r), dtype=torch.float32)
                        for t, r in zip(rollout_data["total_lengths"], rollout_data["response_lengths"], strict=True)
                    ]  # fmt: skip
                    compute_advantages_and_returns(args, rollout_data)
                    iterators, num_microbatches = train_data_utils.get_data_iterator(
                        args, None, rollout_data
                    )
                    it = iterators[0]
                    for step, n_mb in enumerate(num_microbatches):
                        for _ in range(n_mb):
                            batch = train_data_utils.get_batch(
                                it, keys, args.data_pad_size_multiplier, args.qkv_format,
                                allgather_cp=args.allgather_cp,
                            )  # fmt: skip
                            logits = theta[batch["tokens"]]
                            theta.grad = None
                            num_rollouts = rollout_data["num_rollouts"][step]
                            loss, _, _ = loss_function(
                                args, batch, n_mb, logits, apply_megatron_loss_scaling=True,
                                num_rollouts=num_rollouts,
                            )  # fmt: skip
                            loss.backward()
                            scale = n_mb / num_rollouts * dp_size * cp_size
                            grad += theta.grad.double().numpy() / scale
                    if SC_STATS.sums is not None:
                        stats += SC_STATS.sums.numpy()
    return grad, stats, published


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("RESCUE_ESTIMATOR", raising=False)
    monkeypatch.delenv("RESCUE_SC_CAP", raising=False)
    monkeypatch.delenv("RESCUE_DRGRPO_DIVISOR", raising=False)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    monkeypatch.setenv("RESCUE_SC_TOP_K", str(K))
    return monkeypatch


def theta0(seed=1):
    return np.random.default_rng(seed).normal(size=(V, V)) * 0.8


@pytest.mark.parametrize(("dp_size", "cp_size"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_gradient_equals_the_papers_formula_in_every_layout(env, dp_size, cp_size):
    Sample = _miles()
    samples = build_samples(Sample)
    args = make_args(grpo_std_normalization=True, _reward_hook=False)
    got, stats, published = run_pipeline(args, samples, theta0(), dp_size=dp_size, cp_size=cp_size)
    want = reference_grad(samples, group_advantages(samples), theta0(), cap=2.0)
    assert np.abs(want).max() > 0.05
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    trained = sum(sum(s.loss_mask) for s in samples)
    assert stats[0] == trained  # every trained token recorded once, over all ranks
    assert published["rollout/rescue/sc/published"] == len(samples)
    assert published["rollout/rescue/sc/head_positions"] == trained


def test_the_turn_channel_weights_and_drgrpo_compose(env):
    """Per-token turn-reached advantages, a protected group's 1/a weight (reward hook) and
    Dr. GRPO's constant divisor, all through the same loss."""
    from test_miles_turn_e2e import KAPPA, expected_advantages

    Sample = _miles()
    env.setenv("RESCUE_ESTIMATOR", "turn")
    env.setenv("RESCUE_KAPPA", str(KAPPA))
    env.setenv("RESCUE_DRGRPO_DIVISOR", "8")
    env.delenv("RESCUE_BASELINE", raising=False)
    env.delenv("RESCUE_TRUNCATED_REWARD", raising=False)
    samples = build_samples(Sample, seed=3)
    weights = [2.0 if s.group_index == 1 else 1.0 for s in samples]
    for s, w in zip(samples, weights, strict=True):
        s.metadata["rescue_weight"] = w
    expected = expected_advantages(samples, std=False, weights=weights)
    args = make_args(
        grpo_std_normalization=False, _reward_hook=True,
        custom_reward_post_process_path="rescue.miles.reward.post_process_rewards",
        custom_pg_loss_reducer_function_path="rescue.miles.drgrpo.pg_loss_reducer",
    )  # fmt: skip
    got, _, _ = run_pipeline(args, samples, theta0(2), dp_size=2, cp_size=2)
    want = reference_grad(samples, expected, theta0(2), cap=2.0, divisor=8.0)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_the_cap_setting_reaches_the_loss(env):
    Sample = _miles()
    env.setenv("RESCUE_SC_CAP", "1.2")
    samples = build_samples(Sample, seed=4)
    args = make_args(_reward_hook=False)
    got, stats, _ = run_pipeline(args, samples, theta0(3), dp_size=1, cp_size=1)
    adv = group_advantages(samples)
    np.testing.assert_allclose(
        got, reference_grad(samples, adv, theta0(3), cap=1.2), rtol=2e-4, atol=2e-5
    )
    assert not np.allclose(got, reference_grad(samples, adv, theta0(3), cap=2.0), atol=1e-4)
    assert 0 < stats[3] < stats[0]  # some sampled ratios were truncated, not all


def test_a_trained_position_without_its_head_is_an_error(env):
    from rescue.errors import InputError

    Sample = _miles()
    samples = build_samples(Sample)
    heads = samples[2].metadata["rescue_topk"]
    for key in ("positions", "ids", "logprobs"):
        heads[key] = heads[key][:-1]
    with pytest.raises(InputError, match="1 trained positions have no recorded head"):
        run_pipeline(make_args(_reward_hook=False), samples, theta0(), dp_size=1, cp_size=1)
    samples = build_samples(Sample)
    del samples[0].metadata["rescue_topk"]
    with pytest.raises(InputError, match="has no recorded heads"):
        run_pipeline(make_args(_reward_hook=False), samples, theta0(), dp_size=1, cp_size=1)


def test_a_removed_sample_needs_no_head_and_trains_nothing(env):
    Sample = _miles()
    samples = build_samples(Sample)
    samples[5].remove_sample = True
    del samples[5].metadata["rescue_topk"]
    got, stats, _ = run_pipeline(
        make_args(_reward_hook=False), samples, theta0(), dp_size=2, cp_size=1
    )
    adv = group_advantages(samples)
    np.testing.assert_allclose(
        got, reference_grad(samples, adv, theta0(), cap=2.0), rtol=2e-4, atol=2e-5
    )
    assert stats[0] == sum(sum(s.loss_mask) for s in samples if not s.remove_sample)


def test_heads_of_another_rollout_or_other_tokens_are_refused(env):
    from rescue.errors import InputError
    from rescue.miles.topk_store import TRAINER

    Sample = _miles()
    samples = build_samples(Sample)
    samples[1].tokens = list(samples[1].tokens)
    samples[1].tokens[-1] = (samples[1].tokens[-1] + 1) % V
    with pytest.raises(InputError, match="belong to other tokens"):
        run_pipeline(make_args(_reward_hook=False), samples, theta0(), dp_size=1, cp_size=1)
    TRAINER.begin(999)
    with pytest.raises(InputError, match="no heads were published for rollout 999"):
        TRAINER.rows(samples[0].tokens, np.zeros(1), 10, 1)


@pytest.mark.parametrize(
    ("override", "flag"),
    [
        ({"use_tis": True}, "--use-tis"),
        ({"custom_tis_function_path": "x.y"}, "--custom-tis-function-path"),
        ({"rollout_top_p": 0.9}, "--rollout-top-p"),
        ({"rollout_top_k": 20}, "--rollout-top-k"),
        ({"rollout_temperature": 0.0}, "--rollout-temperature"),
        ({"use_opd": True}, "--use-opd"),
        ({"normalize_advantages": True}, "--normalize-advantages"),
        ({"use_kl_loss": True}, "--use-kl-loss"),
        ({"entropy_coef": 0.01}, "--entropy-coef"),
        ({"true_on_policy_mode": True}, "--true-on-policy-mode"),
        ({"advantage_estimator": "ppo"}, "--advantage-estimator ppo"),
        ({"allgather_cp": True}, "--allgather-cp"),
        ({"custom_generate_function_path": None}, "--custom-generate-function-path"),
        ({"custom_rollout_log_function_path": None}, "--custom-rollout-log-function-path"),
        ({"sglang_speculative_algorithm": "EAGLE"}, "--sglang-speculative-algorithm"),
        ({"use_session_server": "v2"}, "--use-session-server v2"),
    ],
)
def test_settings_that_are_not_score_centering_are_refused_naming_the_flag(env, override, flag):
    from rescue.errors import InputError
    from rescue.miles.sc_flags import check_sc_flags

    _miles()
    check_sc_flags(make_args())
    with pytest.raises(InputError, match=flag.replace("-", "\\-")):
        check_sc_flags(make_args(**override))


def test_the_sglang_original_logprob_switch_is_refused(env):
    from rescue.errors import InputError
    from rescue.miles.sc_flags import check_sc_flags

    _miles()
    env.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(InputError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        check_sc_flags(make_args())
    env.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "0")
    check_sc_flags(make_args())


def test_a_recomputed_micro_batch_is_recorded_once(env):
    """--recompute-loss-function runs the loss twice per micro-batch."""
    Sample = _miles()
    samples = build_samples(Sample)
    args = make_args(_reward_hook=False)
    _, once, _ = run_pipeline(args, samples, theta0(), dp_size=1, cp_size=1)
    args = make_args(_reward_hook=False, recompute_loss_function=True)
    grad2, twice, _ = run_pipeline(args, samples, theta0(), dp_size=1, cp_size=1)
    np.testing.assert_allclose(twice, once)
    want = reference_grad(samples, group_advantages(samples), theta0(), cap=2.0)
    np.testing.assert_allclose(grad2, want, rtol=2e-4, atol=2e-5)


def test_tensor_parallel_log_probs_equal_the_full_vocabulary(env):
    """The head's log-probs from vocabulary shards (each logit from its owner, one
    normaliser) equal log_softmax over the whole vocabulary, in value and gradient."""
    import torch

    from rescue.miles.sc_loss import vocab_parallel_log_probs

    _miles()
    g = torch.Generator().manual_seed(0)
    full = torch.randn(5, 12, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor(
        [[0, 7, 11, -1], [3, 3, 5, 6], [11, 10, 9, 8], [1, -1, -1, -1], [6, 0, 2, 4]]
    )
    want = torch.where(ids >= 0, torch.log_softmax(full, -1).gather(-1, ids.clamp(min=0)), 0.0)
    weights = torch.randn(ids.shape, generator=g, dtype=torch.float64)
    (want * weights).sum().backward()
    want_grad = full.grad.clone()
    full.grad = None
    # two shards of 6, each "rank" computing with the other's contributions given (a
    # stand-in group whose all-reduce adds them, as NCCL would across the two ranks)
    shards = full.split(6, dim=-1)
    got = sum_over_fake_tp(vocab_parallel_log_probs, shards, ids)
    torch.testing.assert_close(got[0], want)
    for replica in got:  # each rank backpropagates its replica of the loss into its shard
        (replica * weights).sum().backward()
    torch.testing.assert_close(full.grad, want_grad)


def sum_over_fake_tp(fn, shards, ids):
    """Run ``fn`` on every shard as its rank, with ``torch.distributed.all_reduce`` adding
    (or taking the max of) the same tensor of every rank: the ranks run in lock step."""
    import threading

    import torch
    import torch.distributed as dist

    n = len(shards)
    barrier = threading.Barrier(n)
    slots: list = [None] * n
    results: list = [None] * n
    local = threading.local()
    real = dist.all_reduce

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, **_):
        slots[local.rank] = t.detach().clone()
        barrier.wait()
        stacked = torch.stack(slots)
        value = stacked.max(0).values if op == dist.ReduceOp.MAX else stacked.sum(0)
        barrier.wait()
        t.copy_(value)

    def run(rank):
        local.rank = rank
        tp = SimpleNamespace(size=n, rank=rank, group=None)
        results[rank] = fn(shards[rank], ids, tp)

    dist.all_reduce = all_reduce
    try:
        threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        dist.all_reduce = real
    assert all(torch.allclose(results[0], r) for r in results)
    return results
