"""Progress bars: tqdm on stderr in `rescue sim`, `rescue report`, the sweep watcher and the
rehearsal report (``rescue.progress``); the judge does not import the simulator's runner."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from test_import_graph import import_graph

from rescue import cli
from rescue.progress import LOG_INTERVAL_S, advance_to, progress_bar
from rescue.rlvr.sweep import Run, Watcher

#: What tqdm draws: ``desc: 100%|█████| 4/4 [00:00<00:00, ...]`` (the bar is ASCII off a tty).
TQDM = r"{desc}: +100%\|[^|]*\| {n}/{n} \["

TINY = [
    "--steps", "4", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
    "--max-turns", "12", "--seeds", "1", "--workers", "1", "--no-wandb", "--no-plots",
]  # fmt: skip


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_on_its_stream_and_a_disabled_one_writes_nothing():
    stream = io.StringIO()
    with progress_bar(3, unit="steps", desc="work", file=stream) as bar:
        bar.update(3)
    assert re.search(TQDM.format(desc="work", n=3), stream.getvalue())
    quiet = io.StringIO()
    with progress_bar(3, unit="steps", desc="work", enabled=False, file=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_off_a_terminal_the_bar_redraws_rarely():
    assert progress_bar(3, unit="x", desc="d", file=io.StringIO()).mininterval == LOG_INTERVAL_S
    assert progress_bar(3, unit="x", desc="d", file=Terminal()).mininterval < LOG_INTERVAL_S


def test_advance_to_moves_forward_only():
    bar = progress_bar(10, unit="x", desc="d", file=io.StringIO())
    advance_to(bar, 4)
    advance_to(bar, 2)
    assert bar.n == 4
    advance_to(bar, 10)
    assert bar.n == 10


def test_rescue_sim_draws_a_tqdm_bar_of_the_steps(tmp_path, capsys):
    assert cli.main(["sim", "--out", str(tmp_path), "--arms", "drop,zero", *TINY]) == 0
    err = capsys.readouterr().err
    assert re.search(TQDM.format(desc="simulating", n=8), err), err  # 2 arms x 4 steps


def test_rescue_sim_draws_the_bar_with_worker_processes(tmp_path, capsys):
    tiny = list(TINY)
    tiny[tiny.index("--workers") + 1] = "2"
    assert cli.main(["sim", "--out", str(tmp_path), "--arms", "drop,zero", *tiny]) == 0
    assert re.search(TQDM.format(desc="simulating", n=8), capsys.readouterr().err)


def test_rescue_report_draws_a_bar_of_the_inputs(tmp_path, capsys):
    sim_out = tmp_path / "sim"
    assert cli.main(["sim", "--out", str(sim_out), "--arms", "drop,zero", *TINY]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(sim_out), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    n = len(list((sim_out / "census").glob("*.jsonl"))) + 1  # and runs.json
    assert re.search(TQDM.format(desc="reading runs", n=n), err), err


def test_the_sweep_watcher_draws_a_bar_of_the_ended_runs(tmp_path, capsys):
    runs = [Run(name, f"{name}-1", str(tmp_path / f"{name}.log")) for name in ("a", "b")]
    answers = {"a-1": "Job 'a-1' succeeded", "b-1": "Job 'b-1' succeeded"}
    out = io.StringIO()
    w = Watcher(
        runs,
        address="http://h:1",
        poll_s=0,
        runner=lambda argv: (0, answers[argv[-1]]),
        out=out,
        sleep=lambda s: None,
    )
    assert w.watch() == 0
    assert re.search(TQDM.format(desc="sweep", n=2), capsys.readouterr().err)
    assert "all 2 runs succeeded" in out.getvalue()
    quiet = Watcher(
        [Run("c", "c-1", str(tmp_path / "c.log"))],
        address="http://h:1",
        poll_s=0,
        runner=lambda argv: (0, "Job 'c-1' succeeded"),
        out=io.StringIO(),
        sleep=lambda s: None,
        progress=False,
    )
    assert quiet.watch() == 0 and capsys.readouterr().err == ""


def test_rescue_rlvr_watch_takes_no_progress(tmp_path, capsys):
    plan = tmp_path / "plan.jsonl"
    row = {"run": "r", "submission_id": "s", "log": str(tmp_path / "r.log"), "submitted": False}
    plan.write_text(json.dumps({**row, "error": "refused"}) + "\n")
    argv = ["rlvr", "watch", "--plan", str(plan), "--address", "http://h:1"]
    assert cli.main([*argv, "--no-progress"]) == 1
    assert capsys.readouterr().err == ""
    assert cli.main(argv) == 1
    assert re.search(TQDM.format(desc="sweep", n=1), capsys.readouterr().err)


def test_the_rehearsal_report_draws_a_bar_of_its_checks(tmp_path, capsys):
    from rescue.rehearsal.verdict.report import CHECKS, check_run

    report = check_run(Path(tmp_path), arm="drop", a=None, job_status="FAILED", steps_checked=1)
    assert [c.name for c in report.checks] == list(CHECKS)
    err = capsys.readouterr().err
    assert re.search(TQDM.format(desc="rehearsal report", n=len(CHECKS)), err), err
    check_run(
        Path(tmp_path), arm="drop", a=None, job_status="FAILED", steps_checked=1, progress=False
    )
    assert capsys.readouterr().err == ""


def test_the_judge_does_not_import_the_simulators_runner():
    graph = import_graph()
    seen, todo = set(), [m for m in graph if m == "rescue.judge" or m.startswith("rescue.judge.")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, {}))
    assert "rescue.sim.runner" not in seen
    assert "rescue.progress" in seen  # the bar it draws instead
