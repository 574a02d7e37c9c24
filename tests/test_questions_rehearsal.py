"""The three questions end to end in rehearsal (REHEARSAL=1) on the CPU: every stage hands
the next the files it needs, each ends in a real report holding its predictions, a killed
run resumes at the stage it stopped, Ctrl-C during ``make q2 REHEARSAL=1`` leaves no process
and records the stage. Long end-to-end chains: the ``slow`` tier (make test-all, CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rescue.stages import read_state

pytestmark = pytest.mark.slow  # long end-to-end chains: make test-all and CI

REPO = Path(__file__).resolve().parents[1]


def question(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rescue", "question", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def predictions(report: Path) -> dict[str, str | None]:
    data = json.loads((report / "report.json").read_text())
    out = {r["id"]: r["verdict"] for c in data["cohorts"] for r in c["results"]}
    out.update({r["id"]: r["verdict"] for r in data.get("offline", [])})
    return out


@pytest.fixture(scope="module")
def q2_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("q") / "q2"
    r = question("q2", "--run-dir", str(run), "--rehearsal", "--steps", "30")
    assert r.returncode == 0, r.stdout + r.stderr
    return run, r.stdout


def test_q2_rehearsal_runs_every_stage_and_ends_in_a_judged_p3_gate(q2_run):
    run, out = q2_run
    state = read_state(run)
    assert [s["name"] for s in state["stages"]] == [
        "prepare",
        "calibrate",
        "train",
        "wait",
        "collect",
        "report",
        "gate",
    ]
    assert all(s["status"] == "done" for s in state["stages"])
    train = state["stages"][2]
    assert train["note"].startswith("SIMULATED") and "SIMULATED" in out
    assert "q2: REHEARSAL=1: the train stage is SIMULATED" in out
    # the cap the calibration wrote and what stands in for it, said the way the summary says it
    log = (run / "logs" / "train.log").read_text()
    assert (
        "the simulator has no token cap; scenario budget-three-outcome's turn cap, 12 turns" in log
    )
    assert "turn cap 12" in (run / "train" / "summary.md").read_text()
    assert state["settings"]["STEPS"] == 30
    assert "P3" in predictions(run / "report")
    gate = json.loads((run / "gate.json").read_text())
    assert gate["verdicts"] and gate["go"] is False  # two seeds decide nothing
    assert "gate: NO GO for q3" in (run / "logs" / "gate.log").read_text()
    cap = json.loads((run / "cap.json").read_text())
    assert cap["data"] == str(run / "data" / "prompts.jsonl")
    # done and unchanged: a second run skips every stage
    r = question("q2", "--run-dir", str(run), "--rehearsal", "--steps", "30")
    assert r.returncode == 0 and r.stdout.count("inputs unchanged: skipped") == 7


def test_q3_rehearsal_is_refused_without_go_and_forced_says_so_in_its_report(q2_run, tmp_path):
    q2, _ = q2_run
    r = question("q3", "--run-dir", str(tmp_path / "q3"), "--rehearsal", "--q2-dir", str(q2))
    assert r.returncode == 2 and "says no go" in r.stderr and not (tmp_path / "q3").exists()
    r = question(
        "q3",
        "--run-dir",
        str(tmp_path / "q3"),
        "--rehearsal",
        "--q2-dir",
        str(q2),
        "--force",
        "--steps",
        "30",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = tmp_path / "q3" / "report"
    got = predictions(report)
    assert "P5" in got and "P6" in got
    data = json.loads((report / "report.json").read_text())
    assert data["forced"] is True and data["notes"][0].startswith("FORCE=1")
    assert (report / "report.md").read_text().startswith("> **FORCE=1")
    # the grader validated the pilot's subset (reference solutions graded, all resolve) and
    # the training prompts are that validated subset
    summary = (tmp_path / "q3" / "validate" / "summary.md").read_text()
    picked = [
        x for x in (tmp_path / "q3" / "pilot" / "subset.txt").read_text().split() if "__" in x
    ]
    assert picked and f"Reference solutions resolved: {len(picked)} of {len(picked)}" in summary
    trained = (tmp_path / "q3" / "data" / "train.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["metadata"]["instance_id"] for x in trained) == sorted(picked)
    compare = json.loads((tmp_path / "q3" / "oracle" / "compare.json").read_text())
    assert compare  # the oracle compared the arms on the recorded cohort
    assert read_state(tmp_path / "q3")["settings"]["FORCE"] == 1


def test_q1_rehearsal_killed_mid_run_resumes_at_the_stage_it_stopped(tmp_path):
    run = tmp_path / "q1"
    argv = [sys.executable, "-m", "rescue", "question", "q1", "--run-dir", str(run), "--rehearsal"]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 600
    stopped_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            stages = read_state(run)["stages"]
        except Exception:
            time.sleep(0.2)
            continue
        running = [s["name"] for s in stages if s["status"] == "running"]
        if running and running[0] in ("advantages", "gradients"):
            stopped_at = running[0]
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and its stage, as a kill -9 would
            break
        time.sleep(0.1)
    proc.wait(timeout=60)
    assert stopped_at, "the run ended before it could be killed"
    r = question("q1", "--run-dir", str(run), "--rehearsal")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{stopped_at}: the last run stopped during this stage: restarting it" in r.stdout
    assert "dumps: done, inputs unchanged: skipped" in r.stdout
    assert "census: done, inputs unchanged: skipped" in r.stdout
    got = predictions(run / "report")
    assert {"P1", "P2"} <= set(got) and any(k.startswith("P7") for k in got)


def test_a_failing_rehearsal_stage_is_named_with_its_job_and_log(tmp_path):
    run = tmp_path / "q1"
    model = tmp_path / "not-a-model"  # a folder, so q1 starts; the replay cannot load it
    model.mkdir()
    r = question("q1", "--run-dir", str(run), "--rehearsal", "--model", str(model))
    assert r.returncode == 1
    log = run / "logs" / "gradients.log"
    assert (
        f"gradients: FAILED (exit 2): job rescue replay gradients (P1, P2); log {log}" in r.stdout
    )
    assert "not-a-model': not a local model directory" in log.read_text()
    banner = next(x for x in r.stdout.splitlines() if x.startswith("q1: REHEARSAL=1"))
    assert "the dumps stage is SIMULATED" in banner and "train" not in banner
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
    """Ctrl-C (SIGINT to the whole foreground group) while `make q2 REHEARSAL=1` trains:
    every process below make ends, rescue says so in one line (make adds its own line,
    `Interrupt` or `Error 130`), no traceback, the stage is recorded interrupted, and `rescue status`
    shows it with the steps it reached."""
    from rescue.interrupts import descendants

    run = tmp_path / "q2"
    venv = Path(sys.executable).parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    argv = ["make", "--no-print-directory", f"VENV={venv}", "-o", f"{venv}/.stamp-sim+replay+rlvr+swe",
            "q2", "REHEARSAL=1", f"RUN_DIR={run}", "STEPS=5000"]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    progress = run / "progress" / "train.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(progress.read_text())["done"] > 0:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    tree = descendants(proc.pid)
    assert len(tree) >= 3  # the runner, the stage, its simulator workers
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 15
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(tree) == []
    assert "Traceback" not in out + err
    said = [x for x in out.splitlines() if ": interrupted by" in x]
    assert said == [
        f"[3/7] train: interrupted by SIGINT; recorded in {run / 'stages.json'}; "
        "the same command resumes here"
    ]
    [make_says] = [x for x in err.splitlines() if x.strip()]  # make's own line, no other
    assert re.fullmatch(r"make: \*\*\* \[Makefile:[0-9]+: q2\] (Interrupt|Error 130)", make_says)
    record = next(st for st in read_state(run)["stages"] if st["name"] == "train")
    assert record["status"] == "interrupted" and record["signal"] == "SIGINT"
    status = subprocess.run(
        [sys.executable, "-m", "rescue", "status", str(run)], capture_output=True, text=True
    )
    assert "INTERRUPTED train" in status.stdout and "STEPS=5000" in status.stdout
    assert "stopped at " in status.stdout and "/50000 steps" in status.stdout
