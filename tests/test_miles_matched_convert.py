"""The matched arm's convert through Miles' real conversion, DP split and train-side data
iterator on a CPU: two optimizer steps per base step, step 2k = copy A (R = 0: the capped
trajectories unmasked), step 2k + 1 = copy B (the mask arm), each copy converted as Miles
converts it alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from miles_env import require_miles

from filters.mask import mask_truncated_zero_reward
from rescue.miles.matched import CONVERT_PATH, ROLLOUT_ID_OFFSET, convert_samples_to_train_data

HOOK = "rescue.miles.train_step.before_train_step"
REWARD = "rescue.miles.reward.post_process_rewards"


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
        global_batch_size=12,
        micro_batch_size=1,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=40,
        balance_data=False,
        balance_by_flops=False,
        allow_partial_train_step=False,
        qkv_format="thd",
        true_on_policy_mode=False,
        delay_split_train_data_by_dp=False,
        data_pad_size_multiplier=1,
        object_store_backend="ray",
        enable_witness=False,
        multi_lora=False,
        use_critic=False,
        indep_dp=False,
        custom_reward_post_process_path=REWARD,
        custom_convert_samples_to_train_data_path=CONVERT_PATH,
        custom_megatron_before_train_step_hook_path=HOOK,
    )
    return SimpleNamespace(**{**base, **overrides})


@pytest.fixture
def miles(monkeypatch):
    require_miles()
    monkeypatch.setenv("RESCUE_TRUNCATED_REWARD", "zero")
    for name in ("RESCUE_ESTIMATOR", "RESCUE_BASELINE"):
        monkeypatch.delenv(name, raising=False)
    from miles.utils.types import Sample

    return Sample


def groups_of(Sample):
    """3 groups of 4 rollouts; truncated rollouts score 1 by the grader (cut text graded);
    group 1's rollout 5 is two sibling samples, its last turn truncated."""
    groups = []
    statuses = [
        ["completed", "truncated", "completed", "truncated"],
        ["completed", "completed", "completed", "truncated"],
        ["truncated", "completed", "completed", "completed"],
    ]
    rewards = [[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0]]
    for g in range(3):
        group = []
        for k in range(4):
            rid = g * 4 + k
            n = 3 + (rid % 4)
            s = Sample(
                group_index=g,
                index=rid,
                rollout_id=rid,
                reward=rewards[g][k],
                tokens=list(range(1, 3 + n + 1)),
                response_length=n,
                loss_mask=[1] * n,
                weight_versions=["0"],
            )
            s.status = Sample.Status(statuses[g][k])
            if rid == 5:
                first = Sample(
                    group_index=g,
                    index=100,
                    rollout_id=rid,
                    reward=rewards[g][k],
                    tokens=list(range(1, 6)),
                    response_length=2,
                    loss_mask=[1, 1],
                    weight_versions=["0"],
                )
                first.status = Sample.Status.COMPLETED
                s.status = Sample.Status.TRUNCATED
                group.append([first, s])
            else:
                group.append(s)
        groups.append(group)
    return groups


def flat(groups):
    return [s for g in groups for t in g for s in (t if isinstance(t, list) else [t])]


def schedule(args, train_data, dp_size=2):
    """Miles' DP split and each rank's data iterator: per step, the rollout ids each rank trains."""
    from megatron_cpu import cpu_patch, gloo_world, local_object_store, miles_parallel_state
    from miles.backends.training_utils import data as train_data_utils
    from miles.ray.rollout import train_data_conversion as tdc

    config = {"dp_size": dp_size, "cp_size": 1, "vpp_size": 1}
    config["microbatch_group_size_per_vp_stage"] = None
    steps: dict[int, list] = {}
    num_rollouts = None
    with gloo_world(), cpu_patch(), local_object_store():
        refs = tdc.split_train_data_by_dp(args, train_data, config)
        for dp in range(dp_size):
            with miles_parallel_state(dp_rank=dp, dp_size=dp_size):
                rollout_data, _ = train_data_utils.get_rollout_data(args, refs)
                num_rollouts = train_data_utils.get_num_rollouts(args, rollout_data, 0)
                iterators, num_microbatches = train_data_utils.get_data_iterator(
                    args, None, rollout_data
                )
                it = iterators[0]
                for step, n_mb in enumerate(num_microbatches):
                    for _ in range(n_mb):
                        for j in it.micro_batch_indices[it.offset]:
                            steps.setdefault(step, []).append(
                                (
                                    int(rollout_data["rollout_ids"][j]),
                                    int(rollout_data["sample_indices"][j]),
                                    [int(x) for x in rollout_data["loss_masks"][j]],
                                    float(rollout_data["rewards"][j]),
                                )
                            )
                        it.offset += 1
    return steps, num_rollouts


def alone(args, samples):
    """Miles' own conversion of one copy, as an arm that trains it alone would run it."""
    from miles.ray.rollout import train_data_conversion as tdc

    from rescue.miles.reward import post_process_rewards

    return tdc.convert_samples_to_train_data(args, samples, {}, None, post_process_rewards)


def by_sample(data):
    return {
        i: (m, r)
        for i, m, r in zip(data["sample_indices"], data["loss_masks"], data["rewards"], strict=True)
    }


@pytest.mark.parametrize("gbs, steps_per_copy", [(12, 1), (6, 2)])
def test_two_steps_per_base_step_copy_a_first(miles, gbs, steps_per_copy):
    import copy

    Sample = miles
    args = make_args(global_batch_size=gbs)
    groups = groups_of(Sample)
    mask_truncated_zero_reward(args, groups)  # the mask arm's filter
    samples = flat(groups)
    masked = {s.index for s in samples if s.remove_sample}
    assert masked == {1, 3, 5, 100, 7, 8}  # rollout 5 is samples 100 and 5
    pristine = copy.deepcopy(samples)

    train_data = convert_samples_to_train_data(args, samples)
    steps, num_rollouts = schedule(args, train_data)

    assert len(steps) == 2 * steps_per_copy and num_rollouts == [gbs] * (2 * steps_per_copy)
    unmasked = [s for s in pristine if not s.remove_sample]
    zero_args = make_args(global_batch_size=gbs)
    for s in pristine:
        s.remove_sample = False
    want_a = by_sample(alone(zero_args, copy.deepcopy(pristine)))
    for s, p in zip(pristine, samples, strict=True):
        s.remove_sample = p.remove_sample
    want_b = by_sample(alone(zero_args, copy.deepcopy(pristine)))
    order = list(dict.fromkeys(s.rollout_id for s in samples))
    for step, rows in steps.items():
        chunk = order[(step // 2) * gbs : (step // 2 + 1) * gbs]
        copy_b = step % 2 == 1
        ids = {rid for rid, *_ in rows}
        want_ids = {r + ROLLOUT_ID_OFFSET * copy_b for r in chunk}
        assert ids == want_ids  # exactly the chunk's rollouts, of one copy
        want = want_b if copy_b else want_a
        for _, index, mask, reward in rows:
            assert mask == list(want[index][0])
            assert reward == pytest.approx(want[index][1], abs=1e-6)
    # copy A trains the capped rollouts at R = 0; copy B masks them
    a_rows = [r for step, rows in steps.items() if step % 2 == 0 for r in rows]
    b_rows = [r for step, rows in steps.items() if step % 2 == 1 for r in rows]
    assert all(sum(mask) > 0 for _, index, mask, _ in a_rows)
    assert {index for _, index, mask, _ in b_rows if sum(mask) == 0} == masked
    assert len(a_rows) == len(b_rows) == len(samples)
    # the samples the filter produced are left as they were (copy A works on copies)
    assert [(s.remove_sample, s.loss_mask) for s in samples if s.index in masked] == [
        (True, [0] * s.response_length) for s in samples if s.index in masked
    ]
    assert unmasked  # the batch has trained rollouts in both copies


def test_the_step_size_control_puts_the_mask_copy_first_and_applies_r0s(miles):
    """The step-size control's conversion: the same two copies in the other order, step 2k
    the mask's copy B (measured), step 2k + 1 the R = 0 copy A (applied, its ids shifted)."""
    import copy

    from rescue.miles.matched import STEP_CONVERT_PATH, convert_samples_to_train_data_step_control

    Sample = miles
    gbs = 12
    args = make_args(
        global_batch_size=gbs, custom_convert_samples_to_train_data_path=STEP_CONVERT_PATH
    )
    groups = groups_of(Sample)
    mask_truncated_zero_reward(args, groups)
    samples = flat(groups)
    masked = {s.index for s in samples if s.remove_sample}
    pristine = copy.deepcopy(samples)
    steps, _ = schedule(args, convert_samples_to_train_data_step_control(args, samples))
    assert sorted(steps) == [0, 1]
    first, second = steps[0], steps[1]
    assert all(rid < ROLLOUT_ID_OFFSET for rid, *_ in first)  # the measured copy: B, as is
    assert all(rid >= ROLLOUT_ID_OFFSET for rid, *_ in second)  # the applied copy: A, shifted
    assert {index for _, index, mask, _ in first if sum(mask) == 0} == masked
    assert all(sum(mask) > 0 for _, index, mask, _ in second)  # R = 0 trains the capped
    for s in pristine:
        s.remove_sample = False
    want_a = by_sample(alone(make_args(global_batch_size=gbs), copy.deepcopy(pristine)))
    for _, index, mask, reward in second:
        assert mask == list(want_a[index][0])
        assert reward == pytest.approx(want_a[index][1], abs=1e-6)


def test_reference_copy_unmasks_only_capped_trajectories(miles):
    from rescue.miles.matched import reference_copy

    Sample = miles
    groups = groups_of(Sample)
    samples = flat(groups)
    samples[0].remove_sample = True  # masked by something other than the cap: stays masked
    mask_truncated_zero_reward(make_args(), groups)
    ref = reference_copy(samples)
    assert ref[0].remove_sample and samples[0].remove_sample
    assert not any(r.remove_sample for r in ref[1:])
    assert all(r is not s for r, s in zip(ref, samples, strict=True))


def test_under_score_centering_the_heads_of_the_capped_trajectories_are_published(
    miles, monkeypatch
):
    """Copy A trains the capped trajectories the mask removed: their heads must reach the
    trainer (found by the training rehearsal: before, step 1 of a matched run under tis-sc
    stopped with "no recorded heads")."""
    import rescue.miles.topk_store as store
    from rescue.miles.log import publish_heads
    from rescue.miles.topk import KEY, token_digest

    Sample = miles
    groups = groups_of(Sample)
    samples = flat(groups)
    mask_truncated_zero_reward(make_args(), groups)
    for s in samples:
        n = s.response_length
        s.metadata = {**(s.metadata or {}), KEY: {
            "digest": token_digest(s.tokens), "positions": list(range(n)),
            "ids": [[1, 2]] * n, "logprobs": [[-0.1, -2.0]] * n,
        }}  # fmt: skip
        s.rollout_log_probs = [-0.1] * n
    published: list = []
    monkeypatch.setattr(store, "publish", lambda rid, xs: (published.extend(xs), (len(xs), 0))[1])
    monkeypatch.setattr("rescue.miles.sc_flags.check_sc_flags", lambda args: None)
    args = make_args(loss_type="custom_loss",
                     custom_loss_function_path="rescue.miles.sc_loss.policy_loss")  # fmt: skip
    publish_heads(0, args, samples)
    removed = [s for s in samples if s.remove_sample]
    assert removed  # the mask filter removed the capped trajectories
    trained = [s for s in published if store.trained_positions(s).size]
    assert len(trained) == len(samples)
    plain = make_args(loss_type="custom_loss", custom_convert_samples_to_train_data_path=None,
                      custom_loss_function_path="rescue.miles.sc_loss.policy_loss")  # fmt: skip
    published.clear()
    publish_heads(0, plain, samples)
    assert sum(1 for s in published if store.trained_positions(s).size) == len(samples) - len(
        removed
    )


def test_refusals_name_the_flag(miles):
    Sample = miles
    samples = flat(groups_of(Sample))
    with pytest.raises(ValueError, match="--custom-megatron-before-train-step-hook-path"):
        convert_samples_to_train_data(
            make_args(custom_megatron_before_train_step_hook_path=None), samples
        )
    with pytest.raises(ValueError, match="--use-dynamic-global-batch-size"):
        convert_samples_to_train_data(make_args(use_dynamic_global_batch_size=True), samples)
    with pytest.raises(ValueError, match="12 rollouts, --global-batch-size 5"):
        convert_samples_to_train_data(make_args(global_batch_size=5), samples)
