"""The pilot: resume after interruption, outcome parsing, the subset window and the Wilson interval."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import types
from pathlib import Path

import pytest

from rescue.outcomes import Outcome
from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks.pilot import (
    PilotTask,
    TrialErrors,
    attempts,
    load_results,
    load_tasks,
    run_pilot,
    sample_tasks,
)
from swe_smith_tasks.prepare import prepare
from swe_smith_tasks.subset import (
    Window,
    render_summary,
    summarize,
    wilson_interval,
    write_outputs,
)

FIXTURE = Path(__file__).parent / "fixtures" / "swe_smith_rows.jsonl"
#: What the pilot sends by default: Miles' rollout defaults as SGLang receives them.
DEFAULT_REQUEST = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_tokens": 8192,
    "skip_special_tokens": False,
    "no_stop_trim": False,
}
S, F, B, INF = (o.value for o in Outcome)  # solved, submitted_failure, budget_failure, infra


def _tasks(k: int) -> list[PilotTask]:
    return [PilotTask(f"t{i}", f"fix bug {i}", {"instance_id": f"t{i}"}) for i in range(k)]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    """Ctrl-C semantics even where the test runner was started with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _ctrl_c() -> None:
    """What Ctrl-C does: SIGINT to this process (asyncio.run cancels the pilot, then raises)."""
    signal.raise_signal(signal.SIGINT)


class ScriptedAgent:
    """Stands in for ``swe_smith_tasks.agent.run``: outcome by (instance_id, trial)."""

    def __init__(self, script=None, interrupt_after: int | None = None):
        self.script = script or {}
        self.interrupt_after = interrupt_after
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, base_url, prompt, request_kwargs, metadata, **kw):
        key = (metadata["instance_id"], metadata["pilot_trial"])
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            _ctrl_c()
            await asyncio.sleep(60)  # cancelled by the interrupt long before
        self.calls.append(key)
        await asyncio.sleep(0)
        outcome = self.script.get(key, F)
        return {"outcome": outcome, "reward": float(outcome == S), "exit_status": "Submitted"}


def test_interrupted_pilot_resumes_without_lost_or_duplicated_trials(tmp_path):
    tasks, n = _tasks(4), 3
    first = ScriptedAgent(interrupt_after=5)
    with pytest.raises(KeyboardInterrupt):
        run_pilot(
            tasks,
            tmp_path,
            base_url="http://x",
            model="m",
            n=n,
            concurrency=3,
            trial_fn=first,
            progress=False,
        )
    after_first = [(r["instance_id"], r["trial"]) for r in _lines(tmp_path / "results.jsonl")]
    assert len(after_first) == len(set(after_first))
    assert set(after_first) <= set(first.calls)
    # at most the trials in flight (concurrency - 1 besides the interrupting one) are lost
    assert len(after_first) >= len(first.calls) - 2

    second = ScriptedAgent()
    records = run_pilot(
        tasks,
        tmp_path,
        base_url="http://x",
        model="m",
        n=n,
        concurrency=3,
        trial_fn=second,
        progress=False,
    )
    everything = {(t.instance_id, i) for t in tasks for i in range(n)}
    assert set(second.calls) == everything - set(after_first)  # finished trials are not rerun
    final = [(r["instance_id"], r["trial"]) for r in _lines(tmp_path / "results.jsonl")]
    assert len(final) == len(set(final)) == len(everything)
    assert set(final) == set(records) == everything


def test_agent_result_after_shutdown_cancellation_is_not_recorded(tmp_path):
    """An agent that turns cancellation into an infra result must not leave a finished trial."""
    stalled = []

    async def agent(base_url, prompt, request_kwargs, metadata, **kw):
        if metadata["instance_id"] == "t0":
            try:
                stalled.append(metadata["pilot_trial"])
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return {"outcome": INF, "reason": "cancelled"}
        _ctrl_c()
        await asyncio.sleep(60)

    with pytest.raises(KeyboardInterrupt):
        run_pilot(
            _tasks(2),
            tmp_path,
            base_url="u",
            model="m",
            n=1,
            concurrency=2,
            trial_fn=agent,
            progress=False,
        )
    assert stalled == [0]
    assert load_results(tmp_path / "results.jsonl") == {}


def test_torn_last_line_is_dropped_and_rerun(tmp_path):
    path = tmp_path / "results.jsonl"
    good = {"instance_id": "t0", "trial": 0, "outcome": S, "model": "m"}
    path.write_text(json.dumps(good) + "\n" + '{"instance_id": "t0", "tri')
    agent = ScriptedAgent()
    run_pilot(_tasks(1), tmp_path, base_url="u", model="m", n=2, trial_fn=agent, progress=False)
    assert agent.calls == [("t0", 1)]
    assert sorted(r["trial"] for r in _lines(path)) == [0, 1]


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(
        '{"nope": 1}\n' + json.dumps({"instance_id": "t", "trial": 0, "outcome": S}) + "\n"
    )
    with pytest.raises(ValueError, match="line 1: not a pilot result"):
        load_results(path)


def test_results_of_another_model_refuse_to_mix(tmp_path):
    run_pilot(
        _tasks(1), tmp_path, base_url="u", model="a", n=1, trial_fn=ScriptedAgent(), progress=False
    )
    with pytest.raises(ValueError, match="model 'a', not --model 'b'"):
        run_pilot(
            _tasks(1),
            tmp_path,
            base_url="u",
            model="b",
            n=2,
            trial_fn=ScriptedAgent(),
            progress=False,
        )


def test_trial_outcome_comes_from_the_shared_classifier(tmp_path):
    async def agent(base_url, prompt, request_kwargs, metadata, **kw):
        assert request_kwargs == {"temperature": 0.7}
        assert kw == {"settings": "S"}
        assert base_url == "http://h:1/v1" and prompt == "fix bug " + metadata["instance_id"][1:]
        return {
            "t0": {
                "outcome": B,
                "outcome_reason": "turn_cap",
                "exit_status": "LimitsExceeded",
                "turns": 40,
            },
            "t1": None,  # the agent returned nothing
            "t2": {"exit_status": "Submitted", "reward": 1.0},  # no outcome: classified as solved
        }[metadata["instance_id"]]

    records = run_pilot(
        _tasks(3),
        tmp_path,
        base_url="http://h:1/v1",
        model="m",
        n=1,
        trial_fn=agent,
        request_kwargs={"temperature": 0.7},
        trial_kwargs={"settings": "S"},
        progress=False,
    )
    got = {iid: (r["outcome"], r["reason"]) for (iid, _), r in records.items()}
    assert got == {"t0": (B, "turn_cap"), "t1": (INF, "no_exit_status"), "t2": (S, "resolved")}
    assert records[("t0", 0)]["turns"] == 40


def test_agent_exception_is_an_error_not_an_infra_trial(tmp_path, capsys):
    async def agent(base_url, prompt, request_kwargs, metadata, **kw):
        if metadata["instance_id"] == "t0":
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")
        return {"outcome": S, "reward": 1.0, "exit_status": "Submitted"}

    with pytest.raises(TrialErrors, match="2 trial\\(s\\) raised an error") as err:
        run_pilot(_tasks(2), tmp_path, base_url="u", model="m", n=2, trial_fn=agent, progress=False)
    assert err.value.count == 2
    assert "Traceback" in capsys.readouterr().err  # the first one is shown
    assert sorted((r["instance_id"], r["trial"]) for r in _lines(tmp_path / "results.jsonl")) == [
        ("t1", 0),
        ("t1", 1),
    ]
    errors = _lines(tmp_path / "errors.jsonl")
    assert [(e["instance_id"], e["error"].split(":")[0]) for e in errors] == [
        ("t0", "TypeError")
    ] * 2
    assert "Traceback" in errors[0]["traceback"]
    fixed = ScriptedAgent()  # the bug fixed: a rerun tries exactly the errored trials again
    records = run_pilot(
        _tasks(2), tmp_path, base_url="u", model="m", n=2, trial_fn=fixed, progress=False
    )
    assert sorted(fixed.calls) == [("t0", 0), ("t0", 1)] and len(records) == 4


def test_a_no_result_keeps_the_agents_error_text(tmp_path):
    async def agent(**kw):
        return {
            "outcome": INF,
            "outcome_reason": "container_start",
            "exit_status": "container_start",
            "reward": None,
            "error": "container_start: swebench/x: pull access denied",
        }

    records = run_pilot(
        _tasks(1), tmp_path, base_url="u", model="m", n=1, trial_fn=agent, progress=False
    )
    assert records[("t0", 0)]["error"] == "container_start: swebench/x: pull access denied"
    assert _lines(tmp_path / "results.jsonl")[0]["error"].endswith("pull access denied")


def test_retry_infra_reruns_only_trials_without_result(tmp_path):
    script = {("t0", 1): INF, ("t1", 0): INF}
    run_pilot(
        _tasks(2),
        tmp_path,
        base_url="u",
        model="m",
        n=2,
        trial_fn=ScriptedAgent(script),
        progress=False,
    )
    plain = ScriptedAgent()
    run_pilot(_tasks(2), tmp_path, base_url="u", model="m", n=2, trial_fn=plain, progress=False)
    assert plain.calls == []
    retry = ScriptedAgent({("t0", 1): S, ("t1", 0): S})
    records = run_pilot(
        _tasks(2),
        tmp_path,
        base_url="u",
        model="m",
        n=2,
        trial_fn=retry,
        retry_infra=True,
        progress=False,
    )
    assert sorted(retry.calls) == [("t0", 1), ("t1", 0)]
    assert records[("t0", 1)]["outcome"] == records[("t1", 0)]["outcome"] == S  # later line wins
    # every attempt stays on record: the retried fault still counts against its task
    tried = attempts(tmp_path / "results.jsonl")
    assert tried[("t0", 1)] == [INF, S] and tried[("t0", 0)] == [F]
    stats = {s.instance_id: s for s in summarize(["t0", "t1"], records, 2, attempts=tried)}
    assert (stats["t0"].attempts, stats["t0"].infra_attempts) == (3, 1)
    assert stats["t0"].infra_fraction == 1 / 3 and stats["t0"].decision == "infra"
    assert summarize(["t0"], records, 2)[0].infra_fraction == 0  # the finished trials alone


def test_sample_tasks_is_seeded_and_keeps_file_order():
    tasks = _tasks(20)
    a, b = sample_tasks(tasks, 5, seed=3), sample_tasks(tasks, 5, seed=3)
    assert a == b and len(a) == 5
    assert [tasks.index(t) for t in a] == sorted(tasks.index(t) for t in a)
    assert sample_tasks(tasks, None) == tasks


# --- the Wilson interval and the window -----------------------------------------------------


def test_wilson_interval_against_hand_computed_values():
    # k=2, n=8, z=1.96: p=0.25, z²/n=0.4802, centre=(0.25+0.2401)/1.4802=0.331104,
    # half=1.96*sqrt(0.25*0.75/8 + 3.8416/256)/1.4802=0.259627 -> (0.071477, 0.590731)
    lo, hi = wilson_interval(2, 8)
    assert lo == pytest.approx(0.071477, abs=1e-6) and hi == pytest.approx(0.590731, abs=1e-6)
    # k=0, n=8: lower 0, upper (z²/n)/(1+z²/n) = 0.4802/1.4802 = 0.324416
    lo, hi = wilson_interval(0, 8)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.324416, abs=1e-6)
    lo, hi = wilson_interval(8, 8)  # mirror image of k=0
    assert lo == pytest.approx(1 - 0.324416, abs=1e-6) and hi == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _records(spec: dict[str, list[str]]) -> dict[tuple[str, int], dict]:
    return {
        (iid, t): {"outcome": o, "reason": "x"}
        for iid, outs in spec.items()
        for t, o in enumerate(outs)
    }


SPEC = {
    "keep_quarter": [S] * 2 + [F] * 6,  # 2/8 = 0.25
    "keep_low_edge": [S] + [F] * 4 + [INF] * 3,  # 1/5 = 0.2, infra 3/8
    "keep_high_edge": [S] * 4 + [F] * 4,  # 4/8 = 0.5
    "keep_budget_counts": [S] * 2 + [B] * 3 + [F] * 3,  # budget failures are scored: 2/8
    "too_easy": [S] * 5 + [F] * 3,  # 5/8
    "too_hard": [S] + [F] * 7,  # 1/8
    "infra_heavy": [S] + [F] * 2 + [INF] * 5,  # 1/3 would be in the window, but infra 5/8
    "all_infra": [INF] * 8,
    "incomplete": [S] * 2 + [F] * 3,  # 5 of 8 trials
}


def test_window_decisions():
    window = Window(max_infra_fraction=0.5)  # the success window; the infra default below
    stats = {s.instance_id: s for s in summarize(list(SPEC), _records(SPEC), 8, window)}
    assert {k: s.decision for k, s in stats.items()} == {
        "keep_quarter": "keep",
        "keep_low_edge": "keep",
        "keep_high_edge": "keep",
        "keep_budget_counts": "keep",
        "too_easy": "too_easy",
        "too_hard": "too_hard",
        "infra_heavy": "infra",
        "all_infra": "infra",
        "incomplete": "incomplete",
    }
    s = stats["keep_low_edge"]
    assert (s.solved, s.scored, s.success, s.infra_fraction) == (1, 5, 0.2, 3 / 8)
    assert (s.wilson_low, s.wilson_high) == wilson_interval(1, 5)
    assert stats["all_infra"].success is None
    assert stats["keep_budget_counts"].counts == {S: 2, F: 3, B: 3, INF: 0}


def test_by_default_a_task_with_more_than_five_percent_infra_faults_is_rejected():
    assert Window().max_infra_fraction == 0.05
    spec = {
        "clean": [S] * 2 + [F] * 6,
        "one_fault": [S] * 2 + [F] * 5 + [INF],  # 1/8 = 12.5 %: its success 2/7 is in the window
    }
    stats = {s.instance_id: s for s in summarize(list(spec), _records(spec), n=8)}
    assert stats["clean"].decision == "keep"
    assert stats["one_fault"].decision == "infra" and stats["one_fault"].infra_fraction == 1 / 8
    # 1 fault in 20 attempts is 5 %, not above it
    twenty = _records({"t": [S] * 5 + [F] * 14 + [INF]})
    assert summarize(["t"], twenty, n=20)[0].decision == "keep"


def test_a_task_whose_image_failed_is_reported_never_tried():
    spec = {"ok": [S] * 2 + [F] * 6}
    stats = summarize(["ok", "gone"], _records(spec), 8, no_image={"gone": "pull access denied"})
    gone = stats[1]
    assert (gone.decision, gone.done, gone.note) == ("no_image", 0, "pull access denied")
    summary = render_summary(stats, _records(spec), n=8, window=Window())
    assert (
        "## Not tried: the image failed to pull" in summary
        and "gone: pull access denied" in summary
    )


def test_window_settings_change_the_decisions():
    wide = {
        s.instance_id: s.decision
        for s in summarize(list(SPEC), _records(SPEC), 8, Window(0.1, 0.7, 0.7))
    }
    assert wide["too_easy"] == wide["too_hard"] == wide["infra_heavy"] == "keep"
    assert wide["all_infra"] == "infra"
    with pytest.raises(ValueError, match=r"--low 0\.6 / --high 0\.5"):
        Window(0.6, 0.5)
    with pytest.raises(ValueError, match="--max-infra-fraction"):
        Window(max_infra_fraction=1.5)


def test_trials_beyond_n_and_unknown_tasks_are_not_counted():
    records = _records({"a": [S, F, S, S]})
    records[("other", 0)] = {"outcome": S}
    (s,) = summarize(["a"], records, n=2)
    assert (s.done, s.solved, s.success) == (2, 1, 0.5)


def test_outputs_subset_file_feeds_prepare(tmp_path):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    tasks = load_tasks(tasks_file)
    oauth, tld, flask = (t.instance_id for t in tasks)
    script = {
        (oauth, 0): S,
        (tld, 0): S,
        (tld, 1): S,
        (tld, 2): S,
        (flask, 0): S,
        (flask, 1): INF,
        (flask, 2): INF,
    }
    pilot_dir = tmp_path / "pilot"
    records = run_pilot(
        tasks,
        pilot_dir,
        base_url="u",
        model="m",
        n=4,
        trial_fn=ScriptedAgent(script),
        progress=False,
    )
    stats = summarize([t.instance_id for t in tasks], records, 4)
    paths = write_outputs(pilot_dir, stats, records, n=4, window=Window(), model="m")
    assert [s.decision for s in stats] == [
        "keep",
        "too_easy",
        "infra",
    ]  # flask: 1/2 scored, but infra 2/4
    summary = paths["summary"].read_text()
    assert "| 3 | 1 | 0 | 1 | 1 | 0 | 0 |" in summary  # tasks, keep, too_hard, too_easy, ...
    assert oauth in summary and "Infrastructure reasons: x 2" not in summary
    assert "## Rejected for infrastructure faults" in summary
    assert f"| {flask} | 2/4 | 0.50 |" in summary
    assert len(_lines(paths["tasks"])) == 3

    report = prepare(str(FIXTURE), tmp_path / "train.jsonl", subset=paths["subset"])
    assert report.written == 1 and report.missing_subset_ids == []
    assert [
        json.loads(x)["metadata"]["instance_id"]
        for x in (tmp_path / "train.jsonl").read_text().splitlines()
    ] == [oauth]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_cli_pilot_runs_resumes_and_resummarizes(tmp_path, monkeypatch, capsys):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    agent = ScriptedAgent({(t.instance_id, i): S for t in load_tasks(tasks_file) for i in range(1)})
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=agent))
    out = tmp_path / "pilot"
    common = ["pilot", "--tasks", str(tasks_file), "--out", str(out), "--n", "4"]
    run = [
        *common,
        "--base-url",
        "http://h/v1",
        "--model",
        "m",
        "--agent",
        "fake_swe_agent.run",
        "--no-progress",
        "--skip-sampling-check",
    ]
    assert swe_cli.main(_parse(*run)) == 0
    assert len(agent.calls) == 12
    assert "3 of 3 tasks kept" in capsys.readouterr().out  # 1/4 each
    assert swe_cli.main(_parse(*run)) == 0
    assert len(agent.calls) == 12  # nothing left to run
    assert swe_cli.main(_parse(*common, "--summarize-only", "--low", "0.3")) == 0
    assert "0 of 3 tasks kept" in capsys.readouterr().out
    assert (out / "subset.txt").read_text().splitlines()[1:] == []
    with pytest.raises(ValueError, match="--base-url is required"):
        swe_cli.main(_parse(*common))


def test_cli_default_agent_gets_model_name_and_concurrency(tmp_path, monkeypatch):
    agent_module = pytest.importorskip("swe_smith_tasks.agent")
    seen = []

    async def fake_run(base_url, prompt, request_kwargs, metadata, *, settings, **kw):
        seen.append(
            (settings.model_name, settings.max_concurrency, settings.log_dir, request_kwargs)
        )
        return {"outcome": S, "exit_status": "Submitted", "reward": 1.0}

    monkeypatch.setattr(agent_module, "run", fake_run)
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--n", "1"]
    argv += ["--base-url", "http://h/v1", "--model", "qwen", "--concurrency", "2", "--no-progress"]
    argv += ["--log-dir", str(tmp_path / "logs"), "--max-tokens", "512", "--skip-sampling-check"]
    assert swe_cli.main(_parse(*argv)) == 0
    sampling = {**DEFAULT_REQUEST, "max_tokens": 512}
    assert seen == [("qwen", 2, str(tmp_path / "logs"), sampling)] * 3


def test_cli_window_flags_and_task_sample(tmp_path, capsys):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    oauth, tld, flask = (t.instance_id for t in load_tasks(tasks_file))
    spec = {oauth: [S, F, F, F], tld: [S, S, S, F], flask: [S, INF, INF, INF]}
    out = tmp_path / "pilot"
    out.mkdir()
    (out / "results.jsonl").write_text(
        "".join(
            json.dumps({"instance_id": k[0], "trial": k[1], **r}) + "\n"
            for k, r in _records(spec).items()
        )
    )
    base = ["pilot", "--tasks", str(tasks_file), "--out", str(out), "--n", "4", "--summarize-only"]

    def kept(*flags: str) -> list[str]:
        assert swe_cli.main(_parse(*base, *flags)) == 0
        return (out / "subset.txt").read_text().splitlines()[1:]

    assert kept() == [oauth]
    assert kept("--high", "0.8") == [oauth, tld]
    assert kept("--high", "1", "--max-infra-fraction", "0.8") == [oauth, tld, flask]
    kept("--z", "3")
    stats = {s["instance_id"]: s for s in _lines(out / "tasks.jsonl")}
    assert (stats[oauth]["wilson_low"], stats[oauth]["wilson_high"]) == pytest.approx(
        wilson_interval(1, 4, 3.0)
    )
    kept("--max-tasks", "1", "--seed", "0")
    assert len(_lines(out / "tasks.jsonl")) == 1


def test_cli_retry_infra(tmp_path, monkeypatch):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    first = ScriptedAgent({(t.instance_id, 0): INF for t in load_tasks(tasks_file)})
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=first))
    argv = [
        "pilot",
        "--tasks",
        str(tasks_file),
        "--out",
        str(tmp_path / "p"),
        "--n",
        "2",
        "--base-url",
        "u",
    ]
    argv += ["--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    argv += ["--skip-sampling-check"]
    assert swe_cli.main(_parse(*argv)) == 0
    second = ScriptedAgent()
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=second))
    assert swe_cli.main(_parse(*argv, "--retry-infra")) == 0
    assert sorted(second.calls) == sorted((t.instance_id, 0) for t in load_tasks(tasks_file))


def test_cli_errors_exit_nonzero_and_write_no_subset(tmp_path, monkeypatch, capsys):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)

    async def buggy(**kw):
        raise KeyError("exit_status")

    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=buggy))
    out = tmp_path / "p"
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(out), "--n", "1"]
    argv += ["--base-url", "u", "--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    argv += ["--skip-sampling-check"]
    assert swe_cli.main(_parse(*argv)) == 1
    err = capsys.readouterr().err
    assert "3 trial(s) raised an error (a fault in the code, not infrastructure)" in err
    assert not (out / "subset.txt").exists()


def test_cli_rerun_says_how_to_retry_infra_trials(tmp_path, monkeypatch, capsys):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    agent = ScriptedAgent({(t.instance_id, 0): INF for t in load_tasks(tasks_file)})
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=agent))
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--n", "2"]
    argv += ["--base-url", "u", "--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    argv += ["--skip-sampling-check"]
    for _ in range(2):  # the run, then a rerun that runs nothing
        assert swe_cli.main(_parse(*argv)) == 0
        err = capsys.readouterr().err
        assert "3 trial(s) had no result" in err
        assert "rerun with --retry-infra (make pilot PILOT_RETRY_INFRA=1)" in err


def test_cli_summarize_only_without_results_is_an_error(tmp_path):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--summarize-only"]
    with pytest.raises(ValueError, match="--summarize-only: no results in"):
        swe_cli.main(_parse(*argv))


def test_cli_sends_the_chat_template_kwargs_with_every_request(tmp_path, monkeypatch):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    seen = []

    async def agent(base_url, prompt, request_kwargs, metadata, **kw):
        seen.append(request_kwargs)
        return {"outcome": S, "reward": 1.0, "exit_status": "Submitted"}

    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=agent))
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--n", "1"]
    argv += ["--base-url", "u", "--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    argv += ["--skip-sampling-check"]
    argv += ["--chat-template-kwargs", '{"clear_thinking": false}']
    assert swe_cli.main(_parse(*argv)) == 0
    assert seen == [{**DEFAULT_REQUEST, "chat_template_kwargs": {"clear_thinking": False}}] * 3
    with pytest.raises(SystemExit):
        _parse(*argv[:-1], "[1]")


def test_bad_input_to_rescue_swe_is_one_line(tmp_path, capsys):
    from rescue.cli import main

    missing = tmp_path / "none.jsonl"
    assert main(["swe", "pilot", "--tasks", str(missing), "--summarize-only"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"rescue swe: error: tasks file {str(missing)!r} does not exist "
        "(write it with `rescue swe prepare`)\n"
    )
    tasks = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks)
    argv = ["swe", "pilot", "--tasks", str(tasks), "--out", str(tmp_path / "p"), "--summarize-only"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("rescue swe: error: --summarize-only: no results in")


# ── sampling as training samples, loud failures, pulled images ─────────────────────────


class ServerInfo:
    """SGLang's ``GET /server_info`` on loopback: the resolved server arguments, as
    ``entrypoints/http_server.py`` ``server_info`` returns them (0.5.23), here the two
    fields that decide how omitted sampling parameters are filled; any other path is 404."""

    def __init__(self, **fields):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from threading import Thread

        info = {"version": "0.5.23", "tool_call_parser": "qwen25", **fields}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps(info).encode()
                self.send_response(200 if self.path == "/server_info" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    "fields, refused",
    [
        ({"sampling_defaults": "openai", "preferred_sampling_params": None}, None),
        ({"sampling_defaults": "model", "preferred_sampling_params": None}, "--sampling-defaults"),
        (
            {"sampling_defaults": "openai", "preferred_sampling_params": {"top_k": 20}},
            "--preferred-sampling-params",
        ),
        ({}, "sampling_defaults=None"),
    ],
    ids=["openai", "model-defaults", "preferred", "not-said"],
)
def test_the_pilot_refuses_a_server_that_would_fill_sampling_parameters_otherwise(
    tmp_path, monkeypatch, fields, refused
):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    agent = ScriptedAgent()
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=agent))
    server = ServerInfo(**fields)
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--n", "1"]
    argv += ["--base-url", server.base_url + "/v1", "--model", "m"]
    argv += ["--agent", "fake_swe_agent.run", "--no-progress"]
    try:
        if refused is None:
            assert swe_cli.main(_parse(*argv)) == 0 and len(agent.calls) == 3
        else:
            with pytest.raises(ValueError, match=f"would not sample as training does: .*{refused}"):
                swe_cli.main(_parse(*argv))
            assert agent.calls == []
    finally:
        server.close()


def test_a_server_without_server_info_is_refused_unless_the_check_is_skipped(tmp_path):
    from swe_smith_tasks.sampling import check_endpoint

    (problem,) = check_endpoint("http://127.0.0.1:9/v1", timeout_s=5)
    assert "cannot read the sampling defaults of http://127.0.0.1:9/v1" in problem


def test_a_pilot_whose_trials_all_had_no_result_fails_with_the_dominant_reason(
    tmp_path, monkeypatch, capsys
):
    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)

    async def no_docker(**kw):
        return {
            "outcome": INF,
            "outcome_reason": "container_start",
            "exit_status": "container_start",
            "reward": None,
            "error": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock",
        }

    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=no_docker))
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(tmp_path / "p"), "--n", "2"]
    argv += ["--base-url", "u", "--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    argv += ["--skip-sampling-check"]
    assert swe_cli.main(_parse(*argv)) == 1
    err = capsys.readouterr().err
    assert "no trial had a result (6 without one; most often container_start, 6" in err
    assert "Cannot connect to the Docker daemon" in err
    # the summary says so too, and a rerun (which runs nothing) still fails
    assert swe_cli.main(_parse(*argv)) == 1


def test_tasks_whose_image_failed_to_pull_are_skipped_and_reported(tmp_path, monkeypatch):
    from swe_smith_tasks import images

    tasks_file = tmp_path / "all.jsonl"
    prepare(str(FIXTURE), tasks_file)
    oauth, tld, flask = (t.instance_id for t in load_tasks(tasks_file))
    out = tmp_path / "p"
    images.write_report(
        out / images.REPORT,
        [
            images.ImageStatus(oauth, "swebench/a", "present"),
            images.ImageStatus(tld, "swebench/b", "failed", "pull access denied for swebench/b"),
            images.ImageStatus(flask, "swebench/c", "pulled"),
        ],
    )
    agent = ScriptedAgent()
    monkeypatch.setitem(sys.modules, "fake_swe_agent", types.SimpleNamespace(run=agent))
    argv = ["pilot", "--tasks", str(tasks_file), "--out", str(out), "--n", "1"]
    argv += ["--base-url", "u", "--model", "m", "--agent", "fake_swe_agent.run", "--no-progress"]
    assert swe_cli.main(_parse(*argv, "--skip-sampling-check")) == 0
    assert {c[0] for c in agent.calls} == {oauth, flask}  # never a trial, never a fault
    stats = {s["instance_id"]: s for s in _lines(out / "tasks.jsonl")}
    assert stats[tld]["decision"] == "no_image" and "pull access denied" in stats[tld]["note"]
    assert stats[tld]["counts"][INF] == 0
