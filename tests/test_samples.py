"""The core's sample model (``rescue.samples``, and ``rescue.gating``'s group through the gate)
on the tests' ``Sample`` and on Sample dicts."""

from __future__ import annotations

import copy

import pytest
from fake_sample import Sample

from rescue.census import Bucket, RolloutRecord, no_result
from rescue.gate import Gate, coin
from rescue.gating import gate_group
from rescue.outcomes import Outcome
from rescue.samples import (
    COIN_KEY,
    STALENESS_KEY,
    WEIGHT_KEY,
    WOULD_DROP_KEY,
    group_id,
    group_newest_weight_version,
    group_oldest_weight_version,
    group_records,
    group_staleness,
    rollout_key,
    rollout_record,
    trajectories_of,
)

S = Sample.Status


def group_of(gid: int, version: int, nested: bool = False) -> list:
    """Three completed samples of group ``gid`` generated at ``version``."""
    samples = [
        Sample(group_index=gid, index=gid * 10 + i, reward=float(i % 2), status=S.COMPLETED,
               weight_versions=[str(version)])
        for i in range(3)
    ]  # fmt: skip
    return [[s, copy.deepcopy(s)] for s in samples] if nested else samples


def test_group_id_falls_back_to_index_then_prompt_hash():
    assert group_id([Sample(group_index=4, index=40)]) == 4
    assert group_id([Sample(index=40)]) == "index:40"
    a = group_id([Sample(prompt="fix the bug")])
    assert a.startswith("prompt:") and a == group_id([{"prompt": "fix the bug"}])
    with pytest.raises(ValueError, match="empty"):
        group_id([])


def test_staleness_is_the_oldest_numeric_version_over_samples_and_turns():
    group = [
        [Sample(weight_versions=["7", "9"]), Sample(weight_versions=["8"])],
        Sample(weight_versions=["default", "6"]),
    ]
    assert group_oldest_weight_version(group) == 6
    assert group_staleness(group, 10) == 4
    assert group_staleness(group, None) is None
    assert group_staleness([Sample(weight_versions=["x"])], 10) is None


def test_newest_version_is_the_highest_numeric_version_over_samples_turns_and_dicts():
    group = [
        [Sample(weight_versions=["7", "9"]), Sample(weight_versions=["8"])],
        {"weight_versions": ["default", "11"]},
    ]
    assert group_newest_weight_version(group) == 11
    assert group_newest_weight_version([Sample(weight_versions=["x"])]) is None


def test_rollout_key_is_the_rollout_id_else_the_index():
    assert rollout_key(Sample(rollout_id=7, index=3)) == 7
    assert rollout_key({"index": 3}) == 3
    assert rollout_key(Sample()) is None


def test_gate_group_buckets_and_weights_a_group_as_the_gate_decides():
    gate = Gate(arm="protect", a=0.5, seed=0, max_staleness=0)
    won = next(g for g in range(100) if coin(0, g) < 0.5)
    lost = next(g for g in range(100) if coin(0, g) >= 0.5)
    fresh = group_of(lost, version=3)
    fresh[0].metadata[WEIGHT_KEY] = 2.0  # a leftover weight is removed
    gated = gate_group(gate, fresh, 3)
    assert (gated.gid, gated.bucket, gated.staleness, gated.weight) == (
        lost,
        Bucket.TRAINED_FRESH,
        0,
        1.0,
    )
    assert gated.kept and all(WEIGHT_KEY not in s.metadata for s in fresh)
    protected = group_of(won, version=1, nested=True)
    gated = gate_group(gate, protected, 3)
    assert gated.bucket is Bucket.TRAINED_PROTECTED and gated.weight == 2.0
    assert all(s.metadata[WEIGHT_KEY] == 2.0 for t in protected for s in t)
    dropped = group_of(lost, version=1)
    gated = gate_group(gate, dropped, 3)
    assert gated.bucket is Bucket.DROPPED_STALE and not gated.kept
    assert all(WEIGHT_KEY not in s.metadata for s in dropped)
    stale = gate_group(Gate(arm="never-drop", max_staleness=0), group_of(lost, version=1), 3)
    assert stale.bucket is Bucket.TRAINED_STALE and stale.weight == 1.0


def test_abort_is_a_group_without_result_in_nested_trajectories_and_sample_dicts():
    assert no_result(group_records([[Sample(), Sample(status=S.ABORTED)]])) == "aborted"
    assert no_result(group_records([{"status": "aborted"}])) == "aborted"
    fine = [Sample(status=S.TRUNCATED, reward=0.0), {"status": "completed", "reward": 1.0}]
    assert no_result(group_records(fine)) is None


def test_record_of_a_list_of_samples_trajectory():
    turn1 = Sample(status=S.COMPLETED, reward=None, weight_versions=["1"], metadata={"a": 1})
    turn2 = Sample(status=S.TRUNCATED, reward=0.0, weight_versions=["2"], remove_sample=True)
    r = rollout_record([turn1, turn2])
    assert r.outcome is Outcome.BUDGET_FAILURE and r.capped
    assert r.turns == 2 and r.reward == 0.0
    assert not r.masked  # turn 1 still trains
    turn1.remove_sample = True
    assert rollout_record([turn1, turn2]).masked
    turn1.status = S.ABORTED
    assert rollout_record([turn1, turn2]).outcome is Outcome.INFRA_NO_RESULT


def test_record_of_a_sample_dict_reads_agent_metadata():
    d = {
        "status": "completed",
        "reward": 1.0,
        "weight_versions": ["3"],
        "metadata": {
            "exit_status": "Submitted",
            "agent_metrics": {"turns": 12},
            "ran_repo_tests": True,
        },
    }
    r = rollout_record(d)
    assert (r.outcome, r.turns, r.ran_tests) == (Outcome.SOLVED, 12, True)
    agentic_without_exit = dict(d, metadata={"instance_id": "x"})
    assert rollout_record(agentic_without_exit).outcome is Outcome.INFRA_NO_RESULT


def test_plain_sample_records_equal_the_uncached_classification():
    for status in (S.COMPLETED, S.TRUNCATED, S.FAILED):
        for reward in (None, 0.0, 1.0, 0.7):
            s = Sample(status=status, reward=reward, weight_versions=["1", "1"])
            expect = RolloutRecord.from_sample_fields(status=status, reward=reward, turns=2)
            assert rollout_record(s) == expect
            assert rollout_record(s) == expect  # second call: memoized


def test_a_dict_reward_needs_the_reward_key():
    s = Sample(reward={"score": 1.0, "acc": 0.0}, status=S.COMPLETED)
    assert rollout_record(s, reward_key="acc").reward == 0.0
    with pytest.raises(ValueError, match="--reward-key"):
        rollout_record(s)
    with pytest.raises(
        ValueError, match=r"no key 'pass' \(--reward-key\); its keys: \['acc', 'score'\]"
    ):
        rollout_record(s, reward_key="pass")


def test_trajectories_of_a_flat_batch_group_siblings_by_rollout_id():
    a = [Sample(group_index=1, index=i, rollout_id=7) for i in range(3)]
    b = [Sample(group_index=1, index=10), Sample(group_index=1, index=11)]
    c = [Sample(group_index=2, index=20, rollout_id=7)]
    assert [len(t) for t in trajectories_of([*a, *b, *c])] == [3, 1, 1, 1]


def test_gate_group_records_staleness_would_drop_and_the_coin_on_every_sample():
    gate = Gate(arm="never-drop", seed=4, max_staleness=1)
    stale = group_of(7, version=1, nested=True)
    fresh = [{"group_index": 8, "weight_versions": ["3"]}, {"group_index": 8, "metadata": None}]
    gate_group(gate, stale, 3)
    gate_group(gate, fresh, 3)
    for s in (s for t in stale for s in t):
        assert s.metadata[STALENESS_KEY] == 2 and s.metadata[WOULD_DROP_KEY] is True
        assert s.metadata[COIN_KEY] == coin(4, 7)
    for s in fresh:
        assert s["metadata"][STALENESS_KEY] == 0 and s["metadata"][WOULD_DROP_KEY] is False
        assert s["metadata"][COIN_KEY] == coin(4, 8)
    # the drop arm tags the groups it drops too, and unknown staleness is recorded as None
    dropped = group_of(9, version=0)
    assert not gate_group(Gate(arm="drop", max_staleness=1), dropped, 3).kept
    assert all(s.metadata[WOULD_DROP_KEY] for s in dropped)
    unknown = [Sample(group_index=5)]
    gate_group(gate, unknown, 3)
    assert unknown[0].metadata[STALENESS_KEY] is None
    assert unknown[0].metadata[WOULD_DROP_KEY] is False
