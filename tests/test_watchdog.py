"""The watchdog: the no-result fraction over the last N groups, the idle limit, the stop line."""

from __future__ import annotations

import pytest

from rescue.errors import InputError
from rescue.watchdog import Watchdog, WatchdogSettings, WatchdogStop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fraction_trips_only_above_the_threshold_over_a_full_window():
    dog = Watchdog(WatchdogSettings(window=4, max_no_result=0.5, idle_s=0))
    for reason in ("container_start", None, "container_start"):
        dog.observe(reason)  # 2 of 3: above 0.5, but the window is not full yet
    dog.observe(None)  # 2 of 4 = 0.5: not above
    dog.observe("grader_error")  # the window slides: still 2 of the last 4
    with pytest.raises(WatchdogStop) as stop:
        dog.observe("grader_error")  # 3 of the last 4
    assert "3 of the last 4 groups had no result" in stop.value.line
    assert dog.groups == 6 and dog.no_result_groups == 4


def test_old_faults_slide_out_of_the_window():
    dog = Watchdog(WatchdogSettings(window=3, max_no_result=0.5, idle_s=0))
    dog.observe("x")
    for _ in range(10):
        dog.observe(None)
    dog.observe("x")  # 1 of the last 3
    assert dog.stopped is None


def test_the_stop_line_names_the_dominant_reason_and_the_last_distinct_errors():
    dog = Watchdog(WatchdogSettings(window=5, max_no_result=0.5, idle_s=0, errors_kept=2))
    dog.observe("grader_error", "swesmith crashed\n  Traceback ...")
    dog.observe(
        "container_start", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
    )
    dog.observe(
        "container_start", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
    )
    dog.observe(None)
    with pytest.raises(WatchdogStop) as stop:
        dog.observe("endpoint", "x" * 1000)
    line = stop.value.line
    assert "\n" not in line
    assert "dominant reason container_start (2 of 5 groups)" in line
    # the two last distinct errors, the newest last; the first one is gone, a long one clipped
    assert "swesmith crashed" not in line
    assert "container_start: Cannot connect to the Docker daemon" in line
    assert "endpoint: " + "x" * 199 + "…" in line and "x" * 201 not in line
    assert str(stop.value) == line


def test_the_census_is_flushed_before_the_stop_and_a_failed_flush_does_not_hide_it():
    flushed: list[str] = []
    dog = Watchdog(WatchdogSettings(window=1, max_no_result=0.0, idle_s=0), flush=flushed.append)
    with pytest.raises(WatchdogStop) as stop:
        dog.observe("engine_down", "connection refused")
    assert len(flushed) == 1 and flushed[0] in stop.value.line
    assert stop.value.line.endswith("census flushed")

    def broken(line: str) -> None:
        raise OSError("wandb unreachable")

    dog = Watchdog(WatchdogSettings(window=1, max_no_result=0.0, idle_s=0), flush=broken)
    with pytest.raises(WatchdogStop, match="census flush failed \\(OSError: wandb unreachable\\)"):
        dog.observe("engine_down")


def test_a_stopped_watchdog_keeps_raising_the_same_stop():
    dog = Watchdog(WatchdogSettings(window=1, max_no_result=0.0, idle_s=5), clock=Clock())
    with pytest.raises(WatchdogStop) as first:
        dog.observe("x")
    for call in (lambda: dog.observe(None), dog.check_idle):
        with pytest.raises(WatchdogStop) as again:
            call()
        assert again.value is first.value


def test_idle_trips_after_idle_s_without_a_finished_group_and_each_group_resets_it():
    clock = Clock()
    dog = Watchdog(WatchdogSettings(window=64, idle_s=60), clock=clock)
    clock.now += 59
    dog.check_idle()
    assert dog.seconds_to_idle() == pytest.approx(1)
    dog.observe(None)
    clock.now += 59
    dog.check_idle()  # counted from the last group, not from the start
    dog.observe("container_start", "no such image")
    clock.now += 60
    with pytest.raises(WatchdogStop) as stop:
        dog.check_idle()
    line = stop.value.line
    assert "no group finished for 60 s (RESCUE_WATCHDOG_IDLE_S=60; 2 groups finished" in line
    assert "1 without a result" in line and "container_start: no such image" in line


def test_zero_turns_each_check_off():
    clock = Clock()
    dog = Watchdog(WatchdogSettings(window=0, idle_s=0), clock=clock)
    for _ in range(100):
        dog.observe("x")
    clock.now += 1e9
    dog.check_idle()
    assert dog.seconds_to_idle() is None and dog.stopped is None


def test_settings_from_the_environment_and_their_errors():
    assert WatchdogSettings.from_env({}) == WatchdogSettings(64, 0.5, 10800.0)
    env = {
        "RESCUE_WATCHDOG_WINDOW": "16",
        "RESCUE_WATCHDOG_MAX_NO_RESULT": "0.25",
        "RESCUE_WATCHDOG_IDLE_S": "600",
    }
    settings = WatchdogSettings.from_env(env)
    assert (settings.window, settings.max_no_result, settings.idle_s) == (16, 0.25, 600.0)
    assert "more than 0.25 of the last 16 groups" in settings.describe()
    assert "no group for 600 s" in settings.describe()
    for var, value in (
        ("RESCUE_WATCHDOG_WINDOW", "many"),
        ("RESCUE_WATCHDOG_WINDOW", "-1"),
        ("RESCUE_WATCHDOG_MAX_NO_RESULT", "1.5"),
        ("RESCUE_WATCHDOG_IDLE_S", "-3"),
    ):
        with pytest.raises(InputError, match=var):
            WatchdogSettings.from_env({var: value})


def test_the_adapters_diagnosis_ends_the_line_and_a_failed_one_stops_the_run_all_the_same():
    def dead() -> str:
        return "rollout engines not answering (1 of 1): http://127.0.0.1:9 (Connection refused)"

    w = Watchdog(WatchdogSettings(window=2, max_no_result=0.5), diagnose=dead)
    w.observe("endpoint_error", "litellm.InternalServerError: 500")
    with pytest.raises(WatchdogStop) as stop:
        w.observe("endpoint_error", "litellm.InternalServerError: 500")
    line = stop.value.line
    assert f"dominant reason endpoint_error (2 of 2 groups); {dead()}; last errors: " in line

    def broken() -> str:
        raise OSError("no route")

    w = Watchdog(WatchdogSettings(window=1, max_no_result=0.5), diagnose=broken)
    with pytest.raises(WatchdogStop, match=r"\(the diagnosis failed: OSError\); last errors"):
        w.observe("endpoint_error")
