"""The three questions end to end in rehearsal (REHEARSAL=1) on the CPU, every training stage
through Miles' own loop with the tiny model: every stage hands the next the files it needs,
the reports are judged from what the training stage wrote (its wandb runs, dumps and last
checkpoint), a killed run resumes at the stage it stopped.

Needs ``MILES_SRC``, ``MEGATRON_SRC`` and the rehearsal's environment (``REHEARSAL_PY``, or
``.venv-rehearsal``); skipped with the reason otherwise. Run with ``make rehearsal-test
MILES_SRC=... MEGATRON_SRC=... REHEARSAL_MARKERS=...`` (markers ``rehearsal``, and
``rehearsal_ci`` for the chain CI runs).
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

from rescue.stages import read_state

REPO = Path(__file__).resolve().parents[1]
MILES_SRC = os.environ.get("MILES_SRC") or None
MEGATRON_SRC = os.environ.get("MEGATRON_SRC") or None
REHEARSAL_PY = os.environ.get("REHEARSAL_PY") or str(REPO / ".venv-rehearsal" / "bin" / "python")
#: Seconds a chain may take before its test stops it.
LIMIT = 3600

pytestmark = [pytest.mark.rehearsal, pytest.mark.slow]


def _require() -> None:
    if MILES_SRC is None or MEGATRON_SRC is None:
        pytest.skip(
            "needs real sources: set MILES_SRC=/path/to/miles MEGATRON_SRC=/path/to/Megatron-LM"
        )
    if not Path(REHEARSAL_PY).exists():
        pytest.skip(f"no rehearsal environment at {REHEARSAL_PY}: run `make rehearsal` once")


def question(*argv: str, timeout: float = LIMIT) -> subprocess.CompletedProcess:
    _require()
    return subprocess.run(
        [sys.executable, "-m", "rescue", "question", *argv, "--rehearsal", "--rehearsal-python",
         REHEARSAL_PY, "--miles-src", MILES_SRC, "--megatron-src", MEGATRON_SRC],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def predictions(report: Path) -> dict[str, str | None]:
    data = json.loads((report / "report.json").read_text())
    out = {r["id"]: r["verdict"] for c in data["cohorts"] for r in c["results"]}
    out.update({r["id"]: r["verdict"] for r in data.get("offline", [])})
    return out


@pytest.fixture(scope="module")
def q2_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("q") / "q2"
    r = question("q2", "--run-dir", str(run))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return run, r.stdout


def test_q2_rehearsal_trains_every_arm_through_miles_and_gates_on_their_wandb_runs(q2_run):
    run, out = q2_run
    state = read_state(run)
    assert [s["name"] for s in state["stages"]] == [
        "task", "prepare", "model", "calibrate", "train", "wait", "collect", "report", "gate",
    ]  # fmt: skip
    assert all(s["status"] == "done" for s in state["stages"])
    assert "SIMULATED" not in out
    summary = json.loads((run / "train" / "summary.json").read_text())
    names = sorted(r["run"] for r in summary["runs"])
    arms = ("zero", "mask", "matched", "drgrpo-mask", "survivor", "turn")
    assert names == sorted(f"{a}-seed{s}" for a in arms for s in (1, 2))
    assert all(r["ok"] for r in summary["runs"]) and summary["launcher"] == "rlvr"
    # the calibration measured the taught model's own lengths: a cap inside the window
    cap = json.loads((run / "cap.json").read_text())
    assert 0.2 <= cap["rate"] <= 0.4 and cap["cap"] in (16, 24, 32, 48, 64, 96)
    rates = [r["rate"] for r in cap["rates"]]
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-1]
    # the report is judged from the runs' offline wandb folders, one run per arm x seed
    runs = json.loads((run / "runs.json").read_text())["runs"]
    assert len(runs) == 12 and all("/runs/rlvr-" in p for p in runs)
    assert "P3" in predictions(run / "report")
    gate = json.loads((run / "gate.json").read_text())
    assert gate["verdicts"] and "gate:" in (run / "logs" / "gate.log").read_text()
    # done and unchanged: a second run skips every stage
    r = question("q2", "--run-dir", str(run))
    assert r.returncode == 0 and r.stdout.count("inputs unchanged: skipped") == 9


def test_q3_rehearsal_trains_the_swe_arms_and_its_oracle_reads_their_dumps_and_checkpoint(
    tmp_path,
):
    """The chain with the most stages: prepare, pilot, validate, subset, the
    five SWE runs through Miles, the oracle on the never-drop run's dumps and checkpoint,
    the report, FORCE=1 recorded; one seed per arm."""
    no_gate = tmp_path / "q2"
    no_gate.mkdir()
    r = question("q3", "--run-dir", str(tmp_path / "q3"), "--q2-dir", str(no_gate))
    assert r.returncode == 2 and "no q2 gate" in r.stderr and not (tmp_path / "q3").exists()
    r = question("q3", "--run-dir", str(tmp_path / "q3"), "--q2-dir", str(no_gate), "--force",
                 "--seeds", "1")  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    q3 = tmp_path / "q3"
    summary = json.loads((q3 / "train" / "summary.json").read_text())
    assert sorted(x["run"] for x in summary["runs"]) == sorted(
        [
            "drop-seed1",
            "never-drop-seed1",
            "protect-a0.25-seed1",
            "protect-a0.5-seed1",
            "pace-seed1",
        ]
    )
    assert all(x["ok"] for x in summary["runs"])
    record = q3 / "record"
    assert record.is_symlink()
    assert str(record.resolve()).startswith(str((q3 / "train" / "never-drop-seed1").resolve()))
    assert json.loads((q3 / "oracle" / "compare.json").read_text())
    got = predictions(q3 / "report")
    assert "P5" in got and "P6" in got
    data = json.loads((q3 / "report" / "report.json").read_text())
    assert data["forced"] is True and data["notes"][0].startswith("FORCE=1")
    # P6's cost per unit of improvement, in q3's closing summary
    assert "q3: P6 cost: wall-clock per unit of reward improvement" in r.stdout


@pytest.mark.rehearsal_ci
def test_q1_rehearsal_killed_mid_run_resumes_at_the_stage_it_stopped(tmp_path):
    """The chain CI runs (q3's, with the most stages, trains five runs, 708 s alone on 2
    cores): one never-drop run trained through Miles, its dumps read by the census and
    the advantages, its last checkpoint differentiated by the replay, the report judged;
    killed during a stage after training, resumed there; a failing stage named."""
    _require()
    run = tmp_path / "q1"
    argv = [sys.executable, "-m", "rescue", "question", "q1", "--run-dir", str(run), "--rehearsal",
            "--rehearsal-python", REHEARSAL_PY, "--miles-src", MILES_SRC, "--megatron-src",
            MEGATRON_SRC]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + LIMIT
    stopped_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            stages = read_state(run)["stages"]
        except Exception:
            time.sleep(0.5)
            continue
        running = [s["name"] for s in stages if s["status"] == "running"]
        if running and running[0] in ("advantages", "gradients"):
            stopped_at = running[0]
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and its stage, as a kill -9 would
            break
        time.sleep(0.2)
    proc.wait(timeout=60)
    assert stopped_at, "the run ended before it could be killed"
    r = question("q1", "--run-dir", str(run))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"{stopped_at}: the last run stopped during this stage: restarting it" in r.stdout
    assert "train: done, inputs unchanged: skipped" in r.stdout
    assert "census: done, inputs unchanged: skipped" in r.stdout
    got = predictions(run / "report")
    assert {"P1", "P2"} <= set(got) and any(k.startswith("P7") for k in got)
    # the replay differentiated the checkpoint Miles wrote at the last step
    grads = (run / "logs" / "gradients.log").read_text()
    assert str(run / "train" / "checkpoint-hf") in grads
    # a failing stage is named with its job and its log; what it read is not trained again
    model = tmp_path / "not-a-model"  # a folder, so q1 starts; the replay cannot load it
    model.mkdir()
    r = question("q1", "--run-dir", str(run), "--model", str(model))
    assert r.returncode == 1 and "train: done, inputs unchanged: skipped" in r.stdout
    log = run / "logs" / "gradients.log"
    assert (
        f"gradients: FAILED (exit 2): job rescue replay gradients (P1, P2); log {log}" in r.stdout
    )
    assert "not-a-model': not a local model directory" in log.read_text()
    assert [s["status"] for s in read_state(run)["stages"]][-2:] == ["failed", "pending"]


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


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_ctrl_c_during_make_q2_rehearsal_leaves_no_process_and_records_the_stage(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground group) while `make q2 REHEARSAL=1` trains
    through Miles: every process below make ends (Ray's heads and workers, the engines, the
    jobs), rescue says so in one line, the stage is recorded interrupted with the runs it
    reached, and nothing of the unfinished training stage is left in place of its folder."""
    _require()
    from rescue.interrupts import descendants

    run = tmp_path / "q2"
    venv = Path(sys.executable).parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    argv = ["make", "--no-print-directory", f"VENV={venv}", f"REHEARSAL_VENV={Path(REHEARSAL_PY).parent.parent}",
            "-o", f"{venv}/.stamp-sim+replay+rlvr+swe",
            "-o", f"{Path(REHEARSAL_PY).parent.parent}/.stamp", "q2", "REHEARSAL=1",
            f"RUN_DIR={run}", f"MILES_SRC={MILES_SRC}", f"MEGATRON_SRC={MEGATRON_SRC}"]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    progress = run / "progress" / "train.json"
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(progress.read_text())["detail"].startswith("training"):
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    time.sleep(20)  # Ray, the engine and Miles' actors up
    tree = descendants(proc.pid)
    assert len(tree) >= 8  # runner, driver, engine, Ray head and workers, the job
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err
    deadline = time.monotonic() + 30
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive(tree) == []
    said = [x for x in out.splitlines() if ": interrupted by" in x]
    assert said == [
        f"[5/9] train: interrupted by SIGINT; recorded in {run / 'stages.json'}; "
        "the same command resumes here"
    ]
    record = next(st for st in read_state(run)["stages"] if st["name"] == "train")
    assert record["status"] == "interrupted" and record["signal"] == "SIGINT"
    assert not (run / "train").exists()  # no half-trained folder in the training stage's place
    status = subprocess.run(
        [sys.executable, "-m", "rescue", "status", str(run)], capture_output=True, text=True
    )
    assert "INTERRUPTED train" in status.stdout
