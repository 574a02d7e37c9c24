"""The slime drain beyond the gate: what the worker requeued or lost, the pace arm, the
progress log and the version fallback (framework-free; slime's own worker is in
tests/test_slime_worker.py)."""

from __future__ import annotations

import logging
from collections import deque
from types import SimpleNamespace

import pytest
from fake_sample import Sample

from rescue.gate import Gate
from rescue.pace import PaceSettings
from rescue.samples import group_records
from rescue.slime.drain import Drain
from rescue.slime.pace import SlimePace
from rescue.slime.worker import WorkerEvent, WorkerEvents
from rescue.watchdog import Watchdog, WatchdogSettings, WatchdogStop

P = "rollout/census/"
ARGS = SimpleNamespace(reward_key=None)


def make_group(g, version, n=2, status=Sample.Status.COMPLETED):
    return [
        Sample(
            group_index=g,
            index=g * n + k,
            status=status,
            reward=float(k % 2),
            weight_versions=[str(version)],
        )
        for k in range(n)
    ]


class ScriptedWorker:
    """``get_completed_groups`` / ``queue_size`` of slime's worker; each poll first runs the
    next step of ``script`` (a callable that may queue groups or report events)."""

    def __init__(self, script=()):
        self.queue = deque()
        self.script = deque(script)
        self.polls = 0

    def get_completed_groups(self, limit=None):
        self.polls += 1
        if self.script:
            self.script.popleft()(self)
        out = []
        while self.queue and (limit is None or len(out) < limit):
            out.append((0, self.queue.popleft()))
        return out

    def queue_size(self):
        return len(self.queue)


# ── requeued and lost groups ────────────────────────────────────────────────────────


def test_requeued_and_lost_groups_are_counted_as_reported():
    events = WorkerEvents()
    aborted = make_group(7, 0, status=Sample.Status.ABORTED)

    def report(worker):
        events.put(WorkerEvent("requeued", 7, group_records(aborted)))
        events.put(WorkerEvent("lost", 8, reason="ClientResponseError"))
        worker.queue.extend([make_group(0, 1), make_group(1, 1)])

    d = Drain(ScriptedWorker([report]), Gate(arm="never-drop"), events=events, poll_s=0.0)
    out, m = d.collect(ARGS, target=2)
    assert len(out) == 2
    assert m[f"{P}groups/entered"] == 4
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}aborted/reason/aborted"] == 1
    assert m[f"{P}groups/requeued"] == 1
    assert m[f"{P}groups/lost"] == 1 and m[f"{P}lost/reason/ClientResponseError"] == 1
    assert m[f"{P}groups/trained_fresh"] == 2 and m[f"{P}groups/buffered"] == 0


def test_events_reported_after_the_batch_filled_count_in_that_step():
    events = WorkerEvents()

    def fill(worker):
        worker.queue.append(make_group(0, 1))
        events.put(WorkerEvent("lost", 3, reason="TimeoutError"))  # while the batch fills

    d = Drain(ScriptedWorker([fill]), Gate(arm="never-drop"), events=events, poll_s=0.0)
    _, m = d.collect(ARGS, target=1)
    assert m[f"{P}groups/lost"] == 1


def test_an_accounting_error_of_the_worker_stops_the_drain():
    events = WorkerEvents()
    events.error = "slime's worker finished group 3 as #0, but #0 was group 2"
    d = Drain(ScriptedWorker(), Gate(arm="never-drop"), events=events, poll_s=0.0)
    with pytest.raises(RuntimeError, match="finished group 3 as #0"):
        d.collect(ARGS, target=1)


# ── progress and the watchdog ───────────────────────────────────────────────────────


def test_a_drain_that_keeps_discarding_groups_says_so(caplog):
    """Every group without a result: before, the drain looped without a word."""
    now = [0.0]

    def broken(worker):
        g = make_group(worker.polls, 0)
        g[0].metadata = {"instance_id": "t"}  # an agent sample without exit status
        worker.queue.append(g)
        now[0] += 11.0

    def fresh(worker):
        worker.queue.append(make_group(99, 0))

    d = Drain(
        ScriptedWorker([broken] * 4 + [lambda w: None, fresh]),
        Gate(arm="never-drop"),
        poll_s=0.0,
        clock=lambda: now[0],
        log_every_s=30.0,
    )
    with caplog.at_level(logging.INFO, logger="rescue.slime.drain"):
        out, m = d.collect(ARGS, target=1)
    lines = [r.getMessage() for r in caplog.records if "rescue: batch" in r.getMessage()]
    assert lines == [
        "rescue: batch 0/1 after 44 s: popped 4 (without a result 4, dropped stale 0), "
        "requeued 0, lost 0, worker queue 0"
    ]
    assert m[f"{P}groups/aborted"] == 4 and m[f"{P}aborted/reason/no_exit_status"] == 4
    assert len(out) == 1


def no_result_group(g):
    group = make_group(g, 0)
    group[1].metadata = {"abort_reason": "wall_clock_timeout", "instance_id": "x"}
    group[1].status = Sample.Status.FAILED  # a generator's external API error
    return group


def test_the_watchdog_stops_a_drain_whose_groups_have_no_result():
    flushed = []
    dog = Watchdog(WatchdogSettings(window=4, max_no_result=0.5, idle_s=0), flush=flushed.append)
    events = WorkerEvents()

    def feed(worker):
        g = worker.polls
        worker.queue.append(make_group(g, 0) if g == 1 else no_result_group(g))
        if g == 2:
            events.put(WorkerEvent("lost", 50, reason="ClientResponseError"))

    d = Drain(
        ScriptedWorker([feed] * 10), Gate(arm="never-drop"), poll_s=0.0, watchdog=dog, events=events
    )
    with pytest.raises(WatchdogStop) as e:
        d.collect(ARGS, target=8)
    line = str(e.value)
    assert line.startswith("rescue watchdog: stopping the run: 3 of the last 4 groups")
    assert "dominant reason failed (2 of 4 groups)" in line
    assert "failed: wall_clock_timeout" in line and "lost:ClientResponseError" in line
    assert flushed == [line.removesuffix("; census flushed")]
    assert d.census.totals()["lost"] == 1


def test_the_watchdog_stops_a_drain_that_waits_too_long():
    now = [0.0]

    def tick(worker):
        now[0] += 100.0

    dog = Watchdog(WatchdogSettings(window=0, idle_s=250), clock=lambda: now[0])
    d = Drain(
        ScriptedWorker([tick] * 5),
        Gate(arm="never-drop"),
        poll_s=0.0,
        watchdog=dog,
        clock=lambda: now[0],
    )
    with pytest.raises(WatchdogStop, match="no group finished for 300 s"):
        d.collect(ARGS, target=1)


# ── versions ─────────────────────────────────────────────────────────────────────────


def test_the_version_fallback_is_logged_every_step():
    groups = deque([make_group(0, 3), make_group(1, 4)])

    def one(worker):
        worker.queue.append(groups.popleft())

    engine = [None]
    d = Drain(
        ScriptedWorker([one, one]),
        Gate(arm="never-drop"),
        current_version=lambda: engine[0],
        poll_s=0.0,
    )
    _, m = d.collect(ARGS, target=1)
    assert m[f"{P}version_fallback"] == 1.0 and m[f"{P}current_version"] == 3.0
    engine[0] = 6
    _, m = d.collect(ARGS, target=1)
    assert m[f"{P}version_fallback"] == 0.0 and m[f"{P}current_version"] == 6.0


# ── the pace arm ─────────────────────────────────────────────────────────────────────


class Source:
    """slime's data source: prompt groups in order, requeued ones first."""

    def __init__(self):
        self.next = 0
        self.buffer = []

    def get_samples(self, n):
        if self.buffer:
            return [self.buffer.pop(0)]
        g = make_group(self.next, 0, status=Sample.Status.PENDING)
        self.next += 1
        return [g]

    def add_samples(self, groups):
        self.buffer.extend(groups)

    def get_buffer_length(self):
        return len(self.buffer)


def test_pace_admits_within_the_window_and_requeued_groups_keep_their_place():
    pace = SlimePace(PaceSettings(max_staleness=1, batch=2))  # W = 4
    source = Source()
    pace.begin_step()
    handed = pace.next_groups(source, 10)
    assert [g[0].group_index for g in handed] == [0, 1, 2, 3]
    assert pace.next_groups(source, 1) == []  # the window is full
    source.add_samples([handed[1]])  # slime requeued group 1 (aborted at an update)
    again = pace.next_groups(source, 1)
    assert again == [handed[1]]  # still open: handed out at once, first deadline kept
    assert pace.schedule.deadline(1) == 1
    pace.reject(2)  # lost: its place frees
    assert [g[0].group_index for g in pace.next_groups(source, 5)] == [4]


def test_pace_takes_by_deadline_waits_for_stragglers_and_never_drops():
    """B = 2, K = 1, W = 4. Step 0 admits groups 0-3 (deadline 1) and takes 0 and 1. Step 1
    admits 4 and 5 (deadline 2); 3, 4 and 5 finish, 2 is late: the step owes both its places
    to 2 and 3, takes 3, then waits for the straggler 2 although 4 and 5 are ready."""
    pace = SlimePace(PaceSettings(max_staleness=1, batch=2))
    source = Source()
    now = [0.0]
    finished: dict[int, list] = {}

    def admit():
        for g in pace.next_groups(source, 10):
            for s in g:
                s.status, s.weight_versions = Sample.Status.COMPLETED, ["0"]
            finished[g[0].group_index] = g

    def step(*gids, admitting=False, tick=1.0):
        def run(worker):
            if admitting:
                admit()
            worker.queue.extend(finished[g] for g in gids)
            now[0] += tick

        return run

    worker = ScriptedWorker()
    d = Drain(
        worker,
        Gate(arm="pace", max_staleness=1),
        pace=pace,
        current_version=lambda: 1,
        poll_s=0.0,
        clock=lambda: now[0],
    )
    admit()  # the worker starts before the first call: step 0's window
    assert sorted(finished) == [0, 1, 2, 3]
    worker.script.extend([step(0, 1)])
    out, m = d.collect(ARGS, target=2)
    assert [g[0].group_index for g in out] == [0, 1]
    assert m[f"{P}pace_wait_groups"] == 0.0 and m[f"{P}groups/buffered"] == 0
    admit()
    assert sorted(finished) == [0, 1, 2, 3]  # the window refills only when step 1 begins
    worker.script.extend([step(3, 4, 5, admitting=True), step(), step(2)])
    out, m = d.collect(ARGS, target=2)
    assert sorted(finished) == [0, 1, 2, 3, 4, 5]
    assert [g[0].group_index for g in out] == [2, 3]
    # found waiting at the poll after 3 was taken (t = 3), done when 2 arrived (t = 4)
    assert m[f"{P}pace_wait_groups"] == 1.0 and m[f"{P}pace_wait_s"] == 1.0
    assert m[f"{P}groups/buffered"] == 2  # 4 and 5 wait, entered, for the next step
    assert m[f"{P}groups/trained_fresh"] == 2  # staleness 1 <= K
    assert m[f"{P}groups/dropped_stale"] == 0
    worker.script.extend([step()])
    out, m = d.collect(ARGS, target=2)
    assert [g[0].group_index for g in out] == [4, 5]
    assert m[f"{P}pace_wait_groups"] == 0.0 and m[f"{P}groups/buffered"] == 0


# ── slime's coding-agent example ──────────────────────────────────────────────────────


def test_groups_of_slimes_coding_agent_example_fill_the_batch():
    """The example's samples carry instance_id and agent_exit_code, no exit_status and no
    weight version: before, every group was a no-result and the drain never filled a batch."""
    from test_slime_outcomes import coding_agent_sample

    def group(g, rewards, codes):
        samples = [
            coding_agent_sample(r, c, index=2 * g + k)
            for k, (r, c) in enumerate(zip(rewards, codes, strict=True))
        ]
        for s in samples:
            s.group_index = g
        return samples

    def feed(worker):
        worker.queue.extend(
            [
                group(0, [1.0, 0.0], [0, 0]),
                group(1, [0.0, 0.0], [0, 1]),  # a CLI error: no result for the group
                group(2, [0.0, 1.0], [-1, -1]),  # the agent's time budget ran out
            ]
        )

    d = Drain(ScriptedWorker([feed]), Gate(arm="drop", max_staleness=1), poll_s=0.0)
    out, m = d.collect(ARGS, target=2)
    assert [g[0].group_index for g in out] == [0, 2]
    assert m[f"{P}groups/aborted"] == 1 and m[f"{P}aborted/reason/agent_cli_error"] == 1
    assert m[f"{P}outcome/solved"] == 2 and m[f"{P}outcome/submitted_failure"] == 1
    assert m[f"{P}outcome/budget_failure"] == 1
    assert m[f"{P}groups/trained_fresh"] == 2  # no weight version: never stale
