"""The census's generated view and its one b: every group the buffer sees, the same code
in the simulator, the Miles buffer and the slime drain.

A drop arm's trained rollouts are its survivors; a comparison of behaviour between arms
must read every generated rollout. Each test here plants rollouts whose outcomes and turns
are known and checks that the dropped, aborted, filtered and still-buffered ones are in
``rollout/census/generated/*`` exactly as the trained ones are.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from buffer_store import FifoStore, load_function
from fake_sample import Sample

from rescue.census import Bucket, Census, RolloutRecord, outcome_metrics
from rescue.gate import Gate
from rescue.miles.buffer import RescueDataBuffer
from rescue.outcomes import Outcome
from rescue.slime.rollout import Drain

P = "rollout/census/"
G = P + "generated/"


def rec(outcome: Outcome, turns: int, reward: float | None = None, **kw) -> RolloutRecord:
    if reward is None:
        reward = 1.0 if outcome is Outcome.SOLVED else 0.0
    return RolloutRecord(outcome=outcome, reward=reward, turns=turns, **kw)


S, F, B = Outcome.SOLVED, Outcome.SUBMITTED_FAILURE, Outcome.BUDGET_FAILURE


def test_generated_counts_every_entered_group_whatever_becomes_of_it():
    census = Census()
    groups = {
        "trained": [rec(S, 4), rec(F, 8)],
        "dropped": [rec(S, 30), rec(B, 40, capped=True)],
        "aborted": [rec(S, 6), rec(Outcome.INFRA_NO_RESULT, 2, reward=None)],
        "filtered": [rec(F, 10), rec(F, 12)],
        "buffered": [rec(S, 2), rec(S, 2)],
    }
    for gid, records in groups.items():
        census.enter(gid, records)
    census.settle("trained", Bucket.TRAINED_FRESH, groups["trained"])
    census.settle("dropped", Bucket.DROPPED_STALE, groups["dropped"])
    census.settle("aborted", Bucket.ABORTED, groups["aborted"], reason="lost")
    census.settle("filtered", Bucket.FILTERED)
    m = census.step_metrics()
    everything = [r for rs in groups.values() for r in rs]
    assert m[G + "rollouts"] == 10
    assert m[G + "outcome/solved"] == 5 and m[G + "outcome/submitted_failure"] == 3
    assert m[G + "outcome/budget_failure"] == 1 and m[G + "outcome/infra_no_result"] == 1
    assert m[G + "turns_mean/solved"] == pytest.approx((4 + 30 + 6 + 2 + 2) / 5)
    assert m[G + "turns_mean/submitted_failure"] == pytest.approx(10.0)
    assert m[G + "cap_hit_rate"] == pytest.approx(0.1)
    # The same function of the same records as the trained view, under its own prefix.
    same = outcome_metrics(everything, G, trained=False)
    assert {k: v for k, v in m.items() if k.startswith(G)} == same
    # The trained view is unchanged: the trained group only.
    assert m[P + "rollouts"] == 2 and m[P + "turns_mean/solved"] == 4.0
    # What the trainer did with a rollout is not part of the generated view.
    assert not any(k.startswith(G + "masked_frac") or k.startswith(G + "b_") for k in m)
    # The next step starts empty.
    assert census.step_metrics()[G + "rollouts"] == 0


def test_a_group_entered_without_records_is_counted_in_the_buckets_only():
    census = Census()
    census.enter("g")
    census.settle("g", Bucket.TRAINED_FRESH, [rec(S, 3)])
    m = census.step_metrics()
    assert m[G + "rollouts"] == 0 and m[P + "rollouts"] == 1


def test_b_all_counts_masked_rollouts_and_scores_a_budget_failure_zero():
    census = Census()
    records = [
        rec(S, 3),
        rec(S, 4),
        rec(F, 9),
        rec(B, 40, reward=0.0, capped=True, masked=True),
        rec(B, 40, reward=0.7, capped=True),  # a framework that scored the cap 0.7
    ]
    census.enter("g", records)
    census.settle("g", Bucket.TRAINED_FRESH, records)
    m = census.step_metrics()
    assert m[P + "b_all"] == pytest.approx(2 / 5)  # every member, the cap scored 0
    assert m[P + "b_realized"] == pytest.approx((1 + 1 + 0 + 0.7) / 4)  # unmasked, as logged


def test_b_all_is_the_same_for_a_masking_and_a_non_masking_arm_on_the_same_batch():
    plain = [rec(S, 3), rec(F, 9), rec(B, 12, capped=True), rec(B, 12, capped=True)]
    masked = [RolloutRecord(**{**r.__dict__, "masked": r.outcome is B}) for r in plain]
    out = []
    for records in (plain, masked):
        census = Census()
        census.enter("g", records)
        census.settle("g", Bucket.TRAINED_FRESH, records)
        out.append(census.step_metrics())
    assert out[0][P + "b_all"] == out[1][P + "b_all"] == 0.25
    assert out[0][P + "b_realized"] == 0.25 and out[1][P + "b_realized"] == 0.5


# ---------------------------------------------------------------- the Miles buffer


def miles_group(gid: int, version: int, rewards=(1.0, 0.0, 1.0), turns=(3, 9, 5)):
    return [
        Sample(
            group_index=gid,
            index=gid * 10 + i,
            prompt=f"p{gid}",
            response="ok",
            response_length=1,
            reward=r,
            status=Sample.Status.COMPLETED,
            weight_versions=[str(version)],
            metadata={"turns": t},
        )
        for i, (r, t) in enumerate(zip(rewards, turns, strict=True))
    ]


def test_miles_buffer_logs_the_dropped_groups_rollouts_in_the_generated_view():
    async def go():
        args = SimpleNamespace(
            max_weight_staleness=1, dynamic_sampling_filter_path=None, reward_key=None
        )
        unused: list = []
        buffer = RescueDataBuffer(
            SimpleNamespace(args=args, unused_handler_fn=unused.append),
            env={"RESCUE_ARM": "drop"},
            store=FifoStore(100),
            load_function=load_function,
        )
        stale = miles_group(0, version=0, rewards=(1.0, 1.0, 1.0), turns=(30, 31, 32))
        fresh = miles_group(1, version=9, rewards=(1.0, 0.0, 1.0), turns=(3, 9, 5))
        for g in (stale, fresh):
            await buffer.put(SimpleNamespace(prompt_group=g, group=g))
        await buffer.get(current_version=10)
        return buffer.get_metrics()

    m = asyncio.run(go())
    assert m[P + "groups/dropped_stale"] == 1 and m[P + "groups/trained_fresh"] == 1
    # Trained: the fresh group only; generated: both.
    assert m[P + "outcome/solved"] == 2 and m[P + "turns_mean/solved"] == pytest.approx(4.0)
    assert m[G + "outcome/solved"] == 5
    assert m[G + "turns_mean/solved"] == pytest.approx((30 + 31 + 32 + 3 + 5) / 5)


# ---------------------------------------------------------------- the slime drain


class Worker:
    def __init__(self, groups):
        self.groups = list(enumerate(groups))

    def get_completed_groups(self, limit=None):
        out, self.groups = self.groups[:limit], self.groups[limit:]
        return out

    def queue_size(self):
        return len(self.groups)


def test_slime_drain_logs_the_dropped_groups_rollouts_in_the_generated_view():
    stale = miles_group(0, version=0, rewards=(1.0, 1.0, 1.0), turns=(30, 31, 32))
    fresh = miles_group(1, version=9, rewards=(1.0, 0.0, 1.0), turns=(3, 9, 5))
    drain = Drain(
        Worker([stale, fresh]),
        Gate(arm="drop", max_staleness=1),
        current_version=lambda: 10,
        poll_s=0.0,
    )
    _, m = drain.collect(SimpleNamespace(reward_key=None), target=1)
    assert m[P + "groups/dropped_stale"] == 1 and m[P + "outcome/solved"] == 2
    assert m[G + "outcome/solved"] == 5
    assert m[G + "turns_mean/solved"] == pytest.approx((30 + 31 + 32 + 3 + 5) / 5)
