"""slime's worker reporting what it requeues and loses: ``RescueSource`` and the done-callback
report on stand-in tasks here; slime's own ``AsyncRolloutWorker``, ``generate_and_rm_group``,
``generate()`` and ``RolloutDataSourceWithBuffer`` against a stand-in SGLang engine that
aborts at a weight update in tests/test_slime_abort.py."""

from __future__ import annotations

import asyncio

import pytest
from fake_sample import Sample

from rescue.slime.worker import RescueSource, WorkerEvents, report_done

S = Sample.Status


def group(g, status=S.COMPLETED, n=2):
    return [Sample(group_index=g, index=g * n + k, status=status, reward=1.0) for k in range(n)]


class Source:
    def __init__(self):
        self.next = 0
        self.added = []
        self.saved = None

    def get_samples(self, n):
        out = [group(self.next + k, S.PENDING) for k in range(n)]
        self.next += n
        return out

    def add_samples(self, samples):
        self.added.extend(samples)

    def save(self, rollout_id):
        self.saved = rollout_id


def done_task(result=None, exc=None, cancel=False):
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        if cancel:
            future.cancel()
        elif exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future
    finally:
        loop.close()


def test_the_source_passes_everything_on_and_remembers_what_it_handed_out():
    events, inner = WorkerEvents(), Source()
    source = RescueSource(inner, events)
    handed = source.get_samples(1) + source.get_samples(1)
    assert [g[0].group_index for g in handed] == [0, 1]
    assert source.in_flight() == handed
    source.save(7)  # slime's source methods the worker does not use pass through
    assert inner.saved == 7
    aborted = group(1, S.ABORTED)
    source.add_samples([aborted])
    assert inner.added == [aborted]  # slime's requeue path, unchanged
    (event,) = events.drain()
    assert (event.kind, event.gid) == ("requeued", 1)
    assert event.records[0].reason == "aborted"


def test_the_done_report_names_lost_groups_and_leaves_finished_ones_to_slime():
    events = WorkerEvents()
    source = RescueSource(Source(), events)
    handed = source.get_samples(1) + source.get_samples(1) + source.get_samples(1)
    handed += source.get_samples(1)
    report_done(source, 0, done_task(exc=ConnectionError("reward model down")))
    report_done(source, 1, done_task(result=None))  # slime: "expected list[Sample]; dropping"
    report_done(source, 2, done_task(cancel=True))
    report_done(source, 3, done_task(result=handed[3]))
    assert [(e.kind, e.gid, e.reason) for e in events.drain()] == [
        ("lost", 0, "ConnectionError"),
        ("lost", 1, "not_a_list"),
        ("lost", 2, "CancelledError"),
    ]
    assert source.in_flight() == [] and events.error is None


def test_a_worker_that_numbers_groups_otherwise_is_an_accounting_error():
    events = WorkerEvents()
    source = RescueSource(Source(), events)
    handed = source.get_samples(1) + source.get_samples(1)
    report_done(source, 0, done_task(result=handed[1]))
    assert "finished group 1 as #0, but #0 was group 0" in events.error
    events.error = None
    report_done(source, 5, done_task(result=handed[0]))
    assert "group #5, which its data source never handed out" in events.error


def test_groups_in_flight_when_a_worker_stops_are_lost():
    events = WorkerEvents()
    source = RescueSource(Source(), events)
    source.get_samples(1)
    source.get_samples(1)
    assert source.lose_in_flight("worker_stopped") == 2
    assert [(e.kind, e.gid, e.reason) for e in events.drain()] == [
        ("lost", 0, "worker_stopped"),
        ("lost", 1, "worker_stopped"),
    ]
    assert source.in_flight() == []


@pytest.mark.parametrize("n", [1, 3])
def test_the_source_hands_out_what_slime_asks(n):
    source = RescueSource(Source(), WorkerEvents())
    assert len(source.get_samples(n)) == n
