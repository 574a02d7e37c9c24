"""What a report says matches what it read and how it decided: only the sections whose
inputs it read, the arm names of the runs it read, each verdict with its reason (in the
report and on every prediction plot, whose titles fit), and P5's window as decided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rescue import cli
from rescue.judge import rules
from rescue.judge.checks import Check
from rescue.judge.evaluation import Result, verdict_reason
from rescue.judge.predictions import PREDICTIONS
from rescue.judge.stats import AS_PREDICTED, INCONCLUSIVE, NO_DIFFERENCE

TINY = ["--steps", "8", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
        "--max-turns", "12", "--seeds", "3", "--workers", "1", "--no-plots", "--no-progress",
        "--no-wandb"]  # fmt: skip
P5 = next(p for p in PREDICTIONS if p.id == "P5")
P6 = next(p for p in PREDICTIONS if p.id == "P6")


@pytest.fixture(scope="module")
def stale_arms(tmp_path_factory) -> Path:
    """drop and never-drop only: P5 is judged, P7 online is not run (no turn)."""
    out = tmp_path_factory.mktemp("sim") / "out"
    assert cli.main(["sim", "--out", str(out), "--arms", "drop,never-drop,mask", *TINY]) == 0
    return out


def report(sim_out: Path, tmp_path: Path, *flags: str) -> tuple[str, dict, str]:
    out = tmp_path / "report"
    assert cli.main(["report", str(sim_out), "--out", str(out), "--no-progress", *flags]) == 0
    return (out / "report.md").read_text(), json.loads((out / "report.json").read_text()), out


def test_a_report_on_simulator_runs_has_no_offline_replay_section(stale_arms, tmp_path, capsys):
    text, data, _ = report(stale_arms, tmp_path, "--no-plots")
    assert "offline replay" not in text and data["offline"] == []
    assert "offline replay" not in capsys.readouterr().out


def test_a_missing_arm_is_named_as_the_simulator_names_it(stale_arms, tmp_path):
    _, data, _ = report(stale_arms, tmp_path, "--no-plots")
    [cohort] = data["cohorts"]
    p7 = next(r for r in cohort["results"] if r["id"] == "P7 online")
    assert p7["note"] == "not run: needs the arms `turn`, `mask`; missing `turn`"


def test_every_judged_prediction_section_says_its_verdict_and_why(stale_arms, tmp_path):
    text, data, _ = report(stale_arms, tmp_path, "--no-plots")
    [cohort] = data["cohorts"]
    judged = [r for r in cohort["results"] if r["verdict"] and r["checks"]]
    assert judged
    for r in judged:
        section = text.split(f"### {r['id']}: ")[1]
        verdict_line = section.splitlines()[2]
        assert verdict_line.startswith(f"Verdict: **{r['verdict']}**, because the ")


def test_p5s_window_says_what_decides_it(stale_arms, tmp_path):
    _, data, _ = report(stale_arms, tmp_path, "--no-plots")
    [p5] = [r for r in data["cohorts"][0]["results"] if r["id"] == "P5"]
    deciding = [c["name"] for c in p5["checks"] if c["decides"]]
    if rules.P5_DECIDES == "level":
        assert all(" over the run, " in name for name in deciding)
        assert p5["window"].startswith(rules.WHOLE_WINDOW)
        assert "The trend per 100 steps is reported beside it" in p5["window"]
        assert p5["falsified"].startswith("the levels over the whole run of the outcome-")
    else:
        assert all(name.startswith("trend of ") for name in deciding)
        assert p5["falsified"].startswith("the trends of the outcome-conditioned turn counts")


def check(name: str, verdict: str, decides: bool = True, reason: str = "") -> Check:
    return Check(name=name, expects="lower", window="w", decides=decides, verdict=verdict,
                 reason=reason)  # fmt: skip


def test_the_reason_names_the_check_that_kept_an_all_checks_prediction_inconclusive():
    r = Result(
        P5,
        {"drop": "drop", "never-drop": "never-drop"},
        [
            check("turns of successes over the run, drop − never-drop", AS_PREDICTED),
            check("turns of failures over the run, drop − never-drop", NO_DIFFERENCE),
            check("trend of the turns of successes, drop − never-drop", AS_PREDICTED, False),
        ],
        INCONCLUSIVE,
    )
    assert verdict_reason(r) == (
        "the turns of failures over the run check found no difference (P5 needs every "
        "deciding check; the turns of successes over the run check found what was predicted)"
    )


def test_the_reason_of_an_inconclusive_check_is_its_own():
    r = Result(
        P6,
        {},
        [check("final success, protect − never-drop", INCONCLUSIVE, reason="the interval is wide")],
        INCONCLUSIVE,
    )
    assert verdict_reason(r) == "the final success check is inconclusive: the interval is wide"


def test_the_reason_of_a_claim_the_family_wise_rule_withdrew_says_so():
    c = check("final success, turn − mask", INCONCLUSIVE)
    c.alone, c.p = AS_PREDICTED, 0.0394
    r = Result(P6, {}, [c], INCONCLUSIVE, alone=AS_PREDICTED)
    assert verdict_reason(r) == (
        "the family-wise rule withdrew the final success check's claim (as predicted alone, "
        "p = 0.039)"
    )


def test_every_prediction_plot_states_its_verdict_and_reason_in_titles_that_fit(
    stale_arms, tmp_path
):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rescue.judge import plots
    from rescue.judge.inputs import read_inputs
    from rescue.judge.report import judge

    j = judge(read_inputs([str(stale_arms)], progress=False).runs)
    [cohort] = j.cohorts
    figures = 0
    for r in cohort.results:
        if not (r.prediction.curves and r.binding):
            continue
        seen: list = []
        real_close = plt.close
        plt.close = lambda fig=None, _seen=seen: _seen.append(fig)  # keep the figure to look at
        try:
            path = plots.prediction_figure(r, cohort, tmp_path / f"{r.prediction.id}.png")
        finally:
            plt.close = real_close
        if path is None:
            continue
        figures += 1
        fig = seen[0]
        headline = fig._suptitle.get_text().replace("\n", " ")
        if r.verdict is not None:
            assert headline.endswith(f"— {r.verdict}: {verdict_reason(r)}")
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        titles = [fig._suptitle] + [ax.title for ax in fig.axes]
        extents = [t.get_window_extent(renderer) for t in titles if t.get_text()]
        for e in extents:  # inside the figure
            assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y1 <= box.y1 + 1
        for ax in fig.axes:  # each panel's title within its column, clear of its neighbour's
            e = ax.title.get_window_extent(renderer)
            others = [o.title.get_window_extent(renderer) for o in fig.axes if o is not ax]
            assert not any(e.overlaps(o) for o in others)
        suptitle = fig._suptitle.get_window_extent(renderer)
        assert not any(suptitle.overlaps(ax.title.get_window_extent(renderer)) for ax in fig.axes)
        real_close(fig)
    assert figures >= 1
