"""The config table: every setting is a flag with help and default, and no flag is ignored."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from rescue import cli
from rescue.sim import SimConfig
from rescue.sim.cli import config_from_args
from rescue.sim.config import settings

LOGITS = [list(r) for r in SimConfig().initial_logits]
LOGITS[0] = [0.0, 1.0, 0.0]
#: A value other than the default for every setting (a new setting must be added here).
NEW = {
    "steps": 5,
    "groups_per_step": 3,
    "group_size": 3,
    "concurrency": 3,
    "buffer_capacity": 5,
    "train_time": 9.0,
    "max_staleness": 0,
    "pace_window": 17,
    "lr": 0.7,
    "std_normalize": False,
    "baseline_scope": "batch",
    "kappa": 0.5,
    "subsidy": True,
    "tis": False,
    "tis_clip": 1.1,
    "score_centering": False,
    "episodes": "table",
    "max_turns": 13,
    "infra_rate": 0.2,
    "submit_failure": False,
    "difficulty": ((2, 0.5), (4, 0.5)),
    "blind_edit": (0.3, 0.3),
    "informed_edit": (0.9, 0.0),
    "turn_time": (2.0, 1.0, 0.5),
    "context_growth": 0.2,
    "time_noise": 0.0,
    "table_success": (0.2, 0.3),
    "table_turns": (2, 3, 4, 5),
    "table_late": 0.5,
    "table_late_turns": 9,
    "initial_logits": tuple(tuple(r) for r in LOGITS),
}
TABLE = {s.name: s for s in settings()}


def test_every_field_is_a_setting_with_help_a_kind_and_a_value_to_test():
    assert [f.name for f in fields(SimConfig)] == list(TABLE) == list(NEW)
    for s in TABLE.values():
        assert s.help and s.kind.describe() and s.group
        assert NEW[s.name] != s.default


def test_help_lists_every_flag_with_its_default(capsys):
    assert cli.main(["sim", "--help"]) == 0
    text = "".join(capsys.readouterr().out.split())  # argparse wraps long values anywhere
    for s in TABLE.values():
        flag = s.flag if s.kind.base != "bool" else f"{s.flag},--no-{s.flag[2:]}"
        assert flag in text, flag
        assert f"(default:{s.kind.show(s.default)})".replace(" ", "") in text


def parse(*argv: str):
    return cli.build_parser().parse_args(["sim", *argv])


@pytest.mark.parametrize("name", list(NEW))
def test_a_flag_sets_its_setting(name):
    s, value = TABLE[name], NEW[name]
    if s.kind.base == "bool":
        argv = [s.flag if value else f"--no-{s.flag[2:]}"]
    else:
        argv = [s.flag, s.kind.show(value)]
    extra = ["--max-turns", "40"] if name in ("episodes",) else []
    cfg = config_from_args(parse(*argv, *extra))
    assert getattr(cfg, name) == value
    assert getattr(config_from_args(parse(*extra)), name) == s.default


TINY = ["--steps", "6", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
        "--max-turns", "12", "--seeds", "1", "--workers", "1", "--no-wandb", "--no-plots",
        "--no-progress"]  # fmt: skip
#: Where a setting shows: the arm and other settings it acts through.
CONTEXT = {
    "buffer_capacity": ["--concurrency", "16"],
    "max_staleness": ["--arm", "drop"],
    "pace_window": ["--arm", "pace", "--concurrency", "16", "--max-staleness", "4"],
    "kappa": ["--arm", "turn-baseline"],
    "tis": ["--lr", "3"],
    "tis_clip": ["--lr", "3"],
    "score_centering": ["--lr", "3"],
    "episodes": ["--max-turns", "40"],
    **{n: ["--episodes", "table", "--max-turns", "40"] for n in NEW if n.startswith("table_")},
}


def run_lines(tmp_path: Path, argv: list[str]) -> list[dict]:
    out = tmp_path / "out"
    assert cli.main(["sim", "--out", str(out), *TINY, *argv]) == 0
    (path,) = (out / "census").glob("*.jsonl")
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("name", list(NEW))
def test_no_setting_is_ignored_by_the_simulation(tmp_path, name):
    s, value = TABLE[name], NEW[name]
    context = CONTEXT.get(name, ["--arm", "zero"])
    if "--arm" not in context:
        context = [*context, "--arm", "zero"]
    flag = [s.flag if value else f"--no-{s.flag[2:]}"] if s.kind.base == "bool" else [
        s.flag, s.kind.show(value)]  # fmt: skip
    base = run_lines(tmp_path / "a", context)
    changed = run_lines(tmp_path / "b", [*context, *flag])
    assert base != changed


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--difficulty", "1:0.5"], "--difficulty"),
        (["--blind-edit", "0.8,0.3"], "--blind-edit"),
        (["--episodes", "table", "--table-late-turns", "50"], "--table-late-turns"),
        (["--table-late", "2"], "--table-late"),
        (["--tis-clip", "-1"], "--tis-clip"),
        (["--pace-window", "-1"], "--pace-window"),
        (["--pace-window", "3"], "from one batch (4) to 8"),
        (["--pace-window", "9"], "from one batch (4) to 8"),
        (["--subsidy", "--episodes", "table", "--max-turns", "40"], "--subsidy"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_flag(tmp_path, capsys, argv, named):
    assert cli.main(["sim", "--out", str(tmp_path), *TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "allowed" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--turn-time", "1,2"], "--turn-time"),
        (["--episodes", "agents"], "agent, table"),
        (["--difficulty", "1-0.5"], "k:probability pairs"),
        (["--initial-logits", "0,0"], "rows of 3 numbers"),
    ],
)
def test_a_value_of_the_wrong_shape_is_refused_by_the_parser(capsys, argv, named):
    assert cli.main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1  # one line, no usage block
    assert named in err and argv[0] in err


def test_the_shown_default_reads_back_as_the_default():
    for s in TABLE.values():
        if s.kind.base != "bool":
            assert s.kind.from_text(s.kind.show(s.default), s.name) == s.default
