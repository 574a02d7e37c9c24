"""Which weight versions count and how many turns a sample made, from the generate
wrapper's record of its model calls (``rescue.model_calls``, ``rescue.slime.generate``);
without a record (Miles' samples) the plain rules, unchanged."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from fake_sample import Sample as FakeSample

from rescue.census import PREFIX, Bucket, Census
from rescue.model_calls import CALLS_KEY, calls, counted_weight_versions, turn_count
from rescue.samples import group_records, group_staleness, oldest_weight_version
from rescue.slime import generate as wrapper

ABORTED, COMPLETED = FakeSample.Status.ABORTED, FakeSample.Status.COMPLETED


def sample(versions, n, record=None, mask=None, **kw):
    s = FakeSample(
        weight_versions=list(versions),
        response_length=n,
        loss_mask=mask,
        status=COMPLETED,
        reward=1.0,
        **kw,
    )
    if record is not None:
        s.metadata[CALLS_KEY] = [list(e) for e in record]
    return s


# ── the plain rules, for samples without a record (Miles) ─────────────────────────────


def test_without_a_record_every_version_counts_and_is_a_turn():
    s = sample(["3", "4", "4"], 9)
    assert calls(s) is None
    assert counted_weight_versions(s) == ["3", "4", "4"] and turn_count(s) == 3
    assert oldest_weight_version(s) == 3
    assert group_records([[s]])[0].turns == 3


# ── a single-turn reply aborted at a weight update and resumed ───────────────────────


def test_a_reply_aborted_before_its_first_token_neither_counts_nor_makes_a_turn():
    # [0, 0) under version 4 (aborted, no token), then [0, 6) under 5 (resumed)
    s = sample(["4", "5"], 6, record=[(0, 0, 1, False), (0, 6, 1, True)])
    assert counted_weight_versions(s) == ["5"] and turn_count(s) == 1
    assert oldest_weight_version(s) == 5
    assert group_staleness([s], 5) == 0  # the plain rule said 1
    assert group_records([s])[0].turns == 1  # the plain rule said 2


def test_a_reply_aborted_mid_way_counts_both_versions_as_one_turn():
    s = sample(["4", "5"], 6, record=[(0, 2, 1, False), (2, 6, 1, True)])
    assert counted_weight_versions(s) == ["4", "5"] and turn_count(s) == 1
    assert group_staleness([s], 5) == 1  # its first two tokens are version 4's


def test_a_segment_the_partial_rollout_masked_does_not_count():
    """--partial-rollout --mask-offpolicy-in-partial-rollout zeroes the loss mask of what
    was generated before the resume: those tokens are not trained."""
    s = sample(["4", "5"], 6, record=[(0, 2, 1, False), (2, 6, 1, True)], mask=[0, 0, 1, 1, 1, 1])
    assert counted_weight_versions(s) == ["5"] and turn_count(s) == 1
    assert group_staleness([s], 5) == 0


def test_multi_turn_calls_with_tool_tokens_between_them():
    # three model calls (2, 3 and 1 tokens) with tool output (masked) between them; the
    # third reply was aborted before its first token and resumed
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1]
    record = [(0, 2, 1, False), (4, 7, 1, False), (8, 8, 1, False), (8, 9, 1, True)]
    s = sample(["1", "2", "2", "3"], 9, record=record, mask=mask)
    assert counted_weight_versions(s) == ["1", "2", "3"] and turn_count(s) == 3


def test_a_call_with_several_versions_counts_them_together():
    """A multi-turn generate function makes several replies in one call: each version is
    taken to have produced the call's tokens; a resume joins only its first."""
    s = sample(["1", "2", "2"], 7, record=[(0, 4, 2, False), (4, 7, 1, True)])
    assert [(c.start, c.stop, c.resumes) for c in calls(s)] == [
        (0, 4, False),
        (0, 4, False),
        (4, 7, True),
    ]
    assert counted_weight_versions(s) == ["1", "2", "2"] and turn_count(s) == 2


def test_a_resume_with_nothing_before_it_is_a_turn_of_its_own():
    """slime's sync rollout marks samples it never started ABORTED at an abort."""
    s = sample(["2"], 3, record=[(0, 3, 1, True)])
    assert turn_count(s) == 1 and counted_weight_versions(s) == ["2"]


@pytest.mark.parametrize(
    "record",
    [
        [(0, 0, 1, False)],  # one version recorded, two on the sample
        [(0, 3, 1, False), (3, 9, 1, True)],  # stop beyond the response
        [(2, 3, 1, False), (0, 6, 1, True)],  # starts going back
        [(0, 3, 1), (3, 6, 1, True)],  # malformed entry
        [(0, 3, 3, False)],  # more versions than the sample has
    ],
)
def test_an_inconsistent_record_falls_back_to_the_plain_rules(record):
    s = sample(["4", "5"], 6, record=record)
    assert calls(s) is None
    assert counted_weight_versions(s) == ["4", "5"] and turn_count(s) == 2


def test_the_record_is_read_from_a_sample_dict_too():
    s = sample(["4", "5"], 6, record=[(0, 0, 1, False), (0, 6, 1, True)])
    d = {**vars(s), "status": "completed"}
    assert counted_weight_versions(d) == ["5"] and turn_count(d) == 1


def test_the_census_counts_one_turn_for_a_resumed_single_turn_reply():
    census = Census()
    resumed = sample(["4", "5"], 6, record=[(0, 2, 1, False), (2, 6, 1, True)], group_index=0)
    plain = sample(["5"], 6, record=[(0, 6, 1, False)], group_index=0)
    census.enter(0)
    census.settle(0, Bucket.TRAINED_FRESH, group_records([resumed, plain]))
    m = census.step_metrics()
    assert m[f"{PREFIX}turns_mean/solved"] == 1.0


# ── the wrapper ──────────────────────────────────────────────────────────────────────


def _run_wrapper(monkeypatch, fn, s, **kw):
    monkeypatch.setattr(wrapper, "_load", lambda path: (fn, "evaluation" in kw))
    return asyncio.run(wrapper.generate(SimpleNamespace(), s, {}, **kw))


def _reply(tokens, version, finish):
    async def fn(args, s, params, **kw):
        s.response_length += tokens
        s.loss_mask = (s.loss_mask or []) + [1] * tokens
        s.weight_versions.append(version)
        s.status = finish
        return s

    return fn


def test_the_wrapper_records_each_call_and_marks_a_resume(monkeypatch):
    s = FakeSample(metadata={})
    _run_wrapper(monkeypatch, _reply(0, "4", ABORTED), s)
    _run_wrapper(monkeypatch, _reply(5, "5", COMPLETED), s)
    assert s.metadata[CALLS_KEY] == [[0, 0, 1, False], [0, 5, 1, True]]
    assert counted_weight_versions(s) == ["5"] and turn_count(s) == 1


def test_a_call_without_a_reply_records_nothing_and_other_samples_keep_the_plain_rules(
    monkeypatch,
):
    s = FakeSample(metadata={})

    async def truncated(args, sample, params):  # max_new_tokens used up: no request
        sample.status = FakeSample.Status.TRUNCATED
        return sample

    _run_wrapper(monkeypatch, truncated, s)
    assert CALLS_KEY not in s.metadata

    async def fan_out(args, sample, params):
        return [FakeSample(weight_versions=["3"], response_length=2)]

    out = _run_wrapper(monkeypatch, fan_out, s)
    assert CALLS_KEY not in out[0].metadata and CALLS_KEY not in s.metadata


def test_the_wrapper_passes_evaluation_only_to_a_function_that_takes_it(monkeypatch):
    seen = {}

    async def with_eval(args, sample, params, evaluation=False):
        seen["evaluation"] = evaluation
        return sample

    _run_wrapper(monkeypatch, with_eval, FakeSample(), evaluation=True)
    assert seen == {"evaluation": True}


def test_the_wrapped_function_setting():
    assert wrapper.generate_path_from_env({}) == wrapper.DEFAULT_GENERATE
    assert wrapper.generate_path_from_env({wrapper.ENV_GENERATE: "a.b"}) == "a.b"
    with pytest.raises(ValueError, match=r"RESCUE_GENERATE_FUNCTION=rescue\.slime\.generate"):
        wrapper.generate_path_from_env({wrapper.ENV_GENERATE: wrapper.GENERATE_PATH})


# ── the turn estimator (torch) ───────────────────────────────────────────────────────


@dataclass
class SlimeSample(FakeSample):
    teacher_log_probs: list[float] | None = None


def _turn_args():
    return SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=1,
        use_opd=False,
        custom_advantage_function_path="rescue.slime.advantages.turn_advantages",
        object_store_backend="ray",
    )


def _turn_batch(with_record):
    out = []
    for k, (r, n) in enumerate([(1.0, 6), (0.0, 4), (1.0, 3), (0.0, 5)]):
        s = SlimeSample(group_index=0, index=k, reward=r, response_length=n, status=COMPLETED)
        s.loss_mask = [1] * n
        if k == 1:  # aborted at a weight update after 1 token, resumed
            s.weight_versions = ["4", "5"]
            record = [[0, 1, 1, False], [1, n, 1, True]]
        else:
            s.weight_versions = ["5"]
            record = [[0, n, 1, False]]
        if with_record:
            s.metadata[CALLS_KEY] = record
        out.append(s)
    return out


def test_the_turn_estimator_treats_a_resumed_reply_as_one_model_call(monkeypatch):
    pytest.importorskip("torch")
    from rescue.advantages import per_token_advantages
    from rescue.reward import post_process_rewards

    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    monkeypatch.setenv("RESCUE_TURN_TOKENS", "2")
    samples = _turn_batch(with_record=True)
    post_process_rewards(_turn_args(), samples)
    turns = [np.arange(s.response_length) // 2 + 1 for s in samples]  # single-turn chunks
    want = per_token_advantages(
        np.asarray([s.reward for s in samples]),
        np.asarray([t.max() for t in turns]),
        turns,
        std_normalize=True,
    )
    for s, w in zip(samples, want, strict=True):
        np.testing.assert_array_equal(s.teacher_log_probs.numpy(), w)
    # Without the record the resumed reply is two model calls over one run of 1s: the
    # turn arm stopped at slime's first weight update.
    with pytest.raises(ValueError, match="1 runs of 1s but 2 model calls"):
        post_process_rewards(_turn_args(), _turn_batch(with_record=False))
