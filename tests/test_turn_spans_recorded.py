"""Turn spans recorded where the loss mask is built, read by the turn-reached reward hook.

Recorded spans and spans read back from the loss mask give identical advantages, for any
mix of samples with and without a record; a record for another response length is not
used; a malformed record is an error naming the sample; the SWE reward function records
the spans of each finished sample.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_miles_turn_reward import MilesSample, make_args, ms, multi_turn

from rescue.errors import InputError
from rescue.miles.reward import post_process_rewards
from rescue.turn_reward import ENV_ESTIMATOR
from rescue.turns import (
    TURN_SPANS_KEY,
    TurnSpans,
    mask_turn_spans,
    record_turn_spans,
    recorded_turn_spans,
)


@pytest.fixture(autouse=True)
def turn(monkeypatch):
    for name in (
        "RESCUE_KAPPA",
        "RESCUE_TURN_TOKENS",
        "RESCUE_TRUNCATED_REWARD",
        "RESCUE_BASELINE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_ESTIMATOR, "turn")


def spans_as_built(mask: list[int]) -> TurnSpans:
    """The spans a rollout knows while it builds the mask: each call's tokens, in order."""
    starts, stops, pos = [], [], 0
    while pos < len(mask):
        if mask[pos]:
            starts.append(pos)
            while pos < len(mask) and mask[pos]:
                pos += 1
            stops.append(pos)
        else:
            pos += 1
    return TurnSpans(np.array(starts, np.int64), np.array(stops, np.int64), len(mask))


def channel(samples) -> list[np.ndarray]:
    return [s.opd_reverse_kl.numpy() for s in samples]


# A merged trajectory: turns of >= 1 token separated by observations of >= 1 token.
trajectory = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=6)


def build(shape: list[tuple[int, int]], lead: int) -> list[int]:
    mask = [0] * lead
    for k, (turn_len, obs_len) in enumerate(shape):
        mask += [1] * turn_len + ([0] * obs_len if k < len(shape) - 1 else [])
    return mask


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(trajectory, st.integers(0, 2)), min_size=4, max_size=4),
    rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=4),
    recorded=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_recorded_spans_give_the_advantages_of_the_mask(shapes, rewards, recorded):
    masks = [build(shape, lead) for shape, lead in shapes]
    read_back = multi_turn(rewards, masks)
    with_records = multi_turn(rewards, masks)
    for s, m, record in zip(with_records, masks, recorded, strict=True):
        if record:
            record_turn_spans(s.metadata, spans_as_built(m))
    post_process_rewards(make_args(), read_back)
    post_process_rewards(make_args(), with_records)
    for a, b in zip(channel(read_back), channel(with_records), strict=True):
        np.testing.assert_array_equal(a, b)


def test_recorded_spans_are_read_instead_of_the_mask():
    """A record that differs from the mask is what the hook uses: the mask is not read."""
    masks = [[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 1]]
    plain = multi_turn([1.0, 0.0, 1.0], masks, calls=[2, 2, 1])
    recorded = multi_turn([1.0, 0.0, 1.0], masks, calls=[2, 2, 1])
    # Sample 2 recorded as two calls of 2 tokens each, where its mask shows one run of 4.
    record_turn_spans(recorded[2].metadata, TurnSpans(np.array([0, 2]), np.array([2, 4]), 4))
    recorded[2].weight_versions = ["0", "0"]
    post_process_rewards(make_args(), plain)
    post_process_rewards(make_args(), recorded)
    # Rollout 2 now reaches turn 2: the turn-2 baselines of the others move.
    changed = [
        not np.array_equal(a, b) for a, b in zip(channel(plain), channel(recorded), strict=True)
    ]
    assert changed[0]  # its turn-2 baseline now counts rollout 2 (R = 1) with rollout 1 (R = 0)


def test_siblings_mix_recorded_and_read_back_spans():
    a = ms(1.0, 0, 0, 7, 5, [1, 0, 1, 1, 0], ["0", "0"])
    b = ms(1.0, 0, 1, 7, 2, [1, 1], ["1"])
    c = ms(0.0, 0, 2, 8, 3, [1, 0, 1], ["0", "0"])
    twins = [ms(s.reward, 0, s.index, s.rollout_id, s.response_length, list(s.loss_mask),
                list(s.weight_versions)) for s in (a, b, c)]  # fmt: skip
    record_turn_spans(twins[0].metadata, mask_turn_spans(a.loss_mask))
    post_process_rewards(make_args(), [a, b, c])
    post_process_rewards(make_args(), twins)
    for x, y in zip(channel([a, b, c]), channel(twins), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_record_for_another_length_is_not_used():
    spans = mask_turn_spans([1, 0, 1])
    metadata: dict = {}
    record_turn_spans(metadata, spans)
    assert recorded_turn_spans(metadata, 4) is None
    got = recorded_turn_spans(metadata, 3)
    assert got is not None and got.starts.tolist() == [0, 2] and got.stops.tolist() == [1, 3]
    assert recorded_turn_spans({}, 3) is None and recorded_turn_spans(None, 3) is None


def test_a_malformed_record_is_an_error_naming_the_sample():
    samples = multi_turn([1.0, 0.0], [[1, 0, 1], [1, 1, 0, 1]])
    samples[1].metadata[TURN_SPANS_KEY] = {"starts": [0], "n_tokens": 4}
    with pytest.raises(InputError, match=r"sample 1 \(group_index=0, index=1.*rescue_turn_spans"):
        post_process_rewards(make_args(), samples)


def test_the_record_is_plain_ints_that_survive_json():
    import json

    metadata: dict = {}
    record_turn_spans(metadata, mask_turn_spans([0, 1, 1, 0, 1]))
    assert json.loads(json.dumps(metadata)) == {
        TURN_SPANS_KEY: {"starts": [1, 4], "stops": [3, 5], "n_tokens": 5}
    }


def test_the_swe_reward_function_records_each_samples_spans():
    from swe_smith_tasks.agent import reward_func

    s = MilesSample(response_length=5, loss_mask=[1, 1, 0, 0, 1], metadata={"reward": 1.0})
    bad = MilesSample(response_length=2, loss_mask=[1, 7], metadata={"reward": 0.0})
    assert asyncio.run(reward_func(None, [s, bad])) == [1.0, 0.0]
    assert s.metadata[TURN_SPANS_KEY] == {"starts": [0, 4], "stops": [2, 5], "n_tokens": 5}
    assert TURN_SPANS_KEY not in bad.metadata  # left to the hook, which names what is wrong
