"""No command destroys a previous result: each writing command, made to fail on purpose after
its inputs were validated (or interrupted), leaves the earlier output folder as it was, byte
for byte, with no temporary folder beside it; and a run that finishes replaces it.

Commands: ``rescue sim`` (a failure while writing, ``--ray auto`` without a cluster, a bad
``--first-seed``), ``rescue report``, ``rescue replay gradients --trained``, ``rescue oracle
build`` and ``compare``, and the question stages (``rescue.stages.Runner``: a stage's
captured output, and a real ``rescue report`` stage failing in its own process).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from rescue import cli
from rescue.stages import Runner, Stage, fingerprint, read_state

TINY = ["--arms", "zero,mask", "--steps", "4", "--groups-per-step", "4", "--group-size", "4",
        "--concurrency", "4", "--max-turns", "8", "--seeds", "3", "--workers", "1",
        "--no-plots", "--no-progress", "--no-wandb"]  # fmt: skip


def beside(folder: Path) -> list[str]:
    """What lies beside ``folder`` in its parent (a temporary folder left would show)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def sim_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "runs" / "sim"
    assert cli.main(["sim", "--out", str(out), *TINY]) == 0
    (out / "my-notes.txt").write_text("kept\n")  # a file of the user's in the folder
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "runs" / folder.name
    shutil.copytree(folder, target)
    return target


# ── rescue sim ───────────────────────────────────────────────────────────────────────────


def test_rescue_sim_failing_while_it_writes_keeps_the_earlier_run(sim_out, tmp_path, monkeypatch):
    out = copy_of(sim_out, tmp_path)
    before = fingerprint(out)

    def fail(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("rescue.sim.summary.summary_markdown", fail)
    with pytest.raises(OSError, match="No space left"):
        cli.main(["sim", "--out", str(out), *TINY, "--seeds", "4"])
    assert fingerprint(out) == before and beside(out) == []


@pytest.mark.parametrize(
    "refusal",
    [
        ConnectionError("Could not find any running Ray instance."),
        RuntimeError("Timed out while waiting for GCS to become available."),  # a stale address
    ],
)
def test_rescue_sim_without_a_ray_cluster_is_one_line_and_keeps_the_earlier_run(
    sim_out, tmp_path, capsys, monkeypatch, refusal
):
    """What Ray raises when no cluster answers (stood in for: a real `auto` would find any
    cluster this machine runs, another user's included)."""
    ray = pytest.importorskip("ray")

    def init(*args, **kwargs):
        raise refusal

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    out = copy_of(sim_out, tmp_path)
    before = fingerprint(out)
    assert cli.main(["sim", "--out", str(out), *TINY, "--ray", "auto"]) == 2
    err = capsys.readouterr().err
    assert err == f"rescue sim: error: --ray auto: no Ray cluster there ({refusal})\n"
    assert len(err.strip().splitlines()) == 1
    assert fingerprint(out) == before and beside(out) == []
    # and the next documented command still reads it
    assert cli.main(["report", str(out), "--out", str(tmp_path / "r"), "--no-plots",
                     "--no-progress"]) == 0  # fmt: skip


def test_rescue_sim_with_a_negative_first_seed_is_one_line_and_keeps_the_earlier_run(
    sim_out, tmp_path, capsys
):
    out = copy_of(sim_out, tmp_path)
    before = fingerprint(out)
    assert cli.main(["sim", "--out", str(out), *TINY, "--first-seed", "-1"]) == 2
    assert capsys.readouterr().err == (
        "rescue sim: error: argument --first-seed: '-1': allowed an integer >= 0 "
        "(rescue sim --help lists what is allowed)\n"
    )
    assert fingerprint(out) == before


def test_rescue_sim_that_finishes_replaces_its_outputs_and_keeps_the_users_files(sim_out, tmp_path):
    out = copy_of(sim_out, tmp_path)
    assert cli.main(["sim", "--out", str(out), *TINY, "--arms", "zero"]) == 0
    assert sorted(p.name for p in (out / "census").iterdir()) == [
        f"zero-seed{s}.jsonl" for s in range(3)
    ]  # the earlier mask runs are not mixed in
    assert (out / "my-notes.txt").read_text() == "kept\n" and beside(out) == []


# ── rescue report ────────────────────────────────────────────────────────────────────────


def test_rescue_report_failing_while_it_writes_keeps_the_earlier_report(
    sim_out, tmp_path, monkeypatch
):
    out = tmp_path / "report"
    args = ["report", str(sim_out), "--out", str(out), "--no-plots", "--no-progress"]
    assert cli.main(args) == 0
    before = fingerprint(out)

    def fail(j):
        raise RuntimeError("a bug while writing")

    monkeypatch.setattr("rescue.judge.report.markdown", fail)
    with pytest.raises(RuntimeError, match="a bug while writing"):
        cli.main(args)
    assert fingerprint(out) == before and beside(out) == []


def test_rescue_report_with_nothing_to_read_keeps_the_earlier_report(sim_out, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["report", str(sim_out), "--out", str(out), "--no-plots",
                     "--no-progress"]) == 0  # fmt: skip
    before = fingerprint(out)
    assert cli.main(["report", str(tmp_path / "nothing"), "--out", str(out), "--no-progress"]) == 2
    assert fingerprint(out) == before


# ── rescue replay gradients --trained, rescue oracle build / compare ─────────────────────


@pytest.fixture
def recorded(tmp_path) -> Path:
    torch = pytest.importorskip("torch")
    from recorded_dumps import recorded_step

    d = tmp_path / "dumps" / "rollout_data"
    d.mkdir(parents=True)
    for k, (rid, stale) in enumerate(zip((3, 4), ({1, 2}, {10, 11}), strict=True)):
        payload = recorded_step(
            rid, stale=stale, seed=k, groups=3, G=4, cap=4, turn_tokens=2, obs_tokens=1,
            vocab=40, first_group=10 * k,
        )  # fmt: skip
        torch.save(payload, d / f"{rid}.pt")
    return tmp_path / "dumps"


def test_replay_gradients_trained_failing_at_the_second_dump_keeps_the_earlier_gradients(
    recorded, tmp_path, monkeypatch
):
    pytest.importorskip("transformers")
    import rescue.replay.trained as trained

    out = tmp_path / "gradients"
    args = ["replay", "gradients", str(recorded / "rollout_data" / "*.pt"), "--model",
            "tiny-gpt2", "--trained", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    assert sorted(os.listdir(out)) == ["3", "4"]
    before = fingerprint(out)
    real, calls = trained.trained_gradient, []

    def second_fails(d, *a, **kw):
        calls.append(d.step)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return real(d, *a, **kw)

    monkeypatch.setattr(trained, "trained_gradient", second_fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        cli.main([*args, "--model-seed", "1"])
    assert fingerprint(out) == before and beside(out) == []


def test_oracle_build_failing_keeps_the_earlier_oracle_folder(recorded, tmp_path, monkeypatch):
    import rescue.oracle.build as build

    out = tmp_path / "oracle"
    args = ["oracle", "build", str(recorded), "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    (out / "gradients" / "0").mkdir(parents=True)  # a later step's output
    (out / "gradients" / "0" / "model.pt").write_text("x")
    before = fingerprint(out)

    def fail(*a, **kw):
        raise RuntimeError("a dump that cannot be split")

    monkeypatch.setattr(build, "select", fail)
    with pytest.raises(RuntimeError):
        cli.main([*args, "--force"])
    assert fingerprint(out) == before and beside(out) == []
    monkeypatch.undo()
    assert cli.main([*args, "--force", "--a", "0.25"]) == 0
    assert not (out / "gradients").exists()  # derived from the old build: replaced with it


def test_oracle_compare_failing_keeps_the_earlier_comparison(tmp_path, monkeypatch, capsys):
    import rescue.oracle.compare as compare

    folder = tmp_path / "oracle"
    folder.mkdir()
    (folder / "compare.json").write_text('{"earlier": true}')
    (folder / "compare.md").write_text("earlier\n")
    before = fingerprint(folder)
    monkeypatch.setattr(compare, "compare", lambda *a: {"steps": []})

    def fail(report):
        raise RuntimeError("a bug in the table")

    monkeypatch.setattr(compare, "markdown", fail)
    with pytest.raises(RuntimeError):
        cli.main(["oracle", "compare", str(folder)])
    assert fingerprint(folder) == before
    assert sorted(os.listdir(folder)) == ["compare.json", "compare.md"]


# ── the question stages ──────────────────────────────────────────────────────────────────


def test_a_failing_stage_keeps_its_earlier_captured_output(tmp_path):
    """q1's replay stages capture their command's stdout into a file: a failing rerun leaves
    the earlier file as it was."""
    target = tmp_path / "replay" / "census.json"
    ok = Stage("census", (sys.executable, "-c", "print('{\"earlier\": 1}')"), stdout=str(target))
    assert Runner(tmp_path / "run", [ok], question="t", cwd=tmp_path).run() == 0
    before = target.read_text()
    bad = Stage(
        "census",
        (sys.executable, "-c", "print('{\"half'); raise SystemExit(3)"),
        stdout=str(target),
    )
    assert Runner(tmp_path / "run", [bad], question="t", cwd=tmp_path).run() == 1
    assert target.read_text() == before
    assert sorted(os.listdir(target.parent)) == ["census.json"]
    assert read_state(tmp_path / "run")["stages"][0]["status"] == "failed"


def test_a_report_stage_failing_in_its_own_process_keeps_the_earlier_report(sim_out, tmp_path):
    """A real ``rescue report`` stage, made to fail after it read its inputs (a
    ``sitecustomize`` on the stage's PYTHONPATH breaks the report's writer), leaves the
    report of the earlier run as it was."""
    report = tmp_path / "run" / "report"
    command = (sys.executable, "-m", "rescue", "report", str(sim_out), "--out", str(report),
               "--no-plots", "--no-progress")  # fmt: skip
    stage = Stage("report", command, inputs=(str(sim_out),), outputs=(str(report / "report.json"),))
    assert Runner(tmp_path / "run", [stage], question="t", cwd=tmp_path).run() == 0
    before = fingerprint(report)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import rescue.judge.report as r\n"
        "def markdown(j):\n"
        "    raise OSError('No space left on device')\n"
        "r.markdown = markdown\n"
    )
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    failing = Stage(
        "report",
        (*command, "--no-progress"),  # another command: the stage runs again
        inputs=(str(sim_out),),
        outputs=(str(report / "report.json"),),
        env={"PYTHONPATH": path},
    )
    assert Runner(tmp_path / "run", [failing], question="t", cwd=tmp_path).run() == 1
    log = (tmp_path / "run" / "logs" / "report.log").read_text()
    assert "No space left on device" in log
    assert fingerprint(report) == before and beside(report) == []
    assert json.loads((report / "report.json").read_text())["cohorts"]
