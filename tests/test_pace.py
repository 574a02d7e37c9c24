"""The pace schedule: admission window, what a step owes, the staleness bound on random runs."""

from __future__ import annotations

from itertools import count

import numpy as np
import pytest

from rescue.pace import ENV_WINDOW, PaceSchedule, PaceSettings

# ── settings ─────────────────────────────────────────────────────────────────


def test_the_window_defaults_to_k_plus_one_batches_and_reads_its_setting():
    assert PaceSettings(max_staleness=2, batch=4).window == 12
    assert PaceSettings.from_env({}, max_staleness=2, batch=4).window == 12
    assert PaceSettings.from_env({ENV_WINDOW: " "}, max_staleness=2, batch=4).window == 12
    assert PaceSettings.from_env({ENV_WINDOW: "5"}, max_staleness=2, batch=4).window == 5
    assert PaceSettings.from_env({ENV_WINDOW: "4"}, max_staleness=0, batch=4).window == 4


@pytest.mark.parametrize("text", ["3", "13", "half", "6.0", "-1"])
def test_a_window_outside_batch_to_k_plus_one_batches_is_refused(text):
    with pytest.raises(
        ValueError,
        match=rf"^RESCUE_PACE_WINDOW='?{text}'?; allowed: an integer from the batch \(4\) "
        r"to \(K \+ 1\) x batch \(12\), or unset for 12$",
    ):
        PaceSettings.from_env({ENV_WINDOW: text}, max_staleness=2, batch=4)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_staleness": -1, "batch": 4}, "max_staleness"),
        ({"max_staleness": None, "batch": 4}, "max_staleness"),
        ({"max_staleness": 1, "batch": 0}, "batch"),
        ({"max_staleness": True, "batch": 4}, "max_staleness"),
    ],
)
def test_k_and_the_batch_are_checked(kwargs, name):
    with pytest.raises(ValueError, match=rf"^pace {name}="):
        PaceSettings(**kwargs)


# ── admission ────────────────────────────────────────────────────────────────


def test_the_window_refills_when_a_step_starts_not_when_a_group_is_taken():
    s = PaceSchedule(PaceSettings(max_staleness=1, batch=2, window=4))
    s.begin_step()
    for g in "abcd":
        s.admit(g)
    assert not s.can_admit() and s.open == 4
    for g in "ab":
        s.ready(g)
        s.take(g)
    assert s.open == 2 and s.taken == 2 and not s.can_admit()  # taking frees nothing
    with pytest.raises(RuntimeError, match="exceeds the window 4"):
        s.admit("e")
    s.begin_step()
    assert s.can_admit()
    s.admit("e")
    s.admit("f")
    assert not s.can_admit()
    s.reject("c")  # an aborted or filtered group frees its place
    assert s.can_admit()


def test_a_group_is_due_k_steps_after_the_step_it_started_in():
    s = PaceSchedule(PaceSettings(max_staleness=3, batch=1))
    s.begin_step()
    assert s.admit("a") == 3
    s.ready("a")
    s.take("a")
    s.begin_step()
    assert s.admit("b") == 4 and s.deadline("b") == 4


# ── taking ───────────────────────────────────────────────────────────────────


def test_the_step_waits_for_an_owed_straggler_while_another_group_is_ready():
    s = PaceSchedule(PaceSettings(max_staleness=1, batch=2))
    s.begin_step()  # step 0
    for g in "abcd":
        s.admit(g)  # all due at step 1
    for g in "bcd":
        s.ready(g)
    assert s.owed() == (2, 1)
    assert s.choose() == "b"  # earliest deadline, then earliest ready
    s.take("b")
    assert s.choose() == "c"
    s.take("c")
    s.begin_step()  # step 1: a and d are due now
    assert s.owed() == (2, 0)
    s.admit("e")
    s.ready("e")  # due at step 2: ready, but both places are owed
    assert s.choose() == "d"
    assert s.take("d") == 1
    assert s.choose() is None and s.waits_for_straggler()
    s.ready("a")
    assert not s.waits_for_straggler() and s.choose() == "a"
    assert s.take("a") == 1


def test_a_free_place_takes_any_ready_group_earliest_deadline_first():
    s = PaceSchedule(PaceSettings(max_staleness=2, batch=2))
    s.begin_step()
    s.admit("old")  # due at 2
    s.ready("old")
    s.take("old")
    s.admit("slow")  # due at 2, in flight
    s.begin_step()
    s.admit("new")  # due at 3
    s.ready("new")
    assert s.owed() == (0, 2)
    assert s.choose() == "new"  # nothing owed yet: no waiting for "slow"
    assert not s.waits_for_straggler()


def test_nothing_ready_is_an_ordinary_wait_not_a_straggler_wait():
    s = PaceSchedule(PaceSettings(max_staleness=0, batch=2))
    s.begin_step()
    s.admit("a")
    assert s.choose() is None and not s.waits_for_straggler()


def test_misuse_raises():
    s = PaceSchedule(PaceSettings(max_staleness=1, batch=1))
    s.begin_step()
    s.admit("a")
    with pytest.raises(RuntimeError, match="admitted twice"):
        s.admit("a")
    with pytest.raises(RuntimeError, match="taken while still in flight"):
        s.take("a")
    with pytest.raises(RuntimeError, match="is not open"):
        s.ready("z")
    s.ready("a")
    s.take("a")
    with pytest.raises(RuntimeError, match="already took its 1 groups"):
        s.choose()


# ── random runs: the bound, the invariant, no deadlock ──────────────────────


def _durations(rng, n):
    """Most groups take 0.1-1 time units; one in five is a straggler taking 2-12."""
    slow = rng.random(n) < 0.2
    return np.where(slow, rng.uniform(2, 12, n), rng.uniform(0.1, 1.0, n))


def run_pace(settings, steps, seed, reject_p=0.1, train_time=1.0):
    """A discrete-event run of the schedule: generations finish after random durations,
    a batch takes what ``choose`` names and waits for the next completion otherwise.
    Returns each taken group's lag in steps and the straggler-wait time."""
    rng = np.random.default_rng(seed)
    s = PaceSchedule(settings)
    ids = count()
    finish: dict[int, float] = {}
    lags: list[int] = []
    waited = 0.0
    now = 0.0

    def admit_all(t):
        while s.can_admit():
            g = next(ids)
            s.admit(g)
            finish[g] = t + float(_durations(rng, 1)[0])

    def complete_until(t):
        while finish and min(finish.values()) <= t:
            g = min(finish, key=finish.get)
            tf = finish.pop(g)
            s.reject(g) if rng.random() < reject_p else s.ready(g)
            admit_all(tf)

    for _ in range(steps):
        s.begin_step()
        admit_all(now)
        while s.places:
            r, _ = s.owed()
            assert 0 <= r <= s.places
            assert s.open + s.taken <= settings.window
            g = s.choose()
            if g is None:
                assert finish, "the step waits for nothing in flight"
                nxt = min(finish.values())
                if s.waits_for_straggler():
                    waited += nxt - now
                now = nxt
                complete_until(now)
                continue
            lags.append(s.take(g))
        now += train_time
        complete_until(now)
    return lags, waited


def run_fifo(batch, steps, seed, train_time=1.0):
    """Miles' fully-async order for the same durations: B generations in flight, the batch
    takes groups as they finish; the lag of each taken group in steps."""
    rng = np.random.default_rng(seed)
    started: dict[int, int] = {}
    finish: dict[int, float] = {}
    ids = count()
    ready: list[int] = []
    lags = []
    now = 0.0

    def refill(t, step):
        while len(finish) < batch:
            g = next(ids)
            started[g] = step
            finish[g] = t + float(_durations(rng, 1)[0])

    for step in range(steps):
        refill(now, step)
        taken = 0
        while taken < batch:
            if ready:
                lags.append(step - started[ready.pop(0)])
                taken += 1
                continue
            g = min(finish, key=finish.get)
            now = finish.pop(g)
            ready.append(g)
            refill(now, step)
        now += train_time
        while finish and min(finish.values()) <= now:
            g = min(finish, key=finish.get)
            finish.pop(g)
            ready.append(g)
            refill(now, step)
    return lags


@pytest.mark.parametrize("k, batch, window", [(0, 3, None), (1, 4, None), (2, 4, None), (3, 2, 5)])
def test_no_taken_group_lags_more_than_k_steps_and_every_step_fills(k, batch, window):
    settings = PaceSettings(max_staleness=k, batch=batch, window=window)
    for seed in range(20):
        lags, _ = run_pace(settings, steps=60, seed=seed)
        assert len(lags) == 60 * batch  # every step filled: no deadlock
        assert max(lags) <= k


def test_the_same_runs_without_pace_exceed_k():
    """The random runs are hard enough: Miles' order trains stragglers later than K steps."""
    assert max(max(run_fifo(4, steps=60, seed=seed)) for seed in range(20)) > 2


def test_the_step_waits_for_stragglers_only_when_owed():
    """Stragglers are waited for at K = 1; with a bound far beyond any straggler (K = 40)
    and a window of one batch nothing is ever owed early, so no step waits for one."""
    waits = [run_pace(PaceSettings(1, 4), steps=40, seed=seed)[1] for seed in range(10)]
    assert sum(waits) > 0
    for seed in range(10):
        lags, waited = run_pace(PaceSettings(40, 4, window=4), steps=40, seed=seed)
        assert waited == 0.0 and len(lags) == 160
