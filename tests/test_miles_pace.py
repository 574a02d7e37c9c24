"""The pace arm on Miles: refusals, the asyncio queue, the buffer under pace, and Miles' own
``FullyAsyncRolloutFn`` paced with slow groups (``require_miles``).

Time is virtual (``virtual_clock``): a scripted ``asyncio.sleep(d)`` takes exactly ``d`` on
the loop's clock, so a measured wait is compared with the script within
``virtual_clock.TOLERANCE_S`` (1e-6 s), never with the machine's wall clock.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest
from buffer_store import load_function
from fake_sample import Sample
from miles_env import require_miles
from test_miles_buffer import N, fake_group, miles_args, miles_group
from virtual_clock import TOLERANCE_S, run_virtual

from rescue.miles.buffer import PACE_ROLLOUT_FUNCTION, QUEUE_SIZE_KEY, RescueDataBuffer
from rescue.miles.pace import (
    ABANDONED_KEY,
    BUFFER_PATH,
    WAIT_GROUPS_KEY,
    WAIT_S_KEY,
    PaceQueue,
    check_pace_run,
)
from rescue.pace import PaceSettings
from rescue.samples import group_id, group_oldest_weight_version

P = "rollout/census/"
PACE_ENV = {"RESCUE_ARM": "pace"}


def pace_args(**overrides):
    """The arguments of a valid pace run (K = 1, batch 4)."""
    args = dict(
        max_weight_staleness=1,
        rollout_batch_size=4,
        custom_async_data_buffer_path=BUFFER_PATH,
        rollout_function_path=PACE_ROLLOUT_FUNCTION,
        colocate=False,
        partial_rollout=False,
        pause_generation_mode="retract",
        dynamic_sampling_filter_path=None,
        reward_key=None,
    )
    args.update(overrides)
    return SimpleNamespace(**args)


# ── refusals ─────────────────────────────────────────────────────────────────


def test_a_valid_pace_run_gives_its_settings():
    assert check_pace_run(pace_args(), PACE_ENV) == PaceSettings(1, 4, 8)
    assert check_pace_run(pace_args(), {**PACE_ENV, "RESCUE_PACE_WINDOW": "6"}).window == 6


@pytest.mark.parametrize(
    "overrides, env, names",
    [
        ({"custom_async_data_buffer_path": None}, PACE_ENV, "--custom-async-data-buffer-path"),
        (
            {"custom_async_data_buffer_path": "miles.rollout.fully_async_data_buffer.X"},
            PACE_ENV,
            "--custom-async-data-buffer-path",
        ),
        ({}, {}, "RESCUE_ARM=drop"),
        ({}, {"RESCUE_ARM": "protect", "RESCUE_A": "0.5"}, "RESCUE_ARM=protect"),
        ({}, {"RESCUE_ARM": "never-drop"}, "RESCUE_ARM=never-drop"),
        ({"max_weight_staleness": None}, PACE_ENV, "--max-weight-staleness"),
        ({}, {**PACE_ENV, "RESCUE_PACE_WINDOW": "9"}, "RESCUE_PACE_WINDOW"),
        ({}, {**PACE_ENV, "RESCUE_PACE_WINDOW": "3"}, "RESCUE_PACE_WINDOW"),
        ({"colocate": True}, PACE_ENV, "--colocate"),
        ({"partial_rollout": True}, PACE_ENV, "--partial-rollout"),
        ({"pause_generation_mode": "abort"}, PACE_ENV, "--pause-generation-mode abort"),
    ],
)
def test_combinations_that_would_drop_or_never_wait_are_refused_in_one_line(overrides, env, names):
    with pytest.raises(ValueError, match=names) as e:
        check_pace_run(pace_args(**overrides), env)
    assert "\n" not in str(e.value)


def test_the_buffer_under_pace_needs_k():
    ctor = SimpleNamespace(args=pace_args(max_weight_staleness=None), unused_handler_fn=print)
    with pytest.raises(ValueError, match=r"^RESCUE_ARM=pace needs --max-weight-staleness K"):
        RescueDataBuffer(ctor, env=PACE_ENV, load_function=load_function)


def test_the_module_imports_without_miles_and_the_rollout_function_says_it_needs_it(tmp_path):
    code = (
        "import importlib.util\n"
        "assert importlib.util.find_spec('miles') is None, 'Miles is importable'\n"
        "import rescue.miles.pace as pace\n"
        "try:\n"
        "    pace.PaceRolloutFn\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "rescue.miles.pace.PaceRolloutFn needs Miles importable" in out.stdout


# ── the queue on a virtual clock ────────────────────────────────────────────


def test_the_virtual_clock_measures_scripted_sleeps_and_stops_a_stuck_run():
    async def sleeps():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(asyncio.sleep(2.5), asyncio.sleep(1.0))
        return loop.time() - t0

    assert abs(run_virtual(sleeps()) - 2.5) <= TOLERANCE_S
    with pytest.raises(RuntimeError, match="no timer is set"):
        run_virtual(asyncio.Event().wait())


def entry(group):
    return SimpleNamespace(prompt_group=group, group=group)


def test_admission_waits_for_the_next_step_and_get_times_the_wait_for_a_straggler():
    """K = 1, batch 2, window 4. Step 0 admits four groups; the fifth waits for step 1.
    Step 0 takes two fast groups. Step 1 owes both places to the groups of step 0: it takes
    the fast one, then blocks on the slow one (3 s) while a group of step 1 is ready."""

    async def go():
        loop = asyncio.get_running_loop()
        q = PaceQueue(PaceSettings(max_staleness=1, batch=2))
        groups = [fake_group(g, version=0) for g in range(6)]
        q.begin_step()
        for g in groups[:4]:
            await q.admit(g)
        fifth = asyncio.create_task(q.admit(groups[4]))
        await asyncio.sleep(0)
        assert not fifth.done()

        async def finish(g, delay):
            await asyncio.sleep(delay)
            await q.put(entry(g))

        slow = asyncio.create_task(finish(groups[0], 3.0))
        for g in groups[1:4]:
            await q.put(entry(g))
        taken = [group_id((await q.get(current_version=0)).group) for _ in range(2)]
        m0 = q.get_metrics()
        q.begin_step()
        await fifth
        await q.put(entry(groups[4]))  # ready at once, due at step 2
        t0 = loop.time()
        taken += [group_id((await q.get(current_version=1)).group) for _ in range(2)]
        await slow
        return taken, m0, q.get_metrics(), loop.time() - t0

    taken, m0, m1, elapsed = run_virtual(go())
    assert taken == [1, 2, 3, 0]
    assert m0[WAIT_S_KEY] == 0.0 and m0[WAIT_GROUPS_KEY] == 0
    assert abs(m1[WAIT_S_KEY] - 3.0) <= TOLERANCE_S and m1[WAIT_GROUPS_KEY] == 1
    assert abs(elapsed - 3.0) <= TOLERANCE_S
    assert m1[QUEUE_SIZE_KEY] == 1  # group 4 waits for step 2
    assert m1["rollout/fully_async/max_staleness"] == 1


@pytest.mark.parametrize("submitted", [True, False], ids=["held-by-window", "nothing-held"])
def test_a_wait_the_window_causes_is_counted_even_with_nothing_ready(submitted):
    """K = 0, window = batch = 2: the step takes the fast group, then waits 3 s for the slow
    one with nothing else ready. While a submitted generation waits for admission (the
    window holds it back; Miles' own rollout would run it), the wait is pace's cost; with
    nothing held back it is every arm's wait."""

    async def go():
        q = PaceQueue(PaceSettings(max_staleness=0, batch=2))
        q.begin_step()
        fast, slow, third = (fake_group(g, version=0) for g in range(3))
        for g in (fast, slow):
            await q.admit(g)
        held = asyncio.create_task(q.admit(third)) if submitted else None
        await q.put(entry(fast))

        async def finish_slow():
            await asyncio.sleep(3.0)
            await q.put(entry(slow))

        finisher = asyncio.create_task(finish_slow())
        taken = [group_id((await q.get(current_version=0)).group) for _ in range(2)]
        await finisher
        m = q.get_metrics()
        if held is not None:
            held.cancel()
        return taken, m

    taken, m = run_virtual(go())
    assert taken == [0, 1]
    expected = 3.0 if submitted else 0.0
    assert abs(m[WAIT_S_KEY] - expected) <= TOLERANCE_S
    assert abs(m[f"{WAIT_S_KEY}/window"] - expected) <= TOLERANCE_S
    assert m[f"{WAIT_S_KEY}/straggler"] == 0.0
    assert m[WAIT_GROUPS_KEY] == (1 if submitted else 0)


def test_a_straggler_past_its_deadline_is_abandoned_and_the_schedule_goes_on(caplog):
    """K = 0, batch 1, deadline 10 s: a generation that never returns is cancelled at 10 s,
    counted, its place freed; the next group is admitted and taken."""

    async def go():
        loop = asyncio.get_running_loop()
        q = PaceQueue(PaceSettings(max_staleness=0, batch=1, straggler_s=10.0))
        abandoned: list = []
        q.on_abandon = abandoned.append
        q.begin_step()
        stuck, nxt = fake_group(1, version=0), fake_group(2, version=0)

        async def generate(g, delay):
            await q.admit(g)
            await asyncio.sleep(delay)
            await q.put(entry(g))

        hung = asyncio.create_task(generate(stuck, 1e9))
        await asyncio.sleep(0)
        later = asyncio.create_task(generate(nxt, 1.0))  # waits for the window
        t0 = loop.time()
        got = await q.get(current_version=0)
        elapsed = loop.time() - t0
        await asyncio.gather(hung, return_exceptions=True)
        return q, abandoned, stuck, got, elapsed, hung, later

    with caplog.at_level("WARNING", logger="rescue.miles.pace"):
        q, abandoned, stuck, got, elapsed, hung, _ = run_virtual(go())
    assert abandoned == [stuck] and q.abandoned(stuck) and hung.cancelled()
    assert group_id(got.group) == 2 and abs(elapsed - 11.0) <= TOLERANCE_S
    m = q.get_metrics()
    assert m[ABANDONED_KEY] == 1.0
    assert abs(m[f"{WAIT_S_KEY}/window"] - 11.0) <= TOLERANCE_S  # the window held `later`
    assert "pace: step 0 waits for the schedule: group(s) in flight 1 (0 s of 10)" in caplog.text
    assert "pace: abandoning group 1: in flight 10 s" in caplog.text


def test_the_buffer_counts_an_abandoned_group_once_and_recycles_it_when_it_returns():
    async def go():
        buffer, unused = pace_buffer(rollout_batch_size=1, max_weight_staleness=0)
        buffer.pace.schedule.settings = PaceSettings(0, 1, straggler_s=5.0)
        buffer.pace.begin_step()
        stuck, nxt = fake_group(1, version=0), fake_group(2, version=0)

        async def generate(g):  # as Miles' group task: admitted, then generating forever
            await buffer.pace.admit(g)
            await asyncio.sleep(1e9)

        hung = asyncio.create_task(generate(stuck))
        getter = asyncio.create_task(buffer.get(current_version=0))
        await asyncio.sleep(6.0)  # abandoned at 5 s: its task is cancelled
        assert hung.cancelled()
        await buffer.pace.admit(nxt)
        await buffer.put(entry(nxt))
        got = await getter
        await buffer.put(entry(stuck))  # its cancelled generation comes back
        return unused, stuck, got, buffer.get_metrics()

    unused, stuck, got, m = run_virtual(go())
    assert group_id(got.group) == 2 and unused == [stuck]
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}aborted/reason/pace_straggler"] == 1
    assert m[f"{P}groups/entered"] == 2 and m[f"{P}groups/trained_fresh"] == 1
    assert m[ABANDONED_KEY] == 1.0


def test_the_straggler_deadline_setting():
    assert PaceSettings(1, 4).straggler_s == 7200.0
    env = {"RESCUE_PACE_STRAGGLER_S": "900"}
    assert PaceSettings.from_env(env, max_staleness=1, batch=4).straggler_s == 900.0
    assert (
        PaceSettings.from_env(
            {"RESCUE_PACE_STRAGGLER_S": "0"}, max_staleness=1, batch=4
        ).straggler_s
        == 0
    )
    with pytest.raises(ValueError, match="RESCUE_PACE_STRAGGLER_S='soon'"):
        PaceSettings.from_env({"RESCUE_PACE_STRAGGLER_S": "soon"}, max_staleness=1, batch=4)


def test_a_cancelled_get_loses_no_group():
    async def go():
        q = PaceQueue(PaceSettings(max_staleness=0, batch=1))
        q.begin_step()
        g = fake_group(1, version=0)
        await q.admit(g)
        waiting = asyncio.create_task(q.get(current_version=0))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await q.put(entry(g))
        return group_id((await q.get(current_version=0)).group)

    assert run_virtual(go()) == 1


def test_a_group_that_was_never_admitted_is_an_error():
    async def go():
        q = PaceQueue(PaceSettings(max_staleness=0, batch=1))
        await q.put(entry(fake_group(1)))

    with pytest.raises(RuntimeError, match=f"must be {PACE_ROLLOUT_FUNCTION}"):
        run_virtual(go())


# ── the buffer under pace ───────────────────────────────────────────────────


def pace_buffer(**overrides):
    unused: list = []
    ctor = SimpleNamespace(args=pace_args(**overrides), unused_handler_fn=unused.append)
    buffer = RescueDataBuffer(ctor, env=PACE_ENV, load_function=load_function)
    assert isinstance(buffer.pace, PaceQueue)
    return buffer, unused


def test_the_buffer_builds_the_schedule_from_k_the_batch_and_the_window_setting():
    ctor = SimpleNamespace(args=pace_args(max_weight_staleness=2), unused_handler_fn=print)
    env = {**PACE_ENV, "RESCUE_PACE_WINDOW": "9"}
    buffer = RescueDataBuffer(ctor, env=env, load_function=load_function)
    assert buffer.pace.schedule.settings == PaceSettings(max_staleness=2, batch=4, window=9)
    buffer = RescueDataBuffer(ctor, env=PACE_ENV, load_function=load_function)
    assert buffer.pace.schedule.settings.window == 12


def reject_group_2(args, group):
    return group_id(group) != 2


def test_rejected_groups_free_their_place_and_are_counted():
    async def go():
        buffer, unused = pace_buffer(
            rollout_batch_size=2,
            max_weight_staleness=0,
            dynamic_sampling_filter_path=f"{__name__}.reject_group_2",
        )
        buffer.pace.begin_step()
        aborted = fake_group(1, version=0, status=Sample.Status.ABORTED)
        filtered, kept = fake_group(2, version=0), fake_group(3, version=0)
        for g in (aborted, filtered):
            await buffer.pace.admit(g)
        assert not buffer.pace.schedule.can_admit()  # window = batch = 2
        for g in (aborted, filtered):
            await buffer.put(entry(g))
        assert buffer.pace.schedule.open == 0  # both places are free again
        await buffer.pace.admit(kept)
        await buffer.put(entry(kept))
        got = await buffer.get(current_version=0)
        return unused, aborted, got, buffer.get_metrics()

    unused, aborted, got, m = run_virtual(go())
    assert unused == [aborted] and group_id(got.group) == 3
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}groups/filtered"] == 1
    assert m[f"{P}groups/trained_fresh"] == 1 and m[f"{P}groups/buffered"] == 0


def test_a_group_arriving_stale_under_pace_is_trained_counted_and_warned(caplog):
    async def go():
        buffer, unused = pace_buffer(rollout_batch_size=1, max_weight_staleness=1)
        buffer.pace.begin_step()
        group = fake_group(7, version=0)
        await buffer.pace.admit(group)
        await buffer.put(entry(group))
        got = await buffer.get(current_version=5)  # the version jumped 5 in one step
        return unused, got, buffer.get_metrics()

    with caplog.at_level("WARNING", logger="rescue.miles.buffer"):
        unused, got, m = run_virtual(go())
    assert unused == [] and group_id(got.group) == 7
    assert m[f"{P}groups/trained_stale"] == 1 and m[f"{P}groups/dropped_stale"] == 0
    assert m[f"{P}staleness_max"] == 5
    assert "arrived stale (staleness=5 > K=1)" in caplog.text


# ── inside real Miles (MILES_SRC) ────────────────────────────────────────────

TRAIN_S = 1.0  # scripted training time of a step, on the virtual clock
SLOW = {0: 5.5, 6: 4.0}  # step -> delay of the first group handed out once it starts
STEPS = 14
FIRST_VERSION = 10


def drive_miles(monkeypatch, rollout_fn, k, env, slow=SLOW):
    """``STEPS`` train calls of a Miles rollout function with ``RescueDataBuffer``.

    A scripted ``generate_and_rm_group`` stamps the engines' version on every sample when
    the group starts and finishes after its delay: 0 for most groups (they take no time on
    the virtual clock), ``SLOW[s]`` for the first group handed out after step ``s`` starts.
    Between train calls the engines move to the next version and the trainer trains for
    ``TRAIN_S``. Returns per step ``(batch, metrics, slow group ids)`` and what was recycled.
    """
    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput

    for key in ("RESCUE_ARM", "RESCUE_A", "RESCUE_PACE_WINDOW", "RESCUE_PACE_STRAGGLER_S"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    engines = {"version": FIRST_VERSION}
    delays: dict[int, float] = {}

    class DataSource:
        def __init__(self):
            self.next_id, self.recycled, self.slow_next = 0, [], None

        def get_samples(self, n):
            assert n == 1
            self.next_id += 1
            if self.slow_next is not None:
                delays[self.next_id], self.slow_next = self.slow_next, None
            return [miles_group(self.next_id, version=None)]

        def add_samples(self, groups):
            self.recycled.extend(groups)

    async def generate(state, group, sampling_params, evaluation=False, sample_done_callback=None):
        for s in group:
            s.weight_versions = [str(engines["version"])]
        try:
            await asyncio.sleep(delays.get(group[0].group_index, 0.0))
        finally:
            # as Miles' generate_and_rm_group: one callback per sample, on success,
            # exception and cancellation alike
            for _ in group:
                if sample_done_callback is not None:
                    sample_done_callback()
        return group

    monkeypatch.setattr(
        fully_async, "GenerateState", lambda args: SimpleNamespace(sampling_params={})
    )
    monkeypatch.setattr(fully_async, "generate_and_rm_group", generate)
    pace = rollout_fn == PACE_ROLLOUT_FUNCTION
    args = miles_args(
        rollout_batch_size=4,
        max_weight_staleness=k,
        async_unused_samples_handler="retry",  # a dropped group would be recycled
        # Miles' FIFO holds (K + 1) batches, as many groups as pace's window (pace has no FIFO)
        async_data_buffer_capacity_factor=float(k + 1),
        custom_async_data_buffer_path=BUFFER_PATH,
        rollout_function_path=rollout_fn if pace else None,
        colocate=False,
        partial_rollout=False,
        pause_generation_mode="retract",
    )
    data_source = DataSource()

    async def go():
        from miles.rollout.inference_rollout.compatibility import load_rollout_function

        path = rollout_fn if pace else "miles.rollout.fully_async_rollout.FullyAsyncRolloutFn"
        fn = load_rollout_function(RolloutFnConstructorInput(args, data_source), path)
        steps = []
        for step in range(STEPS):
            engines["version"] = FIRST_VERSION + step
            if step in slow:
                data_source.slow_next = slow[step]
            out = await fn(
                RolloutFnTrainInput(rollout_id=step, weight_version=FIRST_VERSION + step)
            )
            batch_ids = [group_id(g) for g in out.samples]
            assert len(batch_ids) == 4 and all(len(g) == N for g in out.samples)
            staleness = [FIRST_VERSION + step - group_oldest_weight_version(g) for g in out.samples]
            steps.append((batch_ids, staleness, out.metrics))
            await asyncio.sleep(TRAIN_S)
        return fn, steps

    fn, steps = run_virtual(go())
    return fn, steps, delays, data_source.recycled


@pytest.mark.parametrize("k", [1, 2])
def test_miles_pace_trains_nothing_staler_than_k_drops_nothing_and_times_the_waits(monkeypatch, k):
    """Each slow group starts at a step's start (virtual time stands still inside a step
    except while the step waits) and is owed a place K steps later, after K trainings of
    TRAIN_S: that step waits exactly delay - K * TRAIN_S for it, then trains it."""
    require_miles()
    import miles.rollout.fully_async_rollout as fully_async

    fn, steps, delays, recycled = drive_miles(monkeypatch, PACE_ROLLOUT_FUNCTION, k, PACE_ENV)
    assert type(fn).__name__ == "PaceRolloutFn"
    assert isinstance(fn, fully_async.FullyAsyncRolloutFn)
    assert recycled == []  # nothing reached the unused handler
    assert sorted(delays.values()) == sorted(SLOW.values())
    waits = []
    for batch, staleness, m in steps:
        assert max(staleness) <= k and m[f"{P}staleness_max"] <= k
        assert m[f"{P}groups/trained_stale"] == 0 and m[f"{P}groups/dropped_stale"] == 0
        assert m["rollout/fully_async/stale_groups_filtered"] == 0
        assert m["rollout/fully_async/max_staleness"] == max(staleness)
        slow_here = [g for g in batch if g in delays]
        if m[WAIT_S_KEY] > 0:
            # the step blocked on the slow group and trained it, at the bound exactly
            [g] = slow_here
            assert abs(m[WAIT_S_KEY] - (delays[g] - k * TRAIN_S)) <= TOLERANCE_S
            assert m[WAIT_GROUPS_KEY] == 1
            assert staleness[batch.index(g)] == k
            waits.append(g)
        else:
            assert m[WAIT_GROUPS_KEY] == 0
    assert sorted(waits) == sorted(delays)  # every slow group was waited for once
    totals = fn._output.census.totals()
    assert totals["dropped_stale"] == 0 and totals["trained_stale"] == 0
    assert totals["trained_fresh"] == STEPS * 4
    assert totals["entered"] == totals["trained_fresh"] + totals["buffered"]


def test_miles_without_pace_trains_the_same_slow_groups_staler_than_k(monkeypatch):
    """The control: Miles' own rollout function on the same script (never-drop, so every
    group is trained) trains the slow groups when they finish, far past K."""
    require_miles()
    k = 1
    _, steps, delays, recycled = drive_miles(monkeypatch, None, k, {"RESCUE_ARM": "never-drop"})
    assert recycled == []
    late = {
        g: s
        for batch, staleness, _ in steps
        for g, s in zip(batch, staleness, strict=True)
        if g in delays
    }
    assert set(late) == set(delays)
    assert all(s > k for s in late.values())
    stale = sum(m[f"{P}groups/trained_stale"] for _, _, m in steps)
    assert stale == sum(s > k for _, staleness, _ in steps for s in staleness) >= len(delays)


@pytest.mark.parametrize(
    "k, env",
    [(0, PACE_ENV), (1, {**PACE_ENV, "RESCUE_PACE_WINDOW": "4"})],
    ids=["k0", "window-of-b"],
)
def test_miles_pace_counts_the_waits_its_window_causes(monkeypatch, k, env):
    """With the window at the batch (K = 0, or PACE_WINDOW = B) the step takes its fast
    groups and then waits for the slow one with nothing else ready, while the groups Miles
    submitted wait for admission: every second of it is pace's cost, counted under
    ``pace_wait_s/window`` (the old count, which needed another group ready, said 0)."""
    require_miles()
    _, steps, delays, recycled = drive_miles(monkeypatch, PACE_ROLLOUT_FUNCTION, k, env)
    assert recycled == []
    for batch, staleness, m in steps:
        assert max(staleness) <= k
        slow_here = [g for g in batch if g in delays]
        expected = delays[slow_here[0]] if slow_here else 0.0
        assert abs(m[WAIT_S_KEY] - expected) <= TOLERANCE_S, (batch, m[WAIT_S_KEY])
        assert abs(m[f"{WAIT_S_KEY}/window"] - expected) <= TOLERANCE_S
        assert m[f"{WAIT_S_KEY}/straggler"] == 0.0
        assert m[WAIT_GROUPS_KEY] == (1 if slow_here else 0)
    assert sum(m[WAIT_S_KEY] for _, _, m in steps) == pytest.approx(sum(SLOW.values()))


def test_miles_pace_abandons_a_generation_that_never_returns_and_finishes_the_run(
    monkeypatch, caplog
):
    """K = 1: the group started at step 0 never returns. Step 1 owes it a place and waits
    (a straggler: other groups are ready) until the deadline, 20 s after its admission; then
    the group is abandoned as a no-result, its generation cancelled, and every step runs."""
    require_miles()
    env = {**PACE_ENV, "RESCUE_PACE_STRAGGLER_S": "20"}
    with caplog.at_level("WARNING", logger="rescue.miles.pace"):
        fn, steps, delays, recycled = drive_miles(
            monkeypatch, PACE_ROLLOUT_FUNCTION, 1, env, slow={0: 1e9}
        )
    assert len(steps) == STEPS
    (hung,) = delays
    assert [g[0].group_index for g in recycled] == [hung]  # back to the unused handler
    m1 = steps[1][2]
    assert abs(m1[WAIT_S_KEY] - (20.0 - TRAIN_S)) <= TOLERANCE_S
    assert abs(m1[f"{WAIT_S_KEY}/straggler"] - (20.0 - TRAIN_S)) <= TOLERANCE_S
    assert m1[ABANDONED_KEY] == 1.0 and m1[f"{P}aborted/reason/pace_straggler"] == 1
    assert all(hung not in batch for batch, _, _ in steps)
    assert f"pace: abandoning group {hung}: in flight 20 s" in caplog.text
    assert "pace: step 1 waits for the schedule" in caplog.text
    totals = fn._output.census.totals()
    assert totals["aborted"] == 1 and totals["trained_fresh"] == STEPS * 4
