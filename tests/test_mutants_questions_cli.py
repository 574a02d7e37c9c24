"""``rescue question``'s own decisions, read from outside: the settings a run records (a
forced one's included), what it prints when the chain ends, each refusal's whole line, the
GPUs a stand-in ``nvidia-smi`` lists, and the P6 lines of q3's summary.

The runner is replaced by one that records what it was given and writes what a finished
chain leaves (the gate's log, the report), so nothing trains.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from test_questions import cluster_machine, fake_sources

from rescue.cli import main as rescue_main
from rescue.errors import InputError
from rescue.questions import cli as qcli
from rescue.questions.chains import REHEARSAL_SEEDS, REHEARSAL_STEPS
from rescue.stages import Runner


@pytest.fixture
def recorded(monkeypatch) -> list[Runner]:
    """Runners the command built; each 'runs' by writing a finished chain's files."""
    runners: list[Runner] = []

    def finished(self: Runner) -> int:
        runners.append(self)
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "gate.log").write_text("stage noise\ngate: P3 as predicted\ngate: GO for q3\n")
        (self.run_dir / "report").mkdir(exist_ok=True)
        report = {"cohorts": [{"results": [{"id": "P6", "checks": [
            {"name": "tokens per unit of reward improvement, a − b",
             "estimate": {"value": 0.12345, "lo": None, "hi": 2.5, "n": 3}}]}]}]}  # fmt: skip
        (self.run_dir / "report" / "report.json").write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(Runner, "run", finished)
    monkeypatch.setattr(qcli, "power_first", lambda q, seeds, args: bool(args.force))
    return runners


def test_a_forced_q3_records_force_and_q2_s_folder_and_says_why(tmp_path, recorded, capsys):
    (tmp_path / "q2").mkdir()
    (tmp_path / "q2" / "gate.json").write_text(json.dumps({"go": False, "verdicts": ["x"]}))
    run = tmp_path / "q3"
    with cluster_machine(tmp_path):
        code = rescue_main(["question", "q3", "--run-dir", str(run), "--q2-dir",
                            str(tmp_path / "q2"), "--force", "--seeds", "4"])  # fmt: skip
    assert code == 0
    assert recorded[-1].settings == {
        "REHEARSAL": 0, "SEEDS": 4, "STEPS": "NUM_ROLLOUT of the launchers", "FORCE": 1,
        "Q2_DIR": str(tmp_path / "q2"),
    }  # fmt: skip
    assert recorded[-1].question == "q3" and recorded[-1].run_dir == run
    out = capsys.readouterr().out.splitlines()
    assert (f"q3: FORCE=1: starting although q2's gate at {tmp_path / 'q2' / 'gate.json'} "
            "says no go (P3: ['x'])") in out  # fmt: skip
    assert out[-2:] == [
        "q3: P6 cost: tokens per unit of reward improvement, a − b: 0.123 [n/a, 2.5] (n=3)",
        f"q3: report {run / 'report' / 'report.md'}",
    ]


def test_an_unforced_q3_with_q2_s_go_records_force_0(tmp_path, recorded):
    (tmp_path / "gate.json").write_text(json.dumps({"go": True}))
    with cluster_machine(tmp_path):
        rescue_main(["question", "q3", "--run-dir", str(tmp_path / "r"), "--q2-dir", str(tmp_path)])
    assert recorded[-1].settings["FORCE"] == 0 and recorded[-1].settings["SEEDS"] == 3


def test_q2_records_force_only_when_forced_and_prints_the_gate_s_lines(tmp_path, recorded,
                                                                      capsys):  # fmt: skip
    with cluster_machine(tmp_path):
        rescue_main(["question", "q2", "--run-dir", str(tmp_path / "a"), "--seeds", "2",
                     "--force"])  # fmt: skip
        rescue_main(["question", "q2", "--run-dir", str(tmp_path / "b"), "--steps", "9"])
    assert recorded[0].settings == {"REHEARSAL": 0, "SEEDS": 2,
                                    "STEPS": "NUM_ROLLOUT of the launchers", "FORCE": 1}  # fmt: skip
    assert recorded[1].settings == {"REHEARSAL": 0, "SEEDS": 3, "STEPS": 9}
    out = capsys.readouterr().out.splitlines()
    assert out.count("gate: P3 as predicted") == 2 and "stage noise" not in out
    assert out[-3:] == ["gate: P3 as predicted", "gate: GO for q3",
                        f"q2: report {tmp_path / 'b' / 'report' / 'report.md'}"]  # fmt: skip


def test_a_rehearsal_records_its_defaults_and_says_what_stands_in(tmp_path, recorded, capsys):
    src = fake_sources(tmp_path)
    rescue_main(["question", "q3", "--run-dir", str(tmp_path / "r3"), "--rehearsal", "--force",
                 *src])  # fmt: skip
    rescue_main(["question", "q1", "--run-dir", str(tmp_path / "r1"), "--rehearsal", *src])
    q3, q1 = recorded
    assert q3.settings["REHEARSAL"] == 1 and q3.settings["SEEDS"] == REHEARSAL_SEEDS["q3"]
    assert q3.settings["STEPS"] == REHEARSAL_STEPS["q3"]
    assert q1.settings == {"REHEARSAL": 1, "STEPS": REHEARSAL_STEPS["q1"]}
    out = capsys.readouterr().out
    assert "q1: REHEARSAL=1: every training stage through Miles' own loop on this CPU" in out
    assert "stand(s) in for the cluster's (each says what and why when it starts)" in out


def test_q1_on_the_cluster_records_only_that_it_is_no_rehearsal(tmp_path, recorded):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "rollout_0.pt").write_bytes(b"")
    rescue_main(["question", "q1", "--run-dir", str(tmp_path / "r"), "--dumps",
                 str(tmp_path / "d"), "--model", "tiny-llama"])  # fmt: skip
    assert recorded[-1].settings == {"REHEARSAL": 0}


def test_a_failed_chain_prints_no_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Runner, "run", lambda self: 1)
    monkeypatch.setattr(qcli, "power_first", lambda q, seeds, args: False)
    with cluster_machine(tmp_path):
        assert rescue_main(["question", "q2", "--run-dir", str(tmp_path / "r")]) == 1
    assert "report" not in capsys.readouterr().out


def q3_ending_with(report: dict, tmp_path, monkeypatch, capsys) -> list[str]:
    """The lines a finished q3 (q2's go given) prints, its chain leaving ``report``."""

    def finished(self):
        (self.run_dir / "report").mkdir(parents=True)
        (self.run_dir / "report" / "report.json").write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(Runner, "run", finished)
    monkeypatch.setattr(qcli, "power_first", lambda q, seeds, args: False)
    (tmp_path / "gate.json").write_text(json.dumps({"go": True}))
    with cluster_machine(tmp_path):
        rescue_main(["question", "q3", "--run-dir", str(tmp_path / "r"), "--q2-dir", str(tmp_path)])
    return capsys.readouterr().out.splitlines()


def test_q3_without_p6_says_its_cost_was_not_measured(tmp_path, monkeypatch, capsys):
    assert q3_ending_with({"cohorts": []}, tmp_path, monkeypatch, capsys)[-2:] == [
        "q3: P6's cost was not measured (no P6 result)",
        f"q3: report {tmp_path / 'r' / 'report' / 'report.md'}",
    ]


@pytest.mark.parametrize(("listing", "code", "gpus"), [
    ("GPU 0: H100\nGPU 1: H100\nNo devices were found\n", 0, 2),
    ("GPU 0: H100\n", 9, 0),  # the driver failed: nothing counts
    ("  GPU 0: indented\nMIG 1g\n", 0, 0),
])  # fmt: skip
def test_the_gpus_are_the_lines_nvidia_smi_lists(tmp_path, monkeypatch, listing, code, gpus):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 3\nprintf '{listing}'\nexit {code}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert qcli.gpu_count() == gpus


def test_without_nvidia_smi_there_is_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert qcli.gpu_count() == 0


def test_the_machine_refusal_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MILES_DIR", raising=False)
    assert qcli.machine_refusal("q3") == 2
    err = capsys.readouterr().err
    assert err == (
        "rescue question: error: q3 trains on a GPU cluster through Miles: no GPU here "
        f"(nvidia-smi lists none); no Miles checkout at MILES_DIR={qcli.MILES_DIR_DEFAULT} "
        "(train_async.py missing); on this machine run its rehearsal, make q3 REHEARSAL=1 "
        "FORCE=1\n"
    )
    with cluster_machine(tmp_path):
        assert qcli.machine_refusal("q2") == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("missing", ["MILES_SRC", "MEGATRON_SRC"])
def test_a_rehearsal_s_source_that_is_no_checkout_is_named(tmp_path, missing):
    src = fake_sources(tmp_path)
    miles, meg = src[1], src[3]
    if missing == "MILES_SRC":
        miles = str(tmp_path)
    else:
        meg = str(tmp_path / "miles")
    with pytest.raises(InputError) as e:
        qcli.check_sources(miles, meg)
    what, marker = (("a Miles checkout", "train_async.py") if missing == "MILES_SRC"
                    else ("a Megatron-LM checkout", "megatron/training"))  # fmt: skip
    value = miles if missing == "MILES_SRC" else meg
    assert str(e.value) == (
        f"{missing}={value!r}: REHEARSAL=1 trains through Miles' loop and needs {what} "
        f"(with {marker}): set {missing}=/path"
    )
    with pytest.raises(InputError, match="MILES_SRC=''"):
        qcli.check_sources("", meg)
    qcli.check_sources(src[1], src[3])  # both checkouts: no error


def test_q1_s_inputs(tmp_path):
    (tmp_path / "d").mkdir()
    qcli.check_q1(str(tmp_path / "absent"), "", rehearsal=True)  # a rehearsal makes its dumps
    qcli.check_q1("", "tiny-gpt2", rehearsal=False)
    qcli.check_q1("", str(tmp_path / "d"), rehearsal=False)  # a checkpoint folder
    with pytest.raises(InputError) as e:
        qcli.check_q1("", "gpt-5", rehearsal=True)
    assert str(e.value) == (
        "MODEL=gpt-5: no such checkpoint folder or file; allowed: a path, or tiny-gpt2 / tiny-llama"
    )
    with pytest.raises(InputError) as e:
        qcli.check_q1(str(tmp_path / "d"), "", rehearsal=False)
    assert str(e.value) == f"DUMPS={tmp_path / 'd'}: no *.pt dump in it (Miles' rollout_*.pt)"


def test_q3_s_gate_messages(tmp_path):
    with pytest.raises(InputError) as e:
        qcli.check_gate(tmp_path, force=False)
    assert str(e.value) == (
        f"no q2 gate at {tmp_path / 'gate.json'}: run make q2 first; or make q3 FORCE=1 "
        "(recorded in the report)"
    )
    assert (
        qcli.check_gate(tmp_path, force=True)
        == f"no q2 gate at {tmp_path / 'gate.json'}: run make q2 first"
    )
    (tmp_path / "gate.json").mkdir()  # a folder of that name is no gate either
    assert qcli.check_gate(tmp_path, force=True).startswith("no q2 gate at")


def test_the_command_s_defaults():
    parser = argparse.ArgumentParser()
    qcli.configure(parser)
    args = parser.parse_args(["q2", "--run-dir", "r"])
    assert (args.rehearsal, args.force, args.seeds, args.steps) == (False, False, None, 0)
    assert (args.q2_dir, args.dumps, args.model, args.miles_src) == (None, "", "", "")
    assert args.rehearsal_python == "" and args.megatron_src == ""
    with pytest.raises(SystemExit):
        parser.parse_args(["q4", "--run-dir", "r"])
    with pytest.raises(SystemExit):
        parser.parse_args(["q2"])  # --run-dir is required


def test_the_p6_lines_read_only_p6_s_cost_checks():
    report = {"cohorts": [
        {"results": [{"id": "P6", "checks": [
            {"name": "success within seed noise", "estimate": {"value": 1.0}},
            {"name": "tokens per unit of reward improvement", "estimate": {},
             "reason": "no run"},
            {"name": "x per unit of reward improvement",
             "estimate": {"value": 1234.5, "lo": 0.001234, "hi": None, "n": 4}}]}]},
        {"results": [{"id": "P5", "checks": [{"name": "y per unit of reward improvement"}]}]},
    ]}  # fmt: skip
    assert qcli.p6_costs(report) == [
        "q3: P6 cost: tokens per unit of reward improvement: n/a; no run",
        "q3: P6 cost: x per unit of reward improvement: 1.23e+03 [0.00123, n/a] (n=4)",
    ]
    assert qcli.p6_costs({}) == []


def test_the_default_miles_checkout_is_the_launchers():
    assert qcli.MILES_DIR_DEFAULT == "/root/miles"
    assert (
        "\nMILES_DIR=${MILES_DIR:-/root/miles}\n"
        in (Path(qcli.__file__).parents[2] / "launch" / "config.sh").read_text()
    )


def test_a_hung_or_failing_nvidia_smi_counts_no_gpu_and_cannot_hang_the_command(monkeypatch):
    import subprocess

    asked: list[object] = []

    def hung(argv, **kw):
        asked.append(kw.get("timeout"))
        raise subprocess.TimeoutExpired(argv, kw.get("timeout") or 0)

    monkeypatch.setattr(qcli.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(qcli.subprocess, "run", hung)
    assert qcli.gpu_count() == 0
    assert isinstance(asked[0], (int, float)) and 0 < asked[0] <= 60  # a limit, not forever

    def broken(argv, **kw):
        raise OSError(8, "Exec format error")

    monkeypatch.setattr(qcli.subprocess, "run", broken)
    assert qcli.gpu_count() == 0


def test_p6_lines_of_a_report_without_results_or_checks():
    assert qcli.p6_costs({"cohorts": [{}]}) == []
    assert qcli.p6_costs({"cohorts": [{"results": [{"id": "P6"}]}]}) == []


def test_the_chain_is_built_from_the_settings_the_command_was_given(tmp_path, monkeypatch):
    from rescue.questions import chains

    built = []
    for q in ("q1", "q2", "q3"):
        monkeypatch.setitem(chains.QUESTIONS, q, lambda s: built.append(s) or [])
    monkeypatch.setattr(qcli, "power_first", lambda q, seeds, args: False)
    monkeypatch.setattr(Runner, "run", lambda self: 1)
    monkeypatch.chdir(tmp_path)
    src = fake_sources(tmp_path)
    rescue_main(["question", "q3", "--run-dir", "r", "--rehearsal", "--force", "--seeds", "4",
                 "--steps", "6", "--rehearsal-python", "/py", "--model", "m", *src])  # fmt: skip
    s = built[-1]
    assert (s.rehearsal, s.seeds, s.steps, s.force) == (True, 4, 6, True)
    assert s.q2_dir == tmp_path / "runs" / "q2"  # the default, resolved
    assert (s.rehearsal_python, s.model) == ("/py", "m")
    assert s.miles_src == str((tmp_path / "miles").resolve())
    assert s.megatron_src == str((tmp_path / "meg").resolve())
    # a rehearsal of q1 makes its own dumps: a DUMPS that is not there is not refused
    rescue_main(["question", "q1", "--run-dir", "r1", "--rehearsal", "--dumps", "absent", *src])
    assert built[-1].dumps == "absent" and built[-1].miles_src
    with cluster_machine(tmp_path):
        rescue_main(["question", "q2", "--run-dir", "r2"])
    assert (built[-1].miles_src, built[-1].megatron_src, built[-1].force) == ("", "", False)


def _documented_flags() -> dict[str, str]:
    """``docs/questions.md``'s table of the command's flags: flag -> meaning."""
    text = (Path(qcli.__file__).parents[2] / "docs" / "questions.md").read_text()
    head = "| flag | from make | meaning |"
    assert head in text
    rows = {}
    for line in text.split(head, 1)[1].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        flag, _, meaning = (c.strip() for c in line.strip("|").split(" | "))
        rows[flag.strip("`")] = meaning
    return rows


def test_the_flags_and_their_help_are_the_ones_the_docs_list():
    parser = argparse.ArgumentParser()
    qcli.configure(parser)
    actions = {
        (a.option_strings[0] if a.option_strings else a.dest): a
        for a in parser._actions
        if a.dest != "help"
    }
    documented = _documented_flags()
    assert list(documented) == list(actions)
    for flag, meaning in documented.items():
        assert actions[flag].help == meaning, flag
    args = parser.parse_args(["q1", "--run-dir", "r", "--rehearsal", "--force"])
    assert args.rehearsal is True and args.force is True
    assert parser.parse_args(["q3", "--run-dir", "r", "--power-noise", "sim"]).power_noise == "sim"
    with pytest.raises(SystemExit):
        parser.parse_args(["q3", "--run-dir", "r", "--power-noise", "exact"])


def test_a_rehearsal_names_the_stages_that_stand_in_and_runs_from_the_repository(
    tmp_path, recorded, capsys, monkeypatch
):
    import dataclasses

    from rescue.questions import chains

    src = fake_sources(tmp_path)
    monkeypatch.chdir(tmp_path)  # the chain runs from the repository's top, not from here
    for q in ("q2", "q3"):
        rescue_main(["question", q, "--run-dir", str(tmp_path / q), "--rehearsal", "--force",
                     *src])  # fmt: skip
    plain, q1 = dict(chains.QUESTIONS), chains.QUESTIONS["q1"]
    plain["q1"] = lambda settings: [dataclasses.replace(st, note="") for st in q1(settings)]
    monkeypatch.setattr(chains, "QUESTIONS", plain)
    rescue_main(["question", "q1", "--run-dir", str(tmp_path / "q1"), "--rehearsal", *src])
    said = [x for x in capsys.readouterr().out.splitlines() if "REHEARSAL=1" in x]
    tail = "stand(s) in for the cluster's (each says what and why when it starts)"
    head = "REHEARSAL=1: every training stage through Miles' own loop on this CPU with a tiny model"
    assert said == [f"q2: {head}; task, model {tail}", f"q3: {head}; pilot, validate, train {tail}",
                    f"q1: {head}; no stage {tail}"]  # fmt: skip
    assert [r.cwd for r in recorded] == [Path(qcli.__file__).resolve().parents[2]] * 3


def test_q3_prints_each_of_p6_s_costs_on_a_line_of_its_own(tmp_path, monkeypatch, capsys):
    check = {"estimate": {"value": 2.0, "lo": 1.0, "hi": 3.0, "n": 3}}
    report = {"cohorts": [{"results": [{"id": "P6", "checks": [
        {**check, "name": "tokens per unit of reward improvement"},
        {**check, "name": "seconds per unit of reward improvement"}]}]}]}  # fmt: skip
    assert q3_ending_with(report, tmp_path, monkeypatch, capsys)[-3:-1] == [
        "q3: P6 cost: tokens per unit of reward improvement: 2 [1, 3] (n=3)",
        "q3: P6 cost: seconds per unit of reward improvement: 2 [1, 3] (n=3)",
    ]


Q2_ARMS = ["zero", "mask", "matched", "step-control", "drgrpo-mask", "survivor", "turn"]
Q3_ARMS = ["drop", "never-drop", "protect:0.25", "protect:0.5", "pace"]


@pytest.fixture
def power_calls(monkeypatch) -> dict:
    """``power_first``'s calls of the power tools, each recorded and answered by a token."""
    from rescue.judge import power as pw
    from rescue.sim import power_cli

    calls: dict = {"power": []}

    def noise_of(noise, arms, seeds, **kw):
        calls["noise"] = (noise, list(arms), seeds)
        return "the null", "the noise"

    def power(arms, **kw):
        calls["power"].append((list(arms), kw))
        return "the table"

    def line(table, n, effect=None, arms=()):
        calls["line"] = (table, n, list(arms))
        return "the line"

    monkeypatch.setattr(power_cli, "noise_of", noise_of)
    monkeypatch.setattr(pw, "power", power)
    monkeypatch.setattr(pw, "line", line)
    return calls


@pytest.mark.parametrize(("rehearsal", "chosen", "noise"), [
    (False, None, "sim"), (True, None, "synthetic"), (False, "synthetic", "synthetic"),
    (True, "sim", "sim"),
])  # fmt: skip
def test_the_power_line_is_the_question_s_arms_under_the_noise_asked_or_the_default(
    power_calls, capsys, rehearsal, chosen, noise
):
    args = argparse.Namespace(rehearsal=rehearsal, force=False, power_noise=chosen)
    assert qcli.power_first("q2", 4, args) is False
    # P3 among q2's predictions: every count from 3 to 10 at the map's P3 effect too
    assert power_calls["noise"] == (noise, Q2_ARMS, 10)
    assert power_calls["power"] == [(Q2_ARMS, {
        "seeds": [3, 4, 5, 6, 7, 8, 9, 10], "effects": (1.5, 0.62), "replicates": 100,
        "null": "the null", "noise": "the noise"})]  # fmt: skip
    assert power_calls["line"] == ("the table", 4, Q2_ARMS)
    assert capsys.readouterr().out == "q2: power of the report on the cluster's arms: the line\n"


def test_below_the_judge_s_minimum_nothing_is_simulated_and_force_is_said(power_calls, capsys):
    from rescue.judge import power as pw

    args = argparse.Namespace(rehearsal=False, force=True, power_noise=None)
    assert qcli.power_first("q3", 2, args) is True
    assert power_calls["power"] == [] and "noise" not in power_calls
    assert power_calls["line"] == (pw.Power(tuple(Q3_ARMS), 0, (2,), (0.0,)), 2, Q3_ARMS)
    assert capsys.readouterr().out.splitlines() == [
        "q3: power of the report on the cluster's arms: the line",
        "q3: FORCE=1: SEEDS=2: P5, P6 compare these arms, and the judge decides nothing on "
        "fewer than 3 paired seeds per arm; running anyway",
    ]
