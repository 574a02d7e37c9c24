"""The question chains (rescue.questions): status, the gate, q3's refusal, the cluster wiring."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from rescue.cli import main as rescue_main
from rescue.errors import InputError
from rescue.questions import chains
from rescue.questions.cli import check_gate, power_first
from rescue.questions.rehearsal import gate_decision
from rescue.questions.status import render
from rescue.stages import write_state


def state(tmp_path: Path, statuses, progress=None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    stages = []
    for name, status in statuses:
        stages.append(
            {
                "name": name,
                "job": f"job-{name}",
                "note": "",
                "status": status,
                "started": "2026-01-01T00:00:00+0000",
                "ended": None,
                "exit_code": 3 if status == "failed" else None,
                "log": str(run / "logs" / f"{name}.log"),
                "progress": str(run / "p.json"),
            }
        )
    write_state(run, {"question": "q2", "settings": {"REHEARSAL": 1}, "stages": stages})
    if progress is not None:
        (run / "p.json").write_text(json.dumps(progress))
    return run


def test_status_shows_every_stage_and_a_bar_for_the_running_one(tmp_path, capsys):
    run = state(
        tmp_path,
        [("prepare", "done"), ("train", "running"), ("report", "pending")],
        {
            "done": 120,
            "total": 400,
            "unit": "steps",
            "detail": "3/10 runs (arm x seed) done, 40 steps per run",
        },
    )
    text, code = render(run)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"q2 in {run}" and "REHEARSAL=1" in lines[1]
    assert "[1/3] done" in lines[2] and "prepare" in lines[2]
    assert "[2/3] running" in lines[3] and "job-train" in lines[3]
    assert "120/400" in lines[4] and "30%" in lines[4] and "|" in lines[4]  # tqdm's meter
    assert "3/10 runs (arm x seed) done, 40 steps per run" in lines[5]
    assert "[3/3] pending" in lines[6]
    assert rescue_main(["status", str(run)]) == 0
    assert "120/400" in capsys.readouterr().out


def test_status_of_a_failed_stage_names_its_log_and_exits_1(tmp_path):
    run = state(tmp_path, [("prepare", "done"), ("calibrate", "failed")])
    text, code = render(run)
    assert code == 1
    assert f"exit 3; log {run / 'logs' / 'calibrate.log'}" in text


def test_status_of_a_running_stage_without_progress_says_so(tmp_path):
    run = state(tmp_path, [("train", "running")])
    assert "no progress reported yet" in render(run)[0]


def test_status_of_a_folder_that_is_no_run_is_an_error(tmp_path, capsys):
    assert rescue_main(["status", str(tmp_path)]) == 2
    assert "RUN_DIR must be a run folder" in capsys.readouterr().err


def p3_report(verdict: str) -> dict:
    check = {
        "name": "mask - zero cap-hit trend",
        "decides": True,
        "verdict": verdict,
        "estimate": {"value": 0.1, "lo": 0.02, "hi": 0.18, "n": 3},
    }
    return {
        "cohorts": [
            {
                "results": [
                    {"id": "P3", "verdict": verdict, "checks": [check]},
                    {"id": "P4", "verdict": "as predicted", "checks": []},
                ]
            }
        ]
    }


def test_the_gate_is_go_only_when_p3_is_as_predicted():
    assert gate_decision(p3_report("as predicted"))["go"] is True
    for v in ("opposite", "no difference", "inconclusive"):
        d = gate_decision(p3_report(v))
        assert d["go"] is False and d["verdicts"] == [v]
    assert gate_decision({"cohorts": []}) == {
        "go": False, "verdicts": [], "checks": [], "control": None
    }  # fmt: skip
    assert gate_decision(p3_report("as predicted"))["checks"][0]["estimate"]["lo"] == 0.02


def test_the_gate_stage_prints_the_verdict_and_interval_and_writes_gate_json(tmp_path, capsys):
    from rescue.questions.rehearsal import main

    (tmp_path / "report.json").write_text(json.dumps(p3_report("inconclusive")))
    assert main(["gate", str(tmp_path / "report.json"), "--out", str(tmp_path / "gate.json")]) == 0
    out = capsys.readouterr().out
    assert "P3 inconclusive" in out and "[0.02, 0.18]" in out and "NO GO for q3" in out
    assert json.loads((tmp_path / "gate.json").read_text())["go"] is False


def test_q3_refuses_without_q2s_go_unless_forced(tmp_path, capsys):
    with pytest.raises(InputError, match=r"no q2 gate at .*run make q2 first"):
        check_gate(tmp_path, force=False)
    (tmp_path / "gate.json").write_text(json.dumps({"go": False, "verdicts": ["inconclusive"]}))
    with pytest.raises(InputError, match=r"says no go .*FORCE=1"):
        check_gate(tmp_path, force=False)
    assert "says no go" in check_gate(tmp_path, force=True)
    (tmp_path / "gate.json").write_text(json.dumps({"go": True}))
    assert check_gate(tmp_path, force=False) == ""
    # the command (on a GPU machine with Miles): refused before any stage runs, nothing written
    run = tmp_path / "q3"
    (tmp_path / "gate.json").write_text(json.dumps({"go": False}))
    with cluster_machine(tmp_path):
        code = rescue_main(["question", "q3", "--run-dir", str(run), "--q2-dir", str(tmp_path)])
    assert code == 2 and not run.exists()
    assert "FORCE=1" in capsys.readouterr().err


@contextlib.contextmanager
def cluster_machine(tmp_path: Path, gpus: int = 8, miles: bool = True):
    """This machine as a GPU node: a stand-in ``nvidia-smi`` listing ``gpus`` GPUs first on
    PATH, and MILES_DIR a checkout holding train_async.py (or an empty folder)."""
    bin_dir, checkout = tmp_path / "bin", tmp_path / "miles"
    bin_dir.mkdir(exist_ok=True)
    checkout.mkdir(exist_ok=True)
    if miles:
        (checkout / "train_async.py").write_text("")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        + "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus))
    )
    smi.chmod(0o755)
    old = {k: os.environ.get(k) for k in ("PATH", "MILES_DIR")}
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{old['PATH']}"
    os.environ["MILES_DIR"] = str(checkout)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize(
    ("gpus", "miles", "why"),
    [
        (0, True, "no GPU here (nvidia-smi lists none)"),
        (8, False, "no Miles checkout at MILES_DIR="),
        (0, False, "no GPU here (nvidia-smi lists none); no Miles checkout at MILES_DIR="),
    ],
)
@pytest.mark.parametrize("question", ["q2", "q3"])
def test_the_cluster_chains_refuse_a_machine_without_gpus_or_miles_before_anything(
    tmp_path, capsys, question, gpus, miles, why
):
    run = tmp_path / "run"
    with cluster_machine(tmp_path, gpus=gpus, miles=miles):
        code = rescue_main(["question", question, "--run-dir", str(run), "--force"])
    err = capsys.readouterr().err
    assert code == 2 and not run.exists() and len(err.splitlines()) == 1
    assert f"{question} trains on a GPU cluster through Miles: {why}" in err
    forced = " FORCE=1" if question == "q3" else ""
    assert err.rstrip().endswith(
        f"on this machine run its rehearsal, make {question} REHEARSAL=1{forced}"
    )


def test_on_a_gpu_machine_with_miles_the_cluster_chain_is_not_refused_for_it(tmp_path):
    from rescue.questions.cli import check_cluster

    with cluster_machine(tmp_path):
        check_cluster("q2")  # no error


@pytest.mark.parametrize(
    ("dumps", "model", "message"),
    [
        ("missing", "tiny-gpt2", "DUMPS={}/missing: no such folder"),
        ("empty", "tiny-gpt2", "DUMPS={}/empty: no *.pt dump in it"),
        ("dumps", "no-such-model", "MODEL=no-such-model: no such checkpoint folder or file"),
    ],
)
def test_q1_refuses_missing_dumps_or_model_before_anything(tmp_path, capsys, dumps, model, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "rollout_0.pt").write_bytes(b"")
    run = tmp_path / "run"
    argv = ["question", "q1", "--run-dir", str(run), "--dumps", str(tmp_path / dumps)]
    assert rescue_main([*argv, "--model", model]) == 2
    assert message.format(tmp_path) in capsys.readouterr().err and not run.exists()


def fake_sources(tmp_path) -> list[str]:
    """A Miles and a Megatron-LM folder a rehearsal's checks accept (nothing runs them)."""
    (tmp_path / "miles").mkdir(exist_ok=True)
    (tmp_path / "miles" / "train_async.py").write_text("")
    (tmp_path / "meg" / "megatron" / "training").mkdir(parents=True, exist_ok=True)
    return ["--miles-src", str(tmp_path / "miles"), "--megatron-src", str(tmp_path / "meg")]


def test_the_recorded_steps_are_the_ones_the_training_runs(tmp_path, monkeypatch):
    """A rehearsal records its default steps (2 a run for q2, 3 for q1's run), not 0; a
    cluster run the launchers'."""
    from rescue.stages import Runner

    recorded = []
    src = fake_sources(tmp_path)
    # a runner that records the settings and runs nothing (a failure: nothing to print)
    monkeypatch.setattr(Runner, "run", lambda self: recorded.append(self.settings) or 1)
    rescue_main(["question", "q2", "--run-dir", str(tmp_path / "a"), "--rehearsal", *src])
    rescue_main(["question", "q2", "--run-dir", str(tmp_path / "b"), "--rehearsal", "--steps", "7",
                 *src])  # fmt: skip
    rescue_main(["question", "q1", "--run-dir", str(tmp_path / "d"), "--rehearsal", *src])
    assert [r["STEPS"] for r in recorded] == [chains.REHEARSAL_STEPS["q2"], 7,
                                             chains.REHEARSAL_STEPS["q1"]]  # fmt: skip
    assert recorded[0]["SEEDS"] == chains.REHEARSAL_SEEDS["q2"] == 2
    with cluster_machine(tmp_path):
        rescue_main(["question", "q2", "--run-dir", str(tmp_path / "c"), "--power-noise",
                     "synthetic"])  # fmt: skip
    assert recorded[-1]["STEPS"] == "NUM_ROLLOUT of the launchers"


@pytest.mark.parametrize("question", ["q2", "q3"])
def test_fewer_seeds_than_the_judge_needs_are_refused_before_anything_runs(
    tmp_path, capsys, question
):
    run = tmp_path / question
    argv = ["question", question, "--run-dir", str(run), "--seeds", "2"]
    if question == "q3":
        (tmp_path / "gate.json").write_text(json.dumps({"go": True}))
        argv += ["--q2-dir", str(tmp_path)]
    with cluster_machine(tmp_path):  # past the machine's check: GPUs and Miles are there
        assert rescue_main(argv) == 2 and not run.exists()
    err = capsys.readouterr().err
    named = "P3" if question == "q2" else "P5"
    assert err.count("\n") == 1 and named in err and "SEEDS=2" in err and "FORCE=1" in err


def test_forced_few_seeds_print_the_line_and_reach_the_sweep(tmp_path, capsys):
    import argparse

    assert power_first("q2", 2, argparse.Namespace(rehearsal=False, force=True)) is True
    out = capsys.readouterr().out
    assert "decides nothing" in out and "FORCE=1" in out
    train = next(st for st in chains.q2(chains.Settings(tmp_path, seeds=2, force=True))
                 if st.name == "train")  # fmt: skip
    assert "FORCE=1" in train.command and "SEEDS=2" in train.command
    train = next(st for st in chains.q2(chains.Settings(tmp_path, seeds=3)) if st.name == "train")
    assert not any(w.startswith("FORCE=") for w in train.command)


def test_the_power_line_comes_first_and_a_rehearsal_is_not_refused(capsys):
    import argparse

    assert power_first("q2", 2, argparse.Namespace(rehearsal=True, force=False)) is False
    assert "q2: power" in capsys.readouterr().out
    power_first("q3", 3, argparse.Namespace(rehearsal=False, force=False, power_noise="synthetic"))
    line = capsys.readouterr().out
    assert "SEEDS=3 per arm" in line and "P5" in line and "P6" in line and " / " in line


def test_the_cluster_chain_of_q2_runs_the_launchers_with_the_run_folders_paths(tmp_path):
    s = chains.Settings(tmp_path, seeds=5)
    stages = {st.name: st for st in chains.q2(s)}
    assert list(stages) == ["prepare", "calibrate", "train", "wait", "collect", "report", "gate"]
    assert stages["prepare"].command[:3] == ("make", "--no-print-directory", "rlvr-prepare")
    assert f"PROMPT_DATA={tmp_path}/data/prompts.jsonl" in stages["calibrate"].command
    train = stages["train"].command
    assert train[2] == "rlvr-sweep" and "SWEEP_WATCH=0" in train and "SEEDS=5" in train
    assert f"SWEEP_DIR={tmp_path}/train" in train and f"CAP_FILE={tmp_path}/cap.json" in train
    assert stages["wait"].command[-4:-2] == ("watch", "--plan") or "watch" in stages["wait"].command
    assert stages["report"].command[3:5] == ("report", f"{tmp_path}/out/rlvr-*/wandb")
    assert not stages["train"].note  # nothing simulated on the cluster


def _rehearsal(tmp_path, **kw) -> chains.Settings:
    return chains.Settings(
        tmp_path, rehearsal=True, rehearsal_python="/r/bin/python", miles_src="/src",
        megatron_src="/meg", **kw,
    )  # fmt: skip


def test_every_rehearsal_trains_through_miles_with_its_launcher_and_nothing_is_simulated(tmp_path):
    launchers = {"q1": ("swe", "never-drop"), "q2": ("rlvr", "zero,mask,matched,step-control,"
                 "drgrpo-mask,survivor,turn"), "q3": ("swe", "drop,never-drop,protect:0.25,protect:0.5,pace")}  # fmt: skip
    for q, (launcher, arms) in launchers.items():
        stages = chains.QUESTIONS[q](_rehearsal(tmp_path, seeds=2))
        train = next(st for st in stages if st.name == "train")
        cmd = train.command
        assert cmd[:3] == ("/r/bin/python", "-m", "rescue.rehearsal.miles"), cmd
        assert cmd[cmd.index("--launcher") + 1] == launcher and cmd[cmd.index("--arm") + 1] == arms
        assert "--replace" in cmd and cmd[cmd.index("--out") + 1] == f"{tmp_path}/train"
        assert cmd[cmd.index("--miles-src") + 1] == "/src"
        assert cmd[cmd.index("--megatron-src") + 1] == "/meg"
        if q != "q1":
            assert cmd[cmd.index("--seeds") + 1] == "2" and "--parallel" in cmd
        assert not any("SIMULATED" in st.note for st in stages if st.name in ("train", "record"))
        assert not any(st.name == "dumps" for st in stages)
    q2 = {st.name: st for st in chains.q2(_rehearsal(tmp_path, steps=5))}
    cmd = q2["train"].command
    assert cmd[cmd.index("--steps") + 1] == "5"
    assert cmd[cmd.index("--cap-file") + 1] == f"{tmp_path}/cap.json"
    assert cmd[cmd.index("--model") + 1] == f"{tmp_path}/model"
    assert list(q2) == ["task", "prepare", "model", "calibrate", "train", "wait", "collect",
                        "report", "gate"]  # fmt: skip
    assert "--model" in q2["calibrate"].command and q2["calibrate"].command[0] == "/r/bin/python"
    assert q2["report"].command[4] == f"{tmp_path}/train/*/runs/*/wandb"
    assert q2["model"].note and "stands in" in q2["model"].note


def test_the_rehearsals_replay_reads_what_its_training_stage_wrote(tmp_path):
    q1 = {st.name: st for st in chains.q1(_rehearsal(tmp_path))}
    assert list(q1) == ["train", "census", "advantages", "gradients", "report"]
    dumps = f"{tmp_path}/train/runs/swe-never-drop-seed1/dumps/rollout_data/*.pt"
    assert q1["census"].command[5] == dumps
    grad = q1["gradients"].command
    assert grad[grad.index("--model") + 1] == f"{tmp_path}/train/checkpoint-hf"
    assert f"{tmp_path}/train/checkpoint-hf" in q1["train"].outputs
    q3 = {st.name: st for st in chains.q3(_rehearsal(tmp_path, force=True))}
    record = q3["record"].command
    assert record[3] == "link"
    assert record[4] == f"{tmp_path}/train/never-drop-seed1/runs/swe-never-drop*-seed1/dumps"
    oracle = q3["oracle-grad"].command
    assert oracle[oracle.index("--model") + 1] == f"{tmp_path}/train/never-drop-seed1/checkpoint-hf"
    assert q3["report"].command[4] == f"{tmp_path}/train/*/runs/*/wandb"


def test_a_rehearsal_without_the_framework_sources_is_refused_naming_the_variable(tmp_path, capsys):
    code = rescue_main(["question", "q1", "--run-dir", str(tmp_path / "q1"), "--rehearsal"])
    assert code == 2 and not (tmp_path / "q1").exists()
    assert "MILES_SRC=''" in capsys.readouterr().err
    (tmp_path / "miles").mkdir()
    (tmp_path / "miles" / "train_async.py").write_text("")
    code = rescue_main(["question", "q1", "--run-dir", str(tmp_path / "q1"), "--rehearsal",
                        "--miles-src", str(tmp_path / "miles"), "--megatron-src", "/nowhere"])  # fmt: skip
    assert code == 2 and "MEGATRON_SRC='/nowhere'" in capsys.readouterr().err


def test_q3_validates_the_pilots_subset_before_the_training_prompts_are_written(tmp_path):
    for rehearsal in (False, True):
        settings = _rehearsal(tmp_path) if rehearsal else chains.Settings(tmp_path)
        stages = {st.name: st for st in chains.q3(settings)}
        names = list(stages)
        assert names.index("pilot") < names.index("validate") < names.index("subset")
        validated = f"{tmp_path}/validate/subset.txt"
        assert stages["validate"].outputs == (validated,)
        assert stages["subset"].inputs == (validated,)
        subset = stages["subset"].command
        assert subset[subset.index("--subset") + 1] == validated
        command = stages["validate"].command
        if rehearsal:
            assert command[3] == "validate" and stages["validate"].note.startswith("SIMULATED")
        else:
            assert command[:3] == ("make", "--no-print-directory", "swe-validate")
            assert f"VALIDATE_OUT={tmp_path}/validate" in command
            assert f"SUBSET_FILE={tmp_path}/pilot/subset.txt" in command


def test_q1_needs_dumps_and_a_model_on_the_cluster(tmp_path):
    with pytest.raises(InputError, match="DUMPS=DIR"):
        chains.q1(chains.Settings(tmp_path))
    with pytest.raises(InputError, match="MODEL=PATH"):
        chains.q1(chains.Settings(tmp_path, dumps="d"))
    stages = chains.q1(chains.Settings(tmp_path, dumps="d", model="m"))
    assert [s.name for s in stages] == ["census", "advantages", "gradients", "report"]
    assert stages[2].command[-3:] == ("--model", "m", "--json")


#: Folders standing in for the Miles and Megatron-LM sources (make checks they are folders).
_SRC = {"MILES_SRC": "launch", "MEGATRON_SRC": "docs"}


@pytest.mark.parametrize(
    ("target", "variables", "expected"),
    [
        ("q2", {}, "question q2 --run-dir runs/q2"),
        (
            "q2",
            {"REHEARSAL": "1", **_SRC},
            "question q2 --run-dir runs/q2-rehearsal --rehearsal --rehearsal-python "
            '.venv-rehearsal/bin/python --miles-src "launch" --megatron-src "docs"',
        ),
        ("q2", {"RUN_DIR": "r", "SEEDS": "4", "STEPS": "7"}, "--run-dir r --seeds 4 --steps 7"),
        ("q3", {"REHEARSAL": "1", **_SRC}, "--q2-dir runs/q2-rehearsal"),
        ("q3", {"Q2_DIR": "x", "FORCE": "1"}, "--q2-dir x --force"),
        ("q1", {"DUMPS": "d", "MODEL": "m"}, "--dumps d --model m"),
    ],
)
def test_the_make_targets_pass_their_variables(target, variables, expected):
    import re
    import subprocess

    argv = [
        "make",
        "-n",
        "--no-print-directory",
        target,
        *(f"{k}={v}" for k, v in variables.items()),
    ]
    out = subprocess.run(argv, cwd=chains.REPO, capture_output=True, text=True, check=True).stdout
    line = re.sub(r"\s+", " ", out)
    assert expected in line, line
    if "FORCE" not in variables:
        assert "--force" not in line


def test_q3s_summary_states_p6s_cost_per_unit_of_improvement():
    from rescue.questions.cli import p6_costs

    report = {"cohorts": [{"results": [
        {"id": "P5", "checks": [{"name": "x per unit of reward improvement"}]},
        {"id": "P6", "checks": [
            {"name": "final success, protect-a0.5 − never-drop (within seed noise)",
             "estimate": {"value": 0.1, "lo": -0.2, "hi": 0.4, "n": 2}},
            {"name": "wall-clock per unit of reward improvement, a − b",
             "estimate": {"value": 12.5, "lo": 3.0, "hi": 22.0, "n": 2}},
            {"name": "sandbox seconds per unit of reward improvement, a − b",
             "estimate": None, "reason": "no improvement in the window"},
        ]},
    ]}]}  # fmt: skip
    assert p6_costs(report) == [
        "q3: P6 cost: wall-clock per unit of reward improvement, a − b: 12.5 [3, 22] (n=2)",
        "q3: P6 cost: sandbox seconds per unit of reward improvement, a − b: n/a; no "
        "improvement in the window",
    ]
    assert p6_costs({"cohorts": []}) == []
