"""Every bad input to the ``rescue`` command is one line naming the flag (or the file) and
what is allowed, exit status 2, never a traceback.

Enumerated from the command itself: every flag of every subcommand whose value is a number
(each has a ``rescue.flags`` range, so a value outside it is refused while parsing), every
setting of ``rescue sim`` with negative, zero, non-numeric, NaN and huge values (run on a
tiny simulation when accepted), and every input path a command reads, missing or not what
it should be. The make variables are ``tests/test_make_variables.py``'s.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from rescue import cli
from rescue.flags import Range


def parsers(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's parser, with the words that reach it."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*prefix, name))


def number_flags() -> list[tuple[tuple[str, ...], str, object]]:
    out = []
    for prefix, parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if action.option_strings and action.type is not None:
                out.append((prefix, action.option_strings[0], action.type))
    return out


FLAGS = number_flags()
RANGED = [(p, f, t) for p, f, t in FLAGS if isinstance(t, Range)]


def outside(r: Range) -> list[str]:
    """Values outside ``r``: below, above, not a number of its kind, NaN."""
    values = ["abc", "", "nan", "inf"]
    if r.low is not None:
        values.append(f"{r.low:g}" if r.low_open else f"{r.low - 1:g}")
    if r.high is not None:
        values.append(f"{r.high:g}" if r.high_open else f"{r.high + 1:g}")
    if r.kind is int:
        values.append(f"{(r.low if r.low is not None else 0) + 1.5:g}")
    return values


def one_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"rescue {command}"), lines[0]
    return lines[0]


def test_every_number_flag_of_the_command_states_its_range():
    bare = [f"rescue {' '.join(p)} {f}" for p, f, t in FLAGS if t in (int, float)]
    assert bare == []  # a bare int or float would take -1, 0 or NaN where they mean nothing
    assert len(RANGED) >= 40  # the collector found them (sim, replay, rlvr, swe, agent, ...)


@pytest.mark.parametrize(
    ("prefix", "flag", "kind"), RANGED, ids=[f"{' '.join(p)} {f}" for p, f, _ in RANGED]
)
def test_a_number_outside_its_range_is_one_line_naming_the_flag_and_what_is_allowed(
    prefix, flag, kind, capsys
):
    for value in outside(kind):
        assert cli.main([*prefix, flag, value]) == 2, (flag, value)
        line = one_line(capsys, prefix[0])
        assert f"argument {flag}: {value!r}: allowed {kind.allowed()}" in line


def test_the_issues_examples():
    """`--first-seed -1` was a 46-line traceback."""
    assert Range(int, 0)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"'-1': allowed an integer >= 0"):
        Range(int, 0)("-1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"allowed a number in \(0, 1\]"):
        Range(float, 0, 1, low_open=True)("0")
    assert math.isclose(Range(float, 0, 1, low_open=True)("1"), 1.0)


def sim_settings() -> list[str]:
    from rescue.sim.config import settings

    return [
        s.flag for s in settings() if s.kind.base in ("int", "float", "ints", "floats", "pairs")
    ]


@pytest.mark.parametrize("flag", sim_settings())
def test_every_simulator_setting_takes_a_bad_value_in_one_line(flag, tmp_path, capsys):
    """Refused in one line naming the setting, or (when the value is allowed) a tiny run
    that finishes: never a traceback."""
    tiny = ["sim", "--arms", "zero,mask", "--steps", "3", "--seeds", "1", "--groups-per-step",
            "2", "--group-size", "2", "--no-wandb", "--no-plots", "--no-progress",
            "--workers", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    for value in ("-1", "0", "abc", "nan", "1e9", ""):
        code = cli.main([*tiny, flag, value])
        assert code in (0, 2), (flag, value, code)
        if code == 2:
            assert flag in one_line(capsys, "sim"), (flag, value)
        else:
            capsys.readouterr()


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    (tmp_path / "empty").write_text("")
    (tmp_path / "garbage.pt").write_text("garbage\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "miles").mkdir()
    (tmp_path / "miles" / "train_async.py").write_text("")
    (tmp_path / "megatron" / "megatron" / "training").mkdir(parents=True)
    (tmp_path / "q2").mkdir()
    (tmp_path / "q2" / "stages.json").write_text('{"stages": []}')
    return {
        "stages": str(tmp_path / "q2" / "stages.json"),
        "miles": str(tmp_path / "miles"),
        "megatron": str(tmp_path / "megatron"),
        "none": str(tmp_path / "nosuch"),
        "empty": str(tmp_path / "empty"),
        "garbage": str(tmp_path / "garbage.pt"),
        "folder": str(tmp_path / "folder"),
        "out": str(tmp_path / "out"),
    }


PATH_CASES = [
    (["identity", "--table", "{none}"], "--table"),
    (["identity", "--table", "{empty}"], "--table"),
    (["sim", "--scenario-file", "{none}"], "--scenario-file"),
    (["sim", "--arms", "zero", "--out", "{empty}"], "--out"),
    (["report", "{none}"], "RUNS"),
    (["report", "{empty}"], "RUNS"),
    (["report", "{folder}", "--out", "{empty}"], "--out"),
    (["replay", "census", "{none}"], "dump"),
    (["replay", "advantages", "{folder}/*.pt"], "dump"),
    (["replay", "gradients", "{none}", "--model", "tiny-gpt2"], "dump"),
    (["oracle", "build", "{none}"], "dump"),
    (["oracle", "compare", "{folder}"], "oracle.json"),
    (["status", "{none}"], "stages.json"),
    (["status", "{folder}"], "stages.json"),
    (["status", "{stages}"], "is a file: give the run folder"),
    (["status", "{empty}"], "is a file: give the run folder"),
    (["sim", "--arms", "zero", "--out", "{empty}/sim"], "--out"),
    (["report", "{folder}", "--out", "{empty}/report"], "--out"),
    (["power", "--json", "{empty}/p.json"], "--json"),
    (["power", "--json", "{folder}"], "--json"),
    (["question", "q1", "--run-dir", "{out}", "--dumps", "{none}", "--model", "tiny-gpt2"], "DUMPS"),
    (["question", "q1", "--run-dir", "{out}", "--dumps", "{folder}", "--model", "m"], "DUMPS"),
    (["question", "q3", "--run-dir", "{out}", "--rehearsal", "--q2-dir", "{none}"], "MILES_SRC"),
    (["question", "q3", "--run-dir", "{out}", "--rehearsal", "--q2-dir", "{none}",
      "--miles-src", "{miles}", "--megatron-src", "{none}"], "MEGATRON_SRC"),
    (["question", "q3", "--run-dir", "{out}", "--rehearsal", "--q2-dir", "{none}",
      "--miles-src", "{miles}", "--megatron-src", "{megatron}"], "gate"),
    (["rlvr", "prepare", "--dataset", "gsm8k", "--source", "{none}.jsonl", "--out", "{out}"], "input"),
    (["rlvr", "cap", "{none}"], "cap file"),
    (["rlvr", "cap", "{empty}"], "cap file"),
    (["rlvr", "watch", "--plan", "{none}", "--address", "http://127.0.0.1:9"], "--plan"),
    (["rlvr", "calibrate", "--data", "{none}", "--model", "m", "--base-url",
      "http://127.0.0.1:9", "--caps", "8 16", "--out", "{out}"], "--data"),
    (["swe", "prepare", "--source", "{none}.jsonl", "--out", "{out}"], "input"),
    (["swe", "pilot", "--tasks", "{none}", "--summarize-only", "--out", "{out}"], "tasks"),
    (["swe", "validate", "--tasks", "{none}", "--out", "{out}"], "tasks"),
    (["agent", "prepare", "--env", "alfworld", "--data-dir", "{none}", "--out", "{out}"], "ALFWorld"),
    (["agent", "prepare", "--env", "cooking", "--out", "{out}"], "--games-dir"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "named"), PATH_CASES, ids=[f"{' '.join(a[:2])}-{named}" for a, named in PATH_CASES]
)
def test_a_missing_or_wrong_input_is_one_line_naming_it(argv, named, files, capsys):
    argv = [a.format(**files) for a in argv]
    assert cli.main(argv) == 2
    assert named in one_line(capsys, argv[0])
    assert not Path(files["out"]).exists()  # nothing written


@pytest.mark.parametrize("which", ["empty", "garbage"])
@pytest.mark.parametrize("command", ["replay census", "oracle build --out {out}"])
def test_a_file_that_is_no_dump_is_one_line(command, which, files, capsys):
    pytest.importorskip("torch")
    words = command.format(**files).split()
    assert cli.main([*words[:2], files[which], *words[2:]]) == 2
    assert "not a torch.save file" in one_line(capsys, words[0])
    assert not Path(files["out"]).exists()


@pytest.mark.parametrize(("device", "said"), [("cuda", "no cuda device"), ("gpu0", "not a torch")])
def test_a_device_this_machine_lacks_is_one_line(device, said, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from rescue.replay.synthetic import synthetic_step

    torch.save(synthetic_step(rollout_id=0, seed=1), tmp_path / "d.pt")
    argv = ["replay", "gradients", str(tmp_path / "d.pt"), "--model", "tiny-gpt2"]
    assert cli.main([*argv, "--device", device]) == 2
    assert f"--device '{device}': {said}" in one_line(capsys, "replay")


def test_a_missing_extra_is_one_line_saying_how_to_install_it(files, capsys, monkeypatch):
    """`make test` does not install the [agent] extra: the text games' commands say so."""
    import sys

    leaf = "alfworld.agents.environment.alfred_tw_env"
    for name in ("alfworld", "alfworld.agents", "alfworld.agents.environment", leaf):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    argv = ["agent", "prepare", "--env", "alfworld", "--data-dir", files["folder"]]
    assert cli.main([*argv, "--out", files["out"]]) == 2
    assert "ALFWorld is not installed: pip install -e '.[agent]'" in one_line(capsys, "agent")
