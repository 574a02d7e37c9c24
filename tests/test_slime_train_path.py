"""rescue's hooks through slime's own trainer path on a CPU (``SLIME_SRC``).

slime ``Sample``s -> ``rescue.reward.post_process_rewards`` as slime's reward hook ->
slime's ``RolloutManager._convert_samples_to_train_data`` and ``_split_train_data_by_dp``
(its DP schedule, ``tensorize_rollout_data_for_training``, ``ray.put`` into a local Ray) ->
slime's ``MegatronTrainRayActor._get_rollout_data`` on every DP x CP rank (``ray.get``, the
tensor casts, the CP slicing of the per-token fields) -> slime's
``compute_advantages_and_returns`` (``rescue.slime.advantages.turn_advantages`` as its
custom advantage function) -> slime's data iterator, ``get_batch`` and ``loss_function``
(``policy_loss_function``) on logits, backward. And the census of rescue's rollout function
logged through slime's ``log_rollout_data``.

The expected advantages are ``rescue.advantages.per_token_advantages`` on turn indices this
test derives itself, sliced per CP rank by slime's ``get_logits_and_tokens_offset_with_cp``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
from slime_env import (
    cpu_accelerator,
    megatron_ranks,
    remove_import_only,
    rollout_manager_class,
    slime_train_modules,
)

from rescue.advantages import per_token_advantages
from rescue.model_calls import CALLS_KEY

KAPPA = 2.0
CHUNK = 5  # RESCUE_TURN_TOKENS of the single-turn group
PROMPT = 3
REWARD_PATH = "rescue.reward.post_process_rewards"
TURN_PATH = "rescue.slime.advantages.turn_advantages"


@pytest.fixture(scope="module", autouse=True)
def _no_stand_ins_after_this_module():
    """The import-only stand-ins serve this module alone (later tests import the same
    package names: Megatron's training package, SGLang's dumper)."""
    yield
    remove_import_only()


@pytest.fixture(scope="module")
def ray_local():
    slime_train_modules()
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=1,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            logging_level="ERROR",
        )
    yield ray
    if started:
        ray.shutdown()


@contextlib.contextmanager
def megatron_world():
    """One gloo process, Megatron's model parallel state (TP = PP = 1) on the CPU."""
    from megatron.core import mpu
    from megatron_cpu import cpu_patch, gloo_world

    with gloo_world(), cpu_patch(), cpu_accelerator():
        mpu.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            mpu.destroy_model_parallel()


def make_args(**overrides):
    from framework_args import slime_defaults

    base = dict(
        advantage_estimator="grpo",
        n_samples_per_prompt=4,
        rollout_batch_size=2,
        global_batch_size=8,
        micro_batch_size=1,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=24,
        balance_data=False,
        custom_reward_post_process_path=REWARD_PATH,
        custom_advantage_function_path=None,
        kl_coef=0.0,
        entropy_coef=0.0,
        use_tis=False,
        eps_clip=0.2,
        eps_clip_high=0.28,  # the launcher's; slime's validation fills None with eps_clip
        data_pad_size_multiplier=1,
        # Megatron's own flag (slime reads it in the loss), at Megatron's default
        seq_length=None,
    )
    return slime_defaults(**{**base, **overrides})


def runs(*segments):
    mask = []
    for ones, zeros in segments:
        mask += [1] * ones + [0] * zeros
    return mask


def build_batch():
    """Group 0: multi-turn rollouts; group 1: single-turn ones, rollout 5 resumed after a
    weight update aborted it (two versions, the record of its calls)."""
    from slime.utils.types import Sample

    specs = [
        (0, 1.0, runs((4, 2), (3, 1), (2, 0)), 3),
        (0, 0.0, runs((6, 0)), 1),
        (0, 1.0, runs((2, 3), (5, 0)), 2),
        (0, 0.0, runs((1, 1), (1, 1), (3, 2)), 3),
        (1, 1.0, [1] * 12, 1),
        (1, 0.0, [1] * 3, 1),
        (1, 0.0, [1] * 9, 1),
        (1, 1.0, [1] * 17, 1),
    ]
    samples = []
    for k, (g, r, mask, calls) in enumerate(specs):
        n = len(mask)
        s = Sample(
            group_index=g,
            index=k,
            reward=r,
            tokens=list(range(1, PROMPT + n + 1)),
            response_length=n,
            loss_mask=list(mask),
            rollout_log_probs=[0.0] * n,
            weight_versions=["1"] * calls,
            status=Sample.Status.COMPLETED,
        )
        samples.append(s)
    resumed = samples[5]
    resumed.weight_versions = ["0", "1"]
    resumed.metadata[CALLS_KEY] = [[0, 0, 1, False], [0, 3, 1, True]]
    return samples


def expected_turn_advantages(samples, weights=None):
    out = [None] * len(samples)
    for g in sorted({s.group_index for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.group_index == g]
        single = g == 1
        turns = []
        for i in rows:
            m = samples[i].loss_mask
            if single:
                t = np.arange(len(m)) // CHUNK + 1
            else:
                ell, t = 0, []
                for k, v in enumerate(m):
                    ell += v == 1 and (k == 0 or m[k - 1] == 0)
                    t.append(ell if v else 0)
                t = np.asarray(t)
            turns.append(np.asarray(t, dtype=np.int64))
        A = per_token_advantages(
            np.asarray([samples[i].reward for i in rows]),
            np.asarray([t.max() for t in turns]),
            turns,
            kappa=KAPPA,
            std_normalize=True,
            weights=None if weights is None else np.asarray([weights[i] for i in rows]),
        )
        for i, a in zip(rows, A, strict=True):
            out[i] = a
    return out


def rollout_side(args, samples, dp_size, cp_size):
    """slime's RolloutManager: the reward hook, the conversion and the DP split."""
    from slime.utils.misc import load_function

    manager = object.__new__(rollout_manager_class())
    manager.args = args
    manager.custom_reward_post_process_func = load_function(args.custom_reward_post_process_path)
    manager.custom_convert_samples_to_train_data_func = None
    manager.train_parallel_config = {
        "dp_size": dp_size,
        "cp_size": cp_size,
        "vpp_size": 1,
        "microbatch_group_size_per_vp_stage": 1,
    }
    return manager._split_train_data_by_dp(manager._convert_samples_to_train_data(samples))


def actor_side(args, refs, *, dp_rank, dp_size, cp_rank, cp_size):
    """slime's Megatron actor on one rank: its rollout data, advantages and returns."""
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns

    with megatron_ranks(dp_rank=dp_rank, dp_size=dp_size, cp_rank=cp_rank, cp_size=cp_size):
        data = MegatronTrainRayActor._get_rollout_data(SimpleNamespace(args=args), refs)
        compute_advantages_and_returns(args, data)
    return data


@pytest.fixture
def turn_env(monkeypatch):
    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    monkeypatch.setenv("RESCUE_KAPPA", str(KAPPA))
    monkeypatch.setenv("RESCUE_TURN_TOKENS", str(CHUNK))
    for name in ("RESCUE_BASELINE", "RESCUE_TRUNCATED_REWARD"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("dp_size", "cp_size"), [(1, 2), (2, 2)])
def test_the_turn_advantages_reach_every_cp_rank_through_slimes_trainer_path(
    ray_local, turn_env, dp_size, cp_size
):
    from slime.backends.megatron_utils.cp_utils import get_logits_and_tokens_offset_with_cp

    args = make_args(custom_advantage_function_path=TURN_PATH)
    samples = build_batch()
    expected = expected_turn_advantages(samples)
    assert all(np.any(expected[i]) for i in (0, 4, 5))
    covered = {}
    with megatron_world():
        refs = rollout_side(args, samples, dp_size, cp_size)
        for dp in range(dp_size):
            for cp in range(cp_size):
                data = actor_side(
                    args, refs, dp_rank=dp, dp_size=dp_size, cp_rank=cp, cp_size=cp_size
                )
                assert data["teacher_log_probs"][0].dtype.is_floating_point  # slime's cast
                for j, a in enumerate(data["advantages"]):
                    i = int(data["sample_indices"][j])
                    s = samples[i]
                    total, n = len(s.tokens), s.response_length
                    with megatron_ranks(cp_rank=cp, cp_size=cp_size):
                        _, _, logits, _ = get_logits_and_tokens_offset_with_cp(total, n)
                    p = total - n
                    want = np.concatenate(
                        [expected[i][lo - (p - 1) : hi - (p - 1)] for lo, hi in logits]
                    )
                    np.testing.assert_allclose(a.numpy(), want, rtol=0, atol=1e-6)
                    covered[i] = covered.get(i, 0) + a.numel()
    assert covered == {i: s.response_length for i, s in enumerate(samples)}  # every token once
    assert rewards_were_zero(args)


def rewards_were_zero(args):
    """Under the turn estimator the scalar part of every advantage is 0: the reward hook
    returns 0 for every sample (the advantages above are the channel alone)."""
    from slime.utils.misc import load_function

    samples = build_batch()
    _, rewards = load_function(args.custom_reward_post_process_path)(args, samples)
    return rewards == [0.0] * len(samples)


def test_a_converter_that_drops_the_channel_stops_the_first_train_step(ray_local, turn_env):
    args = make_args(custom_advantage_function_path=TURN_PATH)
    samples = build_batch()
    with megatron_world():
        refs = rollout_side(args, samples, 1, 1)
        from slime.backends.megatron_utils.actor import MegatronTrainRayActor
        from slime.backends.megatron_utils.loss import compute_advantages_and_returns

        with megatron_ranks():
            data = MegatronTrainRayActor._get_rollout_data(SimpleNamespace(args=args), refs)
            data.pop("teacher_log_probs")  # what a converter without the field ships
            with pytest.raises(ValueError, match="no teacher_log_probs"):
                compute_advantages_and_returns(args, data)


# ── a protect weight trained through slime's loss ─────────────────────────────────────


def grads_through_slimes_loss(args, samples, dp_size):
    """Per sample: the gradient of slime's loss on its logits (seeded per micro-batch, the
    same in every run), through slime's whole trainer data path."""
    import torch
    from slime.backends.megatron_utils.data import get_batch, get_data_iterator
    from slime.backends.megatron_utils.loss import loss_function

    keys = [
        "tokens",
        "total_lengths",
        "response_lengths",
        "loss_masks",
        "log_probs",
        "advantages",
        "returns",
        "rollout_log_probs",
        "rollout_mask_sums",
    ]
    out = {}
    vocab = 13
    with megatron_world():
        refs = rollout_side(args, samples, dp_size, 1)
        for dp in range(dp_size):
            data = actor_side(args, refs, dp_rank=dp, dp_size=dp_size, cp_rank=0, cp_size=1)
            with megatron_ranks(dp_rank=dp, dp_size=dp_size):
                (it,) = get_data_iterator(data)
                for step, n_mb in enumerate(data["num_microbatches"]):
                    for _ in range(n_mb):
                        indices = it.micro_batch_indices[it.offset]
                        batch = get_batch(it, keys, args.data_pad_size_multiplier)
                        batch["tokens"] = batch["tokens"] % vocab
                        batch["unconcat_tokens"] = [t % vocab for t in batch["unconcat_tokens"]]
                        seed = sum(int(data["sample_indices"][j]) * 7919 for j in indices)
                        generator = torch.Generator().manual_seed(seed)
                        logits = torch.randn(
                            1, batch["tokens"].shape[1], vocab, generator=generator
                        ).requires_grad_()
                        loss, _, _ = loss_function(
                            args, batch, n_mb, data["global_batch_sizes"][step], logits
                        )
                        loss.backward()
                        start = 0
                        for j, tokens in zip(indices, batch["unconcat_tokens"], strict=True):
                            stop = start + len(tokens)
                            out[int(data["sample_indices"][j])] = logits.grad[0, start:stop].clone()
                            start = stop
    return out


@pytest.mark.parametrize("dp_size", [1, 2])
def test_a_protect_weight_scales_exactly_its_samples_gradient_in_slimes_loss(
    ray_local, monkeypatch, dp_size
):
    for name in ("RESCUE_ESTIMATOR", "RESCUE_BASELINE", "RESCUE_TRUNCATED_REWARD"):
        monkeypatch.delenv(name, raising=False)
    args = make_args()
    plain = grads_through_slimes_loss(args, build_batch(), dp_size)
    weighted_batch = build_batch()
    for s in weighted_batch:
        if s.group_index == 1:
            s.metadata["rescue_weight"] = 4.0  # a protected stale group, a = 0.25
    weighted = grads_through_slimes_loss(args, weighted_batch, dp_size)
    assert sorted(plain) == sorted(weighted) == list(range(8))
    for i, s in enumerate(weighted_batch):
        factor = 4.0 if s.group_index == 1 else 1.0
        assert plain[i].abs().max() > 0
        torch_close(weighted[i], factor * plain[i])


def torch_close(a, b):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


# ── the census through slime's log_rollout_data ─────────────────────────────────────────


def test_the_census_reaches_slimes_rollout_log(ray_local, monkeypatch):
    from collections import deque

    from slime.observability import logging_utils, rollout_metrics
    from slime.observability.metric_utils import compute_rollout_step
    from slime.utils.types import Sample

    from rescue.gate import Gate
    from rescue.slime.drain import Drain

    groups = deque()
    for g in range(3):
        group = []
        for k in range(2):
            s = Sample(
                group_index=g,
                index=2 * g + k,
                reward=float(k),
                tokens=[1, 2, 3, 4, 5],
                response="ab",
                response_length=2,
                loss_mask=[1, 1],
                weight_versions=["0" if g == 1 else "3"],
                status=Sample.Status.COMPLETED,
            )
            group.append(s)
        groups.append((g, group))

    class Worker:
        def get_completed_groups(self, limit=None):
            return [groups.popleft() for _ in range(min(limit or len(groups), len(groups)))]

        def queue_size(self):
            return len(groups)

    drain = Drain(Worker(), Gate(arm="drop", max_staleness=1), current_version=lambda: 3, poll_s=0)
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=2, use_wandb=False)
    kept, metrics = drain.collect(args, target=2)
    logged = []
    monkeypatch.setattr(logging_utils, "log", lambda a, m, step_key: logged.append((m, step_key)))
    flat = [s for g in kept for s in g]
    rollout_metrics.log_rollout_data(7, args, flat, metrics, 1.5)
    ((m, step_key),) = logged
    assert step_key == "rollout/step" and m["rollout/step"] == compute_rollout_step(args, 7)
    assert m["rollout/census/groups/dropped_stale"] == 1  # group 1, 3 versions behind
    assert m["rollout/census/groups/trained_fresh"] == 2
    assert m["rollout/census/current_version"] == 3
    assert {k for k in m if k.startswith("rollout/census/")} == set(metrics)
    assert "rollout/response_len/mean" in m  # slime's own metrics of the same samples beside
