"""SIGINT and SIGTERM end the whole process tree a command started, print one line, and a
question's stage is recorded ``interrupted`` (``rescue status`` shows it and how far it got).

The commands run as a terminal runs them: in a session of their own, SIGINT sent to the
whole process group (Ctrl-C), SIGTERM to the command's process only (``kill``, a time-out).
Survivors are looked for among every process that was below the command just before the
signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rescue.interrupts import descendants, end_tree
from rescue.stages import fingerprint, read_state

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

REPO = Path(__file__).resolve().parents[1]
#: A simulation long enough to be interrupted (about a minute of steps on two workers).
LONG = ["--arms", "zero,mask", "--steps", "20000", "--seeds", "1", "--workers", "2",
        "--no-wandb", "--no-plots"]  # fmt: skip


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def signal_and_collect(proc: subprocess.Popen, sig: int, group: bool) -> tuple[list[int], str, str]:
    """Send the signal, wait for the command, and check that nothing below it survived."""
    tree = descendants(proc.pid)
    assert tree, "the command started no process"
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    wait_for(lambda: not alive(tree), timeout=15)
    return tree, out, err


def old_result(out: Path) -> str:
    assert (
        subprocess.run(
            [sys.executable, "-m", "rescue", "sim", "--arms", "zero", "--steps", "3",
             "--seeds", "3", "--no-wandb", "--no-plots", "--no-progress", "--out", str(out)],
            cwd=REPO, capture_output=True, timeout=300,
        ).returncode
        == 0
    )  # fmt: skip
    return fingerprint(out)


def test_end_tree_ends_children_and_grandchildren_in_sessions_of_their_own():
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    wait_for(lambda: len(descendants(parent.pid)) == 1)
    tree = [parent.pid, *descendants(parent.pid)]
    assert end_tree(tree, grace_s=5) == tree
    parent.wait(timeout=10)
    wait_for(lambda: not alive(tree), timeout=10)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_end_tree_leaves_a_pools_workers_for_the_pool_to_reap():
    """Workers ended by ``end_tree`` are seen exited by multiprocessing itself, and the
    executor shuts down at once: reaped behind its back, they read alive for ever and its
    manager thread loops, which hung an interrupted ``make demo`` at exit."""
    import multiprocessing as mp
    import threading
    from concurrent.futures import ProcessPoolExecutor

    from rescue.interrupts import worker_initializer

    pool = ProcessPoolExecutor(2, mp_context=mp.get_context("fork"), initializer=worker_initializer)
    futures = [pool.submit(_sleep, 60) for _ in range(4)]
    wait_for(lambda: len(pool._processes) == 2 and len(descendants()) >= 2)
    workers = list(pool._processes.values())
    end_tree([w.pid for w in workers], grace_s=5)
    wait_for(lambda: not any(w.is_alive() for w in workers), timeout=10)
    closing = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    closing.start()
    closing.join(timeout=20)
    assert not closing.is_alive(), "the executor's shutdown hung on workers it cannot see exit"
    assert all(f.done() for f in futures)


def test_an_interrupted_simulation_ends_in_seconds_every_time(tmp_path):
    """Ctrl-C of a simulation with worker processes, again and again: each ends within
    seconds with its line (the race it lost once in a few interrupts hung it at exit)."""
    for attempt in range(6):
        proc = start([sys.executable, "-m", "rescue", "sim", *LONG, "--out",
                      str(tmp_path / f"sim{attempt}")], tmp_path)  # fmt: skip
        wait_for(lambda proc=proc: len(descendants(proc.pid)) >= 2)
        time.sleep(0.5 + 0.3 * attempt)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"interrupt {attempt + 1} did not end the command within 30 s")
        assert proc.returncode == 130 and "interrupted by SIGINT" in err, err
        assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_an_interrupted_simulation_leaves_no_process_one_line_and_its_old_output(
    tmp_path, sig, group
):
    out = tmp_path / "sim"
    before = old_result(out)
    proc = start([sys.executable, "-m", "rescue", "sim", *LONG, "--out", str(out)], tmp_path)
    wait_for(lambda: len(descendants(proc.pid)) >= 2)  # its two workers
    time.sleep(1.0)
    _, stdout, stderr = signal_and_collect(proc, sig, group)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig
    # the progress bar's lines (redrawn with carriage returns), then one line
    lines = [x for x in stderr.replace("\r", "\n").splitlines() if x and "simulating" not in x]
    assert lines == [f"rescue sim: interrupted by {name}; left as it was: {out}"], stderr
    assert stderr.endswith(f"\nrescue sim: interrupted by {name}; left as it was: {out}\n")
    assert "Traceback" not in stdout + stderr
    assert fingerprint(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_an_interrupted_stage_is_recorded_ends_its_tree_and_resumes(tmp_path, sig, group):
    """A question's stage running ``rescue sim`` with worker processes: interrupted, the
    runner ends the stage and its workers, records it, prints one line; ``rescue status``
    shows the stage interrupted and where it stopped; the next run restarts it."""
    run, out = tmp_path / "run", tmp_path / "run" / "train"
    before = old_result(out)
    driver = tmp_path / "drive.py"
    driver.write_text(
        "import sys\n"
        "from rescue.stages import Runner, Stage\n"
        f"steps = sys.argv[1]\n"
        f"cmd = (sys.executable, '-m', 'rescue', 'sim', *{LONG!r}, '--steps', steps,"
        f" '--out', {str(out)!r})\n"
        f"stage = Stage('train', cmd, outputs=({str(out)!r},),"
        f" progress={str(run / 'progress' / 'train.json')!r})\n"
        f"sys.exit(Runner({str(run)!r}, [stage], question='q2').run())\n"
    )
    proc = start([sys.executable, str(driver), "20000"], tmp_path)
    progress = run / "progress" / "train.json"
    wait_for(lambda: progress.exists() and json.loads(progress.read_text())["done"] > 0)
    _, stdout, stderr = signal_and_collect(proc, sig, group)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig
    said = [x for x in stdout.splitlines() if ": interrupted by" in x]
    assert said == [
        f"[1/1] train: interrupted by {name}; recorded in {run / 'stages.json'}; "
        "the same command resumes here"
    ]
    assert stderr == "" and "Traceback" not in stdout
    record = read_state(run)["stages"][0]
    assert record["status"] == "interrupted" and record["signal"] == name and record["ended"]
    assert fingerprint(out) == before  # the stage's command kept its earlier output
    status = subprocess.run(
        [sys.executable, "-m", "rescue", "status", str(run)], capture_output=True, text=True
    )
    assert "INTERRUPTED train" in status.stdout and f"interrupted by {name}" in status.stdout
    done = json.loads(progress.read_text())["done"]
    assert f"stopped at {done}/40000 steps" in status.stdout
    # the next run restarts the interrupted stage and finishes it
    again = subprocess.run(
        [sys.executable, str(driver), "5"], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "train: interrupted last time: restarting it" in again.stdout
    assert read_state(run)["stages"][0]["status"] == "done"
