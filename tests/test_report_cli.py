"""`rescue report` on the simulator's output: every flag changes what is written."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rescue import cli
from rescue.sim.arms import DEFAULT_ARMS

TINY = ["--steps", "8", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
        "--max-turns", "12", "--seeds", "3", "--workers", "1", "--no-plots", "--no-progress",
        "--no-wandb"]  # fmt: skip


@pytest.fixture(scope="module")
def sim_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "out"
    assert cli.main(["sim", "--out", str(out), *TINY]) == 0
    return out


def report(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "report"
    assert cli.main(["report", *args, "--out", str(out)]) == 0
    return out


def test_report_on_the_simulators_output(sim_out, tmp_path, capsys):
    out = report(tmp_path, str(sim_out), "--no-progress")
    text = (out / "report.md").read_text()
    for pid in ("P3", "P4", "P5", "P6", "P7 online", "P7 offline", "protect vs pace"):
        assert f"### {pid}:" in text
    # No replay report was read: no offline section (P1, P2 and the replay's P7 offline).
    assert "## offline replay" not in text and "### P1:" not in text
    data = json.loads((out / "report.json").read_text())
    [cohort] = data["cohorts"]
    assert cohort["family"] == "sim" and cohort["arms"]["protect-a0.5"] == [0, 1, 2]
    p6 = next(r for r in cohort["results"] if r["id"] == "P6")
    assert p6["verdict"] in ("as predicted", "opposite", "no difference", "inconclusive")
    first = p6["checks"][0]
    assert first["estimate"]["n"] == 3 and first["estimate"]["dof"] == 2
    assert first["window"].startswith("the last 20% of the steps")
    assert data["offline"] == []
    printed = capsys.readouterr().out
    runs = len(DEFAULT_ARMS) * 3  # every default arm, three seeds
    assert f"read {runs} runs and 0 replay reports" in printed and "| P6 |" in printed
    assert "offline replay" not in printed
    # The family-wise rule, said at the top of the report and of what is printed.
    fw = data["family_wise"]
    assert fw["rule"] == "holm" and fw["kept"] + len(fw["withdrawn"]) == fw["claims"]
    assert text.index("Family-wise rule: Holm's step-down") < text.index("## sim runs")
    assert f"the {fw['size']} deciding checks" in text and "Family-wise rule" in printed
    assert data["collisions"] == [] and "Collisions" not in text
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert "sim-P6-protect-a0.5-never-drop-protect-a0.1.png" in pngs
    assert {"sim-behaviour_vs_b.png", "sim-strategy.png", "sim-time_to_target.png"} <= set(pngs)


def test_no_plots_writes_no_png(sim_out, tmp_path, capsys):
    out = report(tmp_path, str(sim_out / "census"), "--no-plots", "--no-progress")
    assert (out / "report.md").exists() and not (out / "plots").exists()
    assert "plots:" not in capsys.readouterr().out


def test_without_matplotlib_the_plots_are_skipped_with_a_message(
    sim_out, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "rescue.judge.plots", raising=False)
    report(tmp_path, str(sim_out), "--no-progress")
    assert (
        "plots: matplotlib not installed (pip install 'rescue[sim]'): skipped"
        in capsys.readouterr().out
    )


def test_progress_goes_to_stderr_unless_no_progress(sim_out, tmp_path, capsys):
    report(tmp_path, str(sim_out), "--no-plots")
    assert "inputs" in capsys.readouterr().err
    report(tmp_path, str(sim_out), "--no-plots", "--no-progress")
    assert capsys.readouterr().err == ""


def test_default_out_is_runs_report(sim_out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(sim_out), "--no-plots", "--no-progress"]) == 0
    assert (tmp_path / "runs" / "report" / "report.md").exists()


def test_a_missing_input_is_one_clear_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "rescue report: error: RUNS:" in capsys.readouterr().err


def test_report_judges_p7_offline_on_a_replay_advantages_report(tmp_path, capsys):
    """`rescue replay advantages --json` on three synthetic dumped steps, then `rescue report`."""
    torch = pytest.importorskip("torch")
    from rescue.replay.synthetic import synthetic_step

    for step in range(3):
        torch.save(
            synthetic_step(rollout_id=step, seed=10 + step, first_group=10 * step),
            tmp_path / f"rollout_{step}.pt",
        )
    assert cli.main(["replay", "advantages", str(tmp_path / "rollout_*.pt")]) == 0
    headline = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("P7 ("))
    assert "against the leave-one-out group baseline" in headline  # the judge's scale
    assert cli.main(["replay", "advantages", str(tmp_path / "rollout_*.pt"), "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)
    assert headline.split(": ")[1].startswith(replay["total"]["verdict_vs_loo"])
    path = tmp_path / "advantages.json"
    path.write_text(json.dumps(replay))
    out = report(tmp_path, str(path), "--no-plots", "--no-progress")
    data = json.loads((out / "report.json").read_text())
    assert data["cohorts"] == []
    p7 = next(r for r in data["offline"] if r["id"] == "P7 offline")
    first, second = p7["checks"]
    assert first["estimate"]["n"] == 3 and first["decides"] and not second["decides"]
    assert first["estimate"]["value"] == pytest.approx(  # decided on the leave-one-out scale
        np.mean([s["reduction_vs_loo"] for s in replay["steps"]])
    )
    assert second["estimate"]["value"] == pytest.approx(
        np.mean([s["reduction"] for s in replay["steps"]])
    )
    assert p7["verdict"] in ("as predicted", "opposite", "inconclusive")
