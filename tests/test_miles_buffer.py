"""The Miles buffer: Miles' behaviour for fresh groups, the gate for stale ones, the census.

Unit tests run without Miles on the tests' ``Sample`` (``fake_sample``) and a FIFO store
(``buffer_store``); the tests that call ``require_miles`` run the buffer inside real Miles
code (set ``MILES_SRC``). The sample model itself is tested in ``test_samples.py``.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from buffer_store import FifoStore, load_function
from fake_sample import Sample, check_against
from miles_env import require_miles

from rescue.census import Bucket, no_result
from rescue.gate import coin
from rescue.miles.buffer import QUEUE_SIZE_KEY, RescueDataBuffer
from rescue.samples import (
    WEIGHT_KEY,
    group_id,
    group_oldest_weight_version,
    group_records,
    rollout_record,
)

P = "rollout/census/"
N = 3  # samples per group


def fake_group(
    gid: int, version: int | None = 0, status: Any = None, nested: bool = False, cls: Any = Sample
):
    """N completed samples of group ``gid`` with rewards 0, 1, 0, ... (``cls``: the Sample class)."""
    versions = [] if version is None else [str(version)]
    samples = [
        cls(
            group_index=gid,
            index=gid * 10 + i,
            prompt=f"prompt {gid}",
            response="ok",
            response_length=1,
            reward=float(i % 2),
            status=status or cls.Status.COMPLETED,
            weight_versions=list(versions),
        )
        for i in range(N)
    ]
    if nested:  # one trajectory = [turn 1, turn 2]
        return [[s, copy.deepcopy(s)] for s in samples]
    return samples


def make_buffer(env=None, max_staleness=None, capacity=1000, filter_path=None, reward_key=None):
    unused: list = []
    args = SimpleNamespace(
        max_weight_staleness=max_staleness,
        dynamic_sampling_filter_path=filter_path,
        reward_key=reward_key,
    )
    ctor = SimpleNamespace(args=args, unused_handler_fn=unused.append)
    buffer = RescueDataBuffer(
        ctor, env=env or {}, store=FifoStore(capacity), load_function=load_function
    )
    return buffer, unused


def entry(group):
    return SimpleNamespace(prompt_group=group, group=group)


def run(coro):
    return asyncio.run(coro)


async def put_all(buffer, groups):
    for g in groups:
        await buffer.put(entry(g))


# ── fresh groups: Miles' behaviour ───────────────────────────────────────────


def test_fresh_groups_leave_in_fifo_order_unweighted_and_settle_trained_fresh():
    async def go():
        buffer, unused = make_buffer(max_staleness=2)
        await put_all(buffer, [fake_group(g, version=9) for g in range(5)])
        out = [(await buffer.get(current_version=10)).group for _ in range(5)]
        return unused, out, buffer.get_metrics()

    unused, out, m = run(go())
    assert [group_id(g) for g in out] == [0, 1, 2, 3, 4]
    assert unused == []
    assert all(WEIGHT_KEY not in s.metadata for g in out for s in g)
    assert m[f"{P}groups/trained_fresh"] == 5
    assert m[f"{P}groups/entered"] == 5
    assert m[f"{P}staleness_mean"] == 1.0
    assert m[QUEUE_SIZE_KEY] == 0
    assert m["rollout/fully_async/stale_groups_filtered"] == 0


def test_unknown_staleness_is_fresh_even_with_a_zero_limit():
    """No current version (before the first weight update) or no numeric versions."""

    async def go():
        buffer, unused = make_buffer(env={"RESCUE_ARM": "drop"}, max_staleness=0)
        await put_all(buffer, [fake_group(1, version=0), fake_group(2, version=None)])
        a = await buffer.get(current_version=None)
        b = await buffer.get(current_version=50)
        return unused, a, b, buffer.get_metrics()

    unused, a, b, m = run(go())
    assert group_id(a.group) == 1 and group_id(b.group) == 2
    assert unused == []
    assert m[f"{P}groups/trained_fresh"] == 2


def test_aborted_group_goes_to_the_handler_and_settles_aborted():
    async def go():
        buffer, unused = make_buffer()
        group = fake_group(1)
        group[1].status = Sample.Status.ABORTED
        await buffer.put(entry(group))
        await buffer.put(entry(fake_group(2)))
        got = await buffer.get(current_version=0)
        return group, unused, got, buffer.get_metrics()

    group, unused, got, m = run(go())
    assert unused == [group]
    assert group_id(got.group) == 2
    assert m["rollout/fully_async/aborted_groups_filtered"] == 1
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}groups/trained_fresh"] == 1


def agentic_group(gid: int, version: int = 0, trouble: dict | None = None, cls: Any = Sample):
    """A group of SWE trials as Miles hands them over: status COMPLETED (a model call
    happened), the agent's metadata, reward 0 for what Miles' reward function cannot score.
    ``trouble`` replaces the second trial's metadata."""
    group = fake_group(gid, version, cls=cls)
    for s in group:
        s.metadata = {
            "instance_id": f"task-{gid}",
            "exit_status": "Submitted",
            "outcome": "solved" if s.reward else "submitted_failure",
        }
    if trouble is not None:
        group[1].metadata = {"instance_id": f"task-{gid}", **trouble}
        group[1].reward = 0.0
    return group


TIMEOUT = {
    "exit_status": "TrialTimeout",
    "outcome": "infra_no_result",
    "outcome_reason": "trial_timeout",
}


@pytest.mark.parametrize("arm", ["drop", "never-drop", "protect"])
@pytest.mark.parametrize(
    ("trouble", "reason"),
    [
        (TIMEOUT, "trial_timeout"),
        (
            {
                "exit_status": "SandboxError",
                "outcome": "infra_no_result",
                "outcome_reason": "container_lost",
            },
            "container_lost",
        ),
        ({}, "no_exit_status"),  # the agent function returned nothing after a model call
    ],
    ids=["trial-timeout", "container-lost", "agent-returned-nothing"],
)
def test_a_group_without_a_result_goes_to_the_handler_in_every_arm(arm, trouble, reason):
    """Miles would queue it (no sample is ABORTED) and train the trial as reward 0."""
    env = {"RESCUE_ARM": arm, **({"RESCUE_A": "0.5"} if arm == "protect" else {})}

    async def go():
        buffer, unused = make_buffer(env=env, max_staleness=2)
        broken = agentic_group(1, trouble=trouble)
        await put_all(buffer, [broken, agentic_group(2)])
        got = await buffer.get(current_version=0)
        return broken, unused, got, buffer.get_metrics()

    broken, unused, got, m = run(go())
    assert unused == [broken] and group_id(got.group) == 2
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}groups/trained_fresh"] == 1
    assert m[f"{P}aborted/reason/{reason}"] == 1
    assert m["rollout/fully_async/aborted_groups_filtered"] == 1
    assert m[f"{P}outcome/infra_no_result"] == 0  # nothing without a result was trained


def reject_group_1(args, group):
    """A dynamic filter in Miles' style: DynamicFilterOutput-like with a reason."""
    keep = group[0].group_index != 1
    return SimpleNamespace(keep=keep, reason=None if keep else "rejected")


def reject_group_2_legacy(args, group):
    """A legacy dynamic filter returning a bool."""
    return group[0].group_index != 2


@pytest.mark.parametrize(
    "filter_name, reason_key",
    [("reject_group_1", "rollout/dynamic_filter/drop_rejected"), ("reject_group_2_legacy", None)],
)
def test_dynamic_filter_rejects_are_dropped_not_recycled(filter_name, reason_key):
    async def go():
        buffer, unused = make_buffer(filter_path=f"{__name__}.{filter_name}")
        await put_all(buffer, [fake_group(g) for g in (1, 2, 3)])
        got = [group_id((await buffer.get(current_version=0)).group) for _ in range(2)]
        return unused, got, buffer.get_metrics()

    unused, got, m = run(go())
    rejected = 1 if filter_name == "reject_group_1" else 2
    assert got == [g for g in (1, 2, 3) if g != rejected]
    assert unused == []
    assert m[f"{P}groups/filtered"] == 1
    if reason_key:
        assert m[reason_key] == 1


def test_put_blocks_at_capacity_and_the_census_counts_the_blocked_put():
    async def go():
        buffer, _ = make_buffer(capacity=2)
        await put_all(buffer, [fake_group(1), fake_group(2)])
        blocked = asyncio.create_task(buffer.put(entry(fake_group(3))))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        m = buffer.get_metrics()  # conservation holds with a put still waiting
        assert m[QUEUE_SIZE_KEY] == 2 and m[f"{P}groups/buffered"] == 3
        first = await buffer.get(current_version=0)
        await blocked
        rest = [await buffer.get(current_version=0) for _ in range(2)]
        return [group_id(e.group) for e in (first, *rest)], buffer.get_metrics()

    order, m = run(go())
    assert order == [1, 2, 3]
    assert m[f"{P}groups/trained_fresh"] == 3 and m[f"{P}groups/buffered"] == 0


# ── stale groups: the gate ───────────────────────────────────────────────────


def test_drop_arm_sends_every_stale_group_to_the_handler():
    async def go():
        buffer, unused = make_buffer(env={"RESCUE_ARM": "drop"}, max_staleness=2)
        stale = [fake_group(g, version=5) for g in range(4)]
        await put_all(buffer, [*stale, fake_group(9, version=9)])
        got = await buffer.get(current_version=10)
        return stale, unused, got, buffer.get_metrics()

    stale, unused, got, m = run(go())
    assert group_id(got.group) == 9
    assert unused == stale
    assert m["rollout/fully_async/stale_groups_filtered"] == 4
    assert m[f"{P}groups/dropped_stale"] == 4
    # The outcomes of the dropped rollouts are counted: rewards 0, 1, 0 per group.
    assert m[f"{P}dropped/outcome/solved"] == 4
    assert m[f"{P}dropped/outcome/submitted_failure"] == 8


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "list-of-samples"])
def test_protect_keeps_stale_groups_by_their_coin_and_weights_every_sample(nested):
    a, seed = 0.4, 7
    env = {"RESCUE_ARM": "protect", "RESCUE_A": str(a), "RESCUE_SEED": str(seed)}
    ids = list(range(100, 160))

    async def go():
        buffer, unused = make_buffer(env=env, max_staleness=1)
        await put_all(buffer, [fake_group(g, version=0, nested=nested) for g in ids])
        await buffer.put(entry(fake_group(999, version=3)))  # fresh sentinel
        kept = []
        while True:
            e = await buffer.get(current_version=3)
            if group_id(e.group) == 999:
                break
            kept.append(e.group)
        return unused, kept, buffer.get_metrics()

    unused, kept, m = run(go())
    expect_kept = [g for g in ids if coin(seed, g) < a]
    assert [group_id(g) for g in kept] == expect_kept
    assert sorted(group_id(g) for g in unused) == [g for g in ids if g not in expect_kept]
    for g in kept:
        samples = [s for t in g for s in (t if isinstance(t, list) else [t])]
        assert len(samples) == N * (2 if nested else 1)
        assert all(s.metadata[WEIGHT_KEY] == pytest.approx(1 / a) for s in samples)
    assert all(
        WEIGHT_KEY not in s.metadata for g in unused for t in g for s in (t if nested else [t])
    )
    assert m[f"{P}groups/trained_protected"] == len(expect_kept)
    assert m[f"{P}protected_groups"] == len(expect_kept)
    assert m[f"{P}protected_weight_mean"] == pytest.approx(1 / a)
    assert m[f"{P}groups/dropped_stale"] == len(ids) - len(expect_kept)
    assert m["rollout/fully_async/stale_groups_filtered"] == len(ids) - len(expect_kept)


def test_protect_with_a_one_trains_stale_groups_with_weight_one():
    async def go():
        buffer, unused = make_buffer(
            env={"RESCUE_ARM": "protect", "RESCUE_A": "1"}, max_staleness=0
        )
        await put_all(buffer, [fake_group(g, version=0) for g in range(10)])
        out = [(await buffer.get(current_version=1)).group for _ in range(10)]
        return unused, out, buffer.get_metrics()

    unused, out, m = run(go())
    assert unused == []
    assert all(WEIGHT_KEY not in s.metadata for g in out for s in g)
    assert m[f"{P}groups/trained_stale"] == 10 and m[f"{P}protected_groups"] == 0


def test_never_drop_trains_stale_groups_with_weight_one():
    async def go():
        buffer, unused = make_buffer(env={"RESCUE_ARM": "never-drop"}, max_staleness=0)
        await put_all(buffer, [fake_group(g, version=0) for g in range(6)])
        out = [(await buffer.get(current_version=4)).group for _ in range(6)]
        return unused, out, buffer.get_metrics()

    unused, out, m = run(go())
    assert unused == [] and len(out) == 6
    assert all(WEIGHT_KEY not in s.metadata for g in out for s in g)
    assert m[f"{P}groups/trained_stale"] == 6
    assert m[f"{P}staleness_max"] == 4.0


def test_a_leftover_weight_is_removed_when_a_group_is_trained_unprotected():
    async def go():
        buffer, _ = make_buffer(max_staleness=2)
        group = fake_group(1, version=9)
        for s in group:
            s.metadata[WEIGHT_KEY] = 2.5
        await buffer.put(entry(group))
        return (await buffer.get(current_version=10)).group

    assert all(WEIGHT_KEY not in s.metadata for s in run(go()))


def test_a_retried_stale_group_meets_the_same_coin():
    """With ``--async-unused-samples-handler retry`` a dropped group comes back; same answer."""
    env = {"RESCUE_ARM": "protect", "RESCUE_A": "0.5", "RESCUE_SEED": "3"}
    dropped_id = next(g for g in range(1000) if coin(3, g) >= 0.5)

    async def go():
        buffer, unused = make_buffer(env=env, max_staleness=0)
        for _ in range(3):
            await buffer.put(entry(fake_group(dropped_id, version=0)))
        await buffer.put(entry(fake_group(5000, version=1)))
        got = await buffer.get(current_version=1)
        return unused, got, buffer.get_metrics()

    unused, got, m = run(go())
    assert group_id(got.group) == 5000
    assert [group_id(g) for g in unused] == [dropped_id] * 3
    assert m[f"{P}groups/dropped_stale"] == 3


@pytest.mark.parametrize(
    "env, match",
    [
        ({"RESCUE_ARM": "sometimes"}, "RESCUE_ARM"),
        ({"RESCUE_ARM": "protect"}, "RESCUE_A"),
        ({"RESCUE_ARM": "protect", "RESCUE_A": "0"}, "RESCUE_A"),
        ({"RESCUE_ARM": "protect", "RESCUE_A": "1.5"}, "RESCUE_A"),
        ({"RESCUE_ARM": "protect", "RESCUE_A": "half"}, "RESCUE_A"),
        ({"RESCUE_SEED": "x"}, "RESCUE_SEED"),
    ],
)
def test_invalid_settings_fail_when_the_buffer_is_built(env, match):
    with pytest.raises(ValueError, match=match):
        make_buffer(env=env, max_staleness=1)


def test_the_pace_arm_needs_the_pace_rollout_function():
    """Under Miles' own rollout function pace would be never-drop without the waiting."""
    for path in (None, "miles.rollout.fully_async_rollout.FullyAsyncRolloutFn"):
        args = SimpleNamespace(max_weight_staleness=1, rollout_function_path=path)
        ctor = SimpleNamespace(args=args, unused_handler_fn=lambda group: None)
        with pytest.raises(ValueError, match=r"^RESCUE_ARM=pace needs --rollout-function-path "):
            RescueDataBuffer(
                ctor, env={"RESCUE_ARM": "pace"}, store=FifoStore(4), load_function=load_function
            )


def test_an_invalid_staleness_limit_fails_when_the_buffer_is_built():
    with pytest.raises(ValueError, match="max_weight_staleness"):
        make_buffer(max_staleness=-1)


def test_protect_with_the_retry_handler_warns_that_it_reweights_prompts(caplog):
    protect = {"RESCUE_ARM": "protect", "RESCUE_A": "0.5"}
    args = SimpleNamespace(max_weight_staleness=1, async_unused_samples_handler="retry")
    ctor = SimpleNamespace(args=args, unused_handler_fn=lambda group: None)
    with caplog.at_level("WARNING", logger="rescue.miles.buffer"):
        RescueDataBuffer(ctor, env=protect, store=FifoStore(10), load_function=load_function)
    assert "1 + (1 - a) times" in caplog.text
    caplog.clear()
    args.async_unused_samples_handler = "drop"
    with caplog.at_level("WARNING", logger="rescue.miles.buffer"):
        RescueDataBuffer(ctor, env=protect, store=FifoStore(10), load_function=load_function)
    assert "retry" not in caplog.text


# ── census: masks and conservation ───────────────────────────────────────────


def test_masked_fraction_reads_remove_sample_set_between_get_and_get_metrics():
    """Miles runs the sample filter after the last get() and before get_metrics()."""

    async def go():
        buffer, _ = make_buffer()
        await put_all(buffer, [fake_group(g) for g in range(4)])
        batch = [(await buffer.get(current_version=0)).group for _ in range(4)]
        for g in batch:  # the sample filter
            g[0].remove_sample = True
        return buffer.get_metrics()

    m = run(go())
    assert m[f"{P}masked_frac"] == pytest.approx(1 / N)
    assert m[f"{P}rollouts"] == 4 * N
    # rewards per group 0, 1, 0 with the first (reward 0) masked: b = mean(1, 0)
    assert m[f"{P}b_realized"] == pytest.approx(0.5)


def test_conservation_under_random_aborts_staleness_filters_and_retries():
    """A random producer/consumer with the retry handler; the census asserts conservation
    at every get_metrics (open entries = queued + blocked puts), and every trained sample's
    weight matches its group's gate decision."""
    rng = np.random.default_rng(11)
    env = {"RESCUE_ARM": "protect", "RESCUE_A": "0.3", "RESCUE_SEED": "5"}
    retry: list = []
    args = SimpleNamespace(
        max_weight_staleness=1,
        dynamic_sampling_filter_path=f"{__name__}.reject_group_1",
        reward_key=None,
    )
    buffer = RescueDataBuffer(
        SimpleNamespace(args=args, unused_handler_fn=retry.append),
        env=env,
        store=FifoStore(8),
        load_function=load_function,
    )
    totals = {b.value: 0 for b in Bucket}

    async def go():
        version, next_id = 0, 2
        producers: set[asyncio.Task] = set()
        for _ in range(200):
            for _ in range(int(rng.integers(0, 5))):
                if retry and rng.random() < 0.5:
                    gid = group_id(retry.pop(0))
                else:
                    gid, next_id = (1 if rng.random() < 0.05 else next_id), next_id + 1
                g = fake_group(gid, version=version - int(rng.integers(0, 4)))
                if rng.random() < 0.1:
                    g[int(rng.integers(0, N))].status = Sample.Status.ABORTED
                producers.add(asyncio.create_task(buffer.put(entry(g))))
            await asyncio.sleep(0)
            for _ in range(int(rng.integers(0, 5))):
                try:
                    e = await asyncio.wait_for(buffer.get(current_version=version), 0.001)
                except asyncio.TimeoutError:
                    break
                w = e.group[0].metadata.get(WEIGHT_KEY, 1.0)
                assert all(s.metadata.get(WEIGHT_KEY, 1.0) == w for s in e.group)
                assert w in (1.0, pytest.approx(1 / 0.3))
            m = buffer.get_metrics()
            for b in Bucket:
                totals[b.value] += m[f"{P}groups/{b.value}"]
            producers = {t for t in producers if not t.done()}
            version += int(rng.random() < 0.3)
        for t in producers:
            t.cancel()

    run(go())
    t = buffer.census.totals()
    assert {b.value: t[b.value] for b in Bucket} == totals
    assert t["entered"] == sum(totals.values()) + t["buffered"]
    # every bucket protect (a < 1) can reach; Miles' worker has no lost groups (slime's has);
    # a restart's losses are tests/test_restart.py's
    for b in set(Bucket) - {Bucket.TRAINED_STALE, Bucket.LOST, Bucket.LOST_AT_RESTART}:
        assert totals[b.value] > 0, b


# ── the watchdog ─────────────────────────────────────────────────────────────


def no_docker_group(gid: int):
    """A group every trial of which failed at container start (the agent's result dict)."""
    group = fake_group(gid, version=0)
    for s in group:
        s.reward = 0.0
        s.metadata.update(
            outcome="infra_no_result",
            outcome_reason="container_start",
            error="Cannot connect to the Docker daemon at unix:///var/run/docker.sock",
        )
    return group


def watched_buffer(env, flushed):
    args = SimpleNamespace(
        max_weight_staleness=2, dynamic_sampling_filter_path=None, reward_key=None
    )
    return RescueDataBuffer(
        SimpleNamespace(args=args, unused_handler_fn=lambda g: None),
        env=env,
        store=FifoStore(1000),
        load_function=load_function,
        tracking=flushed.append,
    )


def test_the_watchdog_stops_a_run_whose_groups_have_no_result_with_the_census_flushed_first():
    from rescue.miles.buffer import WATCHDOG_KEY
    from rescue.watchdog import WatchdogStop

    flushed: list = []
    env = {"RESCUE_WATCHDOG_WINDOW": "4", "RESCUE_WATCHDOG_MAX_NO_RESULT": "0.5"}

    async def go():
        buffer = watched_buffer(env, flushed)
        await buffer.put(entry(fake_group(1, version=0)))  # a result
        for gid in (2, 3):
            await buffer.put(entry(no_docker_group(gid)))
        assert flushed == []  # 2 of 3: the window is not full
        await buffer.put(entry(no_docker_group(4)))  # 3 of 4 > 0.5
        return buffer

    with pytest.raises(WatchdogStop) as stop:
        run(go())
    line = stop.value.line
    assert "3 of the last 4 groups had no result" in line and "\n" not in line
    assert "dominant reason container_start (3 of 4 groups)" in line
    assert "Cannot connect to the Docker daemon" in line and line.endswith("census flushed")
    (metrics,) = flushed
    assert metrics[WATCHDOG_KEY] == 1.0
    assert metrics[f"{P}groups/aborted"] == 3 and metrics[f"{P}groups/entered"] == 4
    assert metrics[f"{P}no_result/fraction/container_start"] == 3 / 4
    assert metrics["rollout/fully_async/aborted_groups_filtered"] == 3


def test_groups_with_results_keep_the_run_going():
    flushed: list = []
    env = {"RESCUE_WATCHDOG_WINDOW": "4", "RESCUE_WATCHDOG_MAX_NO_RESULT": "0.5"}

    async def go():
        buffer = watched_buffer(env, flushed)
        for gid in range(40):  # one in four without a result
            g = no_docker_group(gid) if gid % 4 == 0 else fake_group(gid, version=0)
            await buffer.put(entry(g))
        return buffer.get_metrics()

    m = run(go())
    assert flushed == [] and m[f"{P}no_result/fraction"] == 10 / 40


def test_the_watchdog_stops_a_drain_that_waits_with_no_group_finishing():
    from virtual_clock import run_virtual

    from rescue.watchdog import WatchdogStop

    flushed: list = []
    env = {"RESCUE_WATCHDOG_IDLE_S": "600"}

    async def go():
        loop = asyncio.get_running_loop()
        buffer = watched_buffer(env, flushed)
        await asyncio.sleep(500)
        await buffer.put(entry(fake_group(1, version=0)))  # a group finishes: the clock resets
        assert (await buffer.get(current_version=0)).group[0].group_index == 1
        t0 = loop.time()
        try:
            await buffer.get(current_version=0)  # nothing comes any more
        finally:
            waited = loop.time() - t0
        return waited

    with pytest.raises(WatchdogStop, match="no group finished for 600 s") as stop:
        run_virtual(go())
    assert "1 groups finished before, 0 without a result" in stop.value.line
    assert len(flushed) == 1 and flushed[0][f"{P}groups/trained_fresh"] == 1


def test_a_get_cancelled_while_waiting_hands_its_group_to_the_next_get():
    async def go():
        buffer, _ = make_buffer(max_staleness=2)
        waiting = asyncio.create_task(buffer.get(current_version=0))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await buffer.put(entry(fake_group(5, version=0)))
        await asyncio.sleep(0)  # the store hands it to the wait the cancelled get left
        m = buffer.get_metrics()  # counted as buffered, not lost
        got = await buffer.get(current_version=0)
        return m, got, buffer.get_metrics()

    m, got, after = run(go())
    assert m[f"{P}groups/buffered"] == 1 and m[QUEUE_SIZE_KEY] == 0
    assert group_id(got.group) == 5 and after[f"{P}groups/trained_fresh"] == 1


# ── the tests' Sample is Miles' Sample ───────────────────────────────────────


def test_the_fake_sample_has_miles_fields_defaults_and_statuses():
    require_miles()
    from miles.utils.types import Sample as MilesSample

    assert check_against(MilesSample) == []


# ── packaging ────────────────────────────────────────────────────────────────


def test_rescue_miles_imports_without_miles():
    code = (
        "import sys, rescue.miles, rescue.miles.buffer, rescue.miles.log, rescue.samples;"
        "assert 'miles' not in sys.modules, 'imported miles'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_building_the_buffer_without_miles_names_the_fix(tmp_path):
    """In a fresh interpreter without Miles on its path (whatever MILES_SRC is here)."""
    code = (
        "import importlib.util, types\n"
        "assert importlib.util.find_spec('miles') is None, 'Miles is importable'\n"
        "from rescue.miles.buffer import RescueDataBuffer\n"
        "args = types.SimpleNamespace(max_weight_staleness=None)\n"
        "try:\n"
        "    RescueDataBuffer(types.SimpleNamespace(args=args, unused_handler_fn=print), env={})\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "needs Miles importable" in out.stdout and "PYTHONPATH" in out.stdout


# ── inside real Miles (MILES_SRC) ────────────────────────────────────────────


def miles_args(**overrides):
    """The arguments FullyAsyncRolloutFn and DefaultDataBuffer read."""
    defaults = dict(
        rollout_global_dataset=True,
        rollout_batch_size=4,
        n_samples_per_prompt=N,
        max_weight_staleness=None,
        async_max_concurrent_samples=None,
        async_data_buffer_capacity_factor=1000.0,
        async_unused_samples_handler="drop",
        custom_async_data_buffer_path=None,
        rollout_submission_granularity=None,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        eval_num_gpus=0,
        reward_key=None,
    )
    defaults.update(overrides)
    return SimpleNamespace(**defaults)


def miles_group(gid: int, version: int, status=None, nested: bool = False):
    """``fake_group`` with Miles' own ``Sample``."""
    from miles.utils.types import Sample as MilesSample

    return fake_group(gid, version, status, nested, cls=MilesSample)


def mask_first_sample(args, data):
    """A --rollout-sample-filter-path: masks the first trajectory of every group."""
    for group in data:
        first = group[0]
        for s in first if isinstance(first, list) else [first]:
            s.remove_sample = True


def test_miles_fully_async_rollout_trains_protected_groups_weighted(monkeypatch):
    require_miles()
    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput

    a, seed = 0.5, 1
    monkeypatch.setenv("RESCUE_ARM", "protect")
    monkeypatch.setenv("RESCUE_A", str(a))
    monkeypatch.setenv("RESCUE_SEED", str(seed))
    stale_ids = list(range(1, 13))
    nested_ids = {2, 3, 5, 8}

    class DataSource:
        def __init__(self):
            self.next_id, self.recycled = 1000, []
            self.scripted = [miles_group(g, version=0) for g in stale_ids]

        def get_samples(self, n):
            if self.scripted:
                return [self.scripted.pop(0)]
            self.next_id += 1
            return [miles_group(self.next_id, version=10)]

        def add_samples(self, groups):
            self.recycled.extend(groups)

    async def generate(state, group, sampling_params, evaluation=False, sample_done_callback=None):
        await asyncio.sleep(0)
        if group[0].group_index in nested_ids:  # a multi-sample generate function
            return [[s, copy.deepcopy(s)] for s in group]
        return group

    monkeypatch.setattr(
        fully_async, "GenerateState", lambda args: SimpleNamespace(sampling_params={})
    )
    monkeypatch.setattr(fully_async, "generate_and_rm_group", generate)
    args = miles_args(
        rollout_batch_size=8,
        max_weight_staleness=2,
        async_unused_samples_handler="retry",
        custom_async_data_buffer_path="rescue.miles.buffer.RescueDataBuffer",
        rollout_sample_filter_path=f"{__name__}.mask_first_sample",
    )
    data_source = DataSource()

    async def go():
        fn = fully_async.FullyAsyncRolloutFn(
            RolloutFnConstructorInput(args=args, data_source=data_source)
        )
        out = await fn(RolloutFnTrainInput(rollout_id=0, weight_version=10))
        return fn, out

    fn, out = run(go())
    assert isinstance(fn._output, RescueDataBuffer)
    assert isinstance(fn._output, fully_async.DataBuffer)
    kept = []
    for g in out.samples:
        first = g[0][0] if isinstance(g[0], list) else g[0]
        samples = [s for t in g for s in (t if isinstance(t, list) else [t])]
        if first.group_index in stale_ids:
            kept.append(first.group_index)
            assert all(s.metadata[WEIGHT_KEY] == 1 / a for s in samples)
        else:
            assert all(WEIGHT_KEY not in s.metadata for s in samples)
    recycled = [grp[0].group_index for grp in data_source.recycled]
    # Kept stale groups won their coin, recycled ones lost it; both happened.
    assert kept and recycled
    assert all(coin(seed, g) < a for g in kept)
    assert all(coin(seed, g) >= a and g in stale_ids for g in recycled)
    assert any(g in nested_ids for g in kept)
    m = out.metrics
    assert m[f"{P}groups/trained_protected"] == len(kept)
    assert m[f"{P}groups/dropped_stale"] == len(recycled)
    assert m["rollout/fully_async/stale_groups_filtered"] == len(recycled)
    assert m[f"{P}groups/trained_fresh"] == 8 - len(kept)
    assert m[f"{P}protected_weight_mean"] == 1 / a
    assert m[f"{P}masked_frac"] == pytest.approx(1 / N)  # the sample filter ran before
    assert m["rollout/fully_async/max_staleness"] == 10


async def _drive(buffer, stream, gets, version):
    """Feed a stream of groups to a buffer, then get ``gets`` groups; record everything."""
    for g in stream:
        await buffer.put(entry(g))
    out = [await buffer.get(current_version=version) for _ in range(gets)]
    return [e.group for e in out], buffer.get_metrics()


def miles_reject_odd(args, group, **kw):
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput

    keep = group_id(group) % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


@pytest.mark.parametrize("arm_env", [{}, {"RESCUE_ARM": "drop"}], ids=["default", "drop"])
def test_miles_default_buffer_and_ours_agree_on_fresh_aborted_filtered_and_dropped(arm_env):
    """The same stream through Miles' DefaultDataBuffer and ours: same groups out in the
    same order, same groups to the handler, same Miles metrics (the drop arm is Miles)."""
    require_miles()
    from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput, DefaultDataBuffer
    from miles.utils.types import Sample

    def stream():
        rng = np.random.default_rng(4)
        out = []
        for gid in range(60):
            aborted = rng.random() < 0.15
            out.append(
                miles_group(
                    gid,
                    version=int(rng.integers(5, 11)),
                    status=Sample.Status.ABORTED if aborted else None,
                    nested=rng.random() < 0.3,
                )
            )
        return out

    args = miles_args(
        rollout_batch_size=64,
        max_weight_staleness=3,
        dynamic_sampling_filter_path=f"{__name__}.miles_reject_odd",
    )
    results = []
    for cls in (DefaultDataBuffer, RescueDataBuffer):
        unused: list = []
        ctor = DataBufferConstructorInput(args=args, unused_handler_fn=unused.append)
        buffer = cls(ctor, env=arm_env) if cls is RescueDataBuffer else cls(ctor)
        groups, metrics = run(_drive(buffer, stream(), gets=12, version=10))
        results.append(([group_id(g) for g in groups], [group_id(g) for g in unused], metrics))
    (m_out, m_unused, m_metrics), (r_out, r_unused, r_metrics) = results
    assert r_out == m_out and r_unused == m_unused
    assert {k: v for k, v in r_metrics.items() if not k.startswith(P)} == m_metrics
    assert (
        r_metrics[f"{P}groups/dropped_stale"]
        == m_metrics["rollout/fully_async/stale_groups_filtered"]
        > 0
    )
    assert r_metrics[f"{P}groups/filtered"] == m_metrics["rollout/dynamic_filter/drop_odd"] > 0
    assert (
        r_metrics[f"{P}groups/aborted"]
        == m_metrics["rollout/fully_async/aborted_groups_filtered"]
        > 0
    )


def test_miles_sample_helpers_agree_with_ours():
    require_miles()
    from miles.rollout import fully_async_data_buffer as mb
    from miles.utils.types import Sample

    rng = np.random.default_rng(2)
    for _ in range(50):
        group = miles_group(1, version=3, nested=bool(rng.random() < 0.5))
        for s in mb.iter_samples(group):
            s.weight_versions = [str(v) for v in rng.integers(0, 20, int(rng.integers(0, 3)))]
            if rng.random() < 0.2:
                s.weight_versions.append("default")
            if rng.random() < 0.1:
                s.status = Sample.Status.ABORTED
        assert group_oldest_weight_version(group) == mb.group_oldest_weight_version(group)
        # Miles' aborted check, and ours for samples without agent metadata
        assert (no_result(group_records(group)) == "aborted") == any(
            s.status == Sample.Status.ABORTED for s in mb.iter_samples(group)
        )
        for s in mb.iter_samples(group):
            assert rollout_record(s) == rollout_record(Sample.from_dict(s.to_dict()))
            assert rollout_record(s) == rollout_record(s.to_dict())


@pytest.mark.parametrize("setting, paid", [(None, 1 / 3), ("all", 1 / 3), ("survivors", 0.5)])
def test_rescue_baseline_sets_the_population_of_the_baseline_paid_to_masked_rollouts(setting, paid):
    """Rewards 0, 1, 0 per group; the filter masks the first (reward 0) sample: it is paid
    mean(0, 1, 0) under all, mean(1, 0) under survivors."""

    async def go():
        env = {} if setting is None else {"RESCUE_BASELINE": setting}
        buffer, _ = make_buffer(env=env)
        await put_all(buffer, [fake_group(g) for g in range(2)])
        for _ in range(2):
            (await buffer.get(current_version=0)).group[0].remove_sample = True
        return buffer, buffer.get_metrics()

    buffer, m = run(go())
    assert buffer.census.population == (setting or "all")
    assert m[f"{P}b_paid/masked"] == pytest.approx(paid)
    assert m[f"{P}b_paid/masked_rollouts"] == 2


def test_an_invalid_rescue_baseline_fails_when_the_buffer_is_built():
    with pytest.raises(ValueError, match="RESCUE_BASELINE='half'; allowed: all, survivors"):
        make_buffer(env={"RESCUE_BASELINE": "half"})


def test_miles_fully_async_rollout_never_trains_a_trial_without_result(monkeypatch):
    """Inside Miles' FullyAsyncRolloutFn with the retry handler: Miles' own buffer trains the
    timed-out trial as a failure; rescue's, in the drop arm, sends its group back to the
    data source and trains only groups with a result."""
    require_miles()
    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.utils.types import Sample as MilesSample

    monkeypatch.setenv("RESCUE_ARM", "drop")

    class DataSource:
        def __init__(self):
            self.next_id, self.recycled = 0, []

        def get_samples(self, n):
            self.next_id += 1
            trouble = TIMEOUT if self.next_id == 1 else None
            return [agentic_group(self.next_id, version=10, trouble=trouble, cls=MilesSample)]

        def add_samples(self, groups):
            self.recycled.extend(groups)

    async def generate(state, group, sampling_params, evaluation=False, sample_done_callback=None):
        await asyncio.sleep(0)
        return group

    monkeypatch.setattr(
        fully_async, "GenerateState", lambda args: SimpleNamespace(sampling_params={})
    )
    monkeypatch.setattr(fully_async, "generate_and_rm_group", generate)

    def train_once(buffer_path):
        args = miles_args(
            rollout_batch_size=3,
            max_weight_staleness=2,
            async_unused_samples_handler="retry",
            custom_async_data_buffer_path=buffer_path,
        )
        data_source = DataSource()

        async def go():
            fn = fully_async.FullyAsyncRolloutFn(
                RolloutFnConstructorInput(args=args, data_source=data_source)
            )
            return await fn(RolloutFnTrainInput(rollout_id=0, weight_version=10))

        out = run(go())
        trained = [s for g in out.samples for s in g]
        return trained, data_source.recycled, out.metrics

    trained, recycled, _ = train_once(None)  # Miles' DefaultDataBuffer
    assert any(s.metadata.get("outcome") == "infra_no_result" for s in trained)
    trained, recycled, m = train_once("rescue.miles.buffer.RescueDataBuffer")
    assert not any(s.metadata.get("outcome") == "infra_no_result" for s in trained)
    assert [g[0].group_index for g in recycled] == [1]
    assert all(s.status == MilesSample.Status.ABORTED for s in recycled[0])  # reset_for_retry
    assert m[f"{P}aborted/reason/trial_timeout"] == 1
