"""A rehearsal's processes found by its run folder, and its profile read from what it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rescue.rehearsal.verdict.processes import CpuMeter, component, reap, survivors
from rescue.rehearsal.verdict.profile import profile, render, steps, trainer_timers

pytest.importorskip("psutil")


def _spawn(out: Path, argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "RESCUE_REHEARSAL_DIR": str(out)}
    return subprocess.Popen(argv, env=env, start_new_session=True)


def test_the_runs_processes_are_found_by_its_folder_and_reaped(tmp_path):
    mine = _spawn(tmp_path / "run", [sys.executable, "-c", "import time; time.sleep(60)"])
    other = _spawn(tmp_path / "other", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        while not survivors(tmp_path / "run") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.pid for p in survivors(tmp_path / "run")] == [mine.pid]
        assert reap(tmp_path / "run") == 1
        mine.wait(timeout=10)  # reaped already (psutil waits for what it kills)
        assert survivors(tmp_path / "run") == []
        assert other.poll() is None  # another run's process is never touched
    finally:
        other.kill()
        other.wait()


def test_cpu_is_summed_per_component_with_reaped_children(tmp_path):
    burn = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'sum(range(10**8))']); import time; time.sleep(30)"
    proc = _spawn(tmp_path, [sys.executable, "-c", burn, "rescue.rehearsal.standins.engine"])
    meter = CpuMeter(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meter.sample()
            if meter.totals().get("engine", 0) > 0.5:
                break
            time.sleep(0.2)
        assert meter.totals()["engine"] > 0.5  # the child's CPU counts for its parent
    finally:
        proc.kill()
        proc.wait()
    assert component("ray::MegatronTrainRayActor.train") == "trainer"
    assert component("ray::RolloutManager.generate") == "rollout"
    assert component("/usr/bin/sleep 5") == "other"


LOG = """\
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:10.000 actor] structured_log.py:27 - ft cls=MegatronTrainRayActor fn=init phase=end ok=true elapsed_s=3.0
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:20.000 actor] timer.py:42 - Timer update_weights end (elapsed: 2.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:40.000 actor] timer.py:42 - Timer train_wait end (elapsed: 20.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:41.000 actor] timer.py:42 - Timer log_probs end (elapsed: 1.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:44.000 actor] timer.py:42 - Timer actor_train end (elapsed: 3.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:44.000 actor] timer.py:42 - Timer train end (elapsed: 4.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:00:46.000 actor] timer.py:42 - Timer update_weights end (elapsed: 2.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:01:00.000 actor] timer.py:42 - Timer train_wait end (elapsed: 16.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:01:02.000 actor] timer.py:42 - Timer log_probs end (elapsed: 2.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:01:06.000 actor] timer.py:42 - Timer actor_train end (elapsed: 4.0s)
\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m [2026-12-06 14:01:06.000 actor] timer.py:42 - Timer train end (elapsed: 6.0s)
\x1b[36m(RolloutManager pid=2)\x1b[0m [2026-12-06 14:01:07.000 x] timer.py:42 - Timer train end (elapsed: 99.0s)
"""


def test_the_profile_splits_each_step_into_its_parts(tmp_path):
    (tmp_path / "job.log").write_text(LOG)
    init, timers = trainer_timers(tmp_path / "job.log")
    assert len(timers) == 10  # the rollout manager's line is not the trainer's
    [step] = steps(timers)
    # 22 s between the two steps' ends: 2 s update, 14 s waiting, 2 s log-probs, 4 s train
    assert step == {"wall": 22.0, "wait": 14.0, "log_probs": 2.0, "train": 4.0, "update": 2.0,
                    "save": 0.0}  # fmt: skip
    start = init - 30
    (tmp_path / "marks.json").write_text(json.dumps({"start": start, "inputs": start + 4,
                                                     "engine": start + 8}))  # fmt: skip
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "engine.jsonl").write_text('{"behaviour": "solve", "s": 0.5}\n' * 3)
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "timing.log").write_text(
        '{"call": "exec python -m pytest -q tests", "s": 2.0}\n{"call": "run", "s": 0.1}\n'
        '{"call": "exec cat calc.py", "s": 0.2}\n'
    )
    (tmp_path / "cpu.json").write_text('{"engine": 3.5}')
    p = profile(tmp_path)
    assert p["startup"]["inputs"] == 4.0 and p["startup"]["engine"] == 8.0
    assert p["startup"]["trainer initialized"] == 30.0
    assert p["startup"]["initial weights on the engine"] == 40.0
    assert p["startup"]["first step trained"] == 64.0
    assert p["median step"]["wall"] == 22.0
    assert p["engine"] == {"turns": 3, "seconds": 1.5}
    assert p["sandbox"]["exec pytest"] == {"calls": 1, "seconds": 2.0}
    assert p["sandbox"]["exec"] == {"calls": 1, "seconds": 0.2}
    assert p["cpu"] == {"engine": 3.5}
    text = render(p)
    assert "step 2: wall 22.0" in text and "CPU: engine 3.5" in text


def test_a_sandbox_command_is_counted_once_in_its_agent_not_while_it_runs(tmp_path):
    # a stand-in docker call still running: its CPU is left to the parent that reaps it
    burn = "sum(range(10**8)); import time; time.sleep(30)"
    proc = _spawn(tmp_path, [sys.executable, "-c", burn, "rescue/rehearsal/standins/docker.py"])
    meter = CpuMeter(tmp_path)
    try:
        time.sleep(3)
        meter.sample()
        assert survivors(tmp_path) and meter.totals() == {}
    finally:
        proc.kill()
        proc.wait()
