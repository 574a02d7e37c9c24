"""The three questions end to end in rehearsal (REHEARSAL=1) on the CPU: every stage hands
the next the files it needs, each ends in a real report holding its predictions, a killed
run resumes at the stage it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rescue.stages import read_state

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
    assert "training stage is SIMULATED" in out
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
    r = question("q1", "--run-dir", str(run), "--rehearsal", "--model", "no-such-model")
    assert r.returncode == 1
    log = run / "logs" / "gradients.log"
    assert (
        f"gradients: FAILED (exit 2): job rescue replay gradients (P1, P2); log {log}" in r.stdout
    )
    assert "no-such-model" in log.read_text()
    assert [s["status"] for s in read_state(run)["stages"]][-2:] == ["failed", "pending"]
