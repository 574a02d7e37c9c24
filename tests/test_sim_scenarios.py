"""Scenarios: the presets, scenario files of one's own, and how they meet the flags."""

import json
from importlib import resources
from pathlib import Path

import pytest

from rescue import cli
from rescue.sim import SimConfig
from rescue.sim import scenario as sc
from rescue.sim.arms import parse_arms

TINY = ["--steps", "3", "--seeds", "1", "--workers", "1", "--no-wandb", "--no-plots",
        "--no-progress"]  # fmt: skip


def test_the_presets_are_the_files_shipped_with_the_package():
    shipped = sorted(
        f.name for f in resources.files("rescue.sim").joinpath(sc.PRESETS).iterdir()
        if f.name.endswith(".toml")
    )  # fmt: skip
    assert shipped == sorted(f"{n}.toml" for n in sc.names())
    assert sc.names() == ["fast-thorough", "budget-three-outcome", "two-outcome", "swe-like"]


@pytest.mark.parametrize("name", sc.names())
def test_each_preset_says_what_it_isolates_and_runs_valid_arms(name):
    s = sc.preset(name)
    assert s.name == name and s.title and s.isolates and s.expect and s.regime in "AB-"
    assert parse_arms(",".join(s.arms))
    assert isinstance(s.sim_config(), SimConfig)


def test_the_presets_set_what_their_mechanism_needs():
    ft, budget, two, swe = (sc.preset(n).sim_config() for n in sc.names())
    assert ft.episodes == "table" and ft.group_size == 1 and ft.baseline_scope == "batch"
    assert budget.submit_failure and not two.submit_failure and not two.std_normalize
    assert budget.subsidy and not swe.subsidy  # the budget scenario logs the exact subsidy
    assert swe == SimConfig()  # swe-like is the defaults, written out
    assert ft.tis and swe.tis  # the async scenarios correct stale rollouts as the cluster does


def test_scenarios_lists_the_presets(capsys):
    assert cli.main(["sim", "--scenarios"]) == 0
    out = capsys.readouterr().out
    for name in sc.names():
        assert f"{name} (regime" in out
    assert "isolates:" in out


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "mine.toml"
    p.write_text(text)
    return p


def test_a_scenario_file_takes_flag_names_with_dashes_or_underscores(tmp_path):
    p = write(tmp_path, 'arms = ["zero", "mask"]\n[config]\nmax-turns = 9\ngroup_size = 3\n')
    s = sc.load_file(p)
    assert (s.name, s.arms) == ("mine", ("zero", "mask"))
    assert s.sim_config().max_turns == 9 and s.sim_config().group_size == 3


@pytest.mark.parametrize(
    "text, named",
    [
        ("[config]\nmax-turn = 9\n", "max-turn is not a setting"),
        ("[config]\nmax-turns = 'nine'\n", "--max-turns"),
        ("[config]\ndifficulty = [[1, 0.5]]\n", "--difficulty"),
        ("arms = ['drop', 'keep']\n", "arms: arm='keep'"),
        ("regime = 'C'\n", "regime='C'"),
        ("colour = 1\n", "unknown key(s) colour"),
        ("[config\n", "not valid TOML"),
    ],
)
def test_a_bad_scenario_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, named):
    p = write(tmp_path, text)
    assert cli.main(["sim", "--scenario-file", str(p), "--out", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and named in err and "Traceback" not in err


def config_of(capsys, *argv: str) -> str:
    assert cli.main(["sim", *argv, "--print-scenario"]) == 0
    return capsys.readouterr().out


def test_flags_override_the_file_and_the_file_overrides_the_defaults(tmp_path, capsys):
    p = write(tmp_path, "[config]\nmax-turns = 9\nlr = 0.5\n")
    text = config_of(capsys, "--scenario-file", str(p), "--lr", "0.25")
    assert "max-turns = 9\n" in text and "lr = 0.25\n" in text and "kappa = 2.0\n" in text


def test_print_scenario_writes_a_file_that_reads_back_the_same(tmp_path, capsys):
    text = config_of(capsys, "--scenario", "fast-thorough", "--steps", "7")
    back = sc.load_file(write(tmp_path, text))
    assert back.sim_config() == sc.preset("fast-thorough").sim_config(steps=7)
    assert back.arms == sc.preset("fast-thorough").arms


def test_arms_override_the_scenarios_arms(tmp_path):
    out = tmp_path / "o"
    argv = ["sim", "--scenario", "two-outcome", "--arms", "zero", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    assert {p.name for p in (out / "census").iterdir()} == {"zero-seed0.jsonl"}


def test_scenario_all_runs_each_preset_into_its_folder_with_an_index(tmp_path):
    out = tmp_path / "o"
    assert cli.main(["sim", "--scenario", "all", "--out", str(out), *TINY]) == 0
    for name in sc.names():
        census = {p.name for p in (out / name / "census").iterdir()}
        assert census == {
            f"{a.label}-seed0.jsonl" for a in parse_arms(",".join(sc.preset(name).arms))
        }
        summary = (out / name / "summary.md").read_text()
        assert f"Scenario **{name}**" in summary and "## Verdicts" in summary
        cfg = sc.preset(name).sim_config(steps=3)
        first = json.loads((out / name / "census" / census.pop()).read_text().splitlines()[0])
        assert first["rollout/census/rollouts"] == cfg.groups_per_step * cfg.group_size
    index = (out / "summary.md").read_text()
    assert index.count("| prediction | arms | verdict | alone |") == 4
    assert index.count("Family-wise rule: Holm's step-down") == 1
    for name in sc.names():
        assert f"## {name}" in index and f"`{name}/`" in index
    ft = index[index.index("## fast-thorough") : index.index("## budget-three-outcome")]
    assert "- final P(thorough), drop − never-drop: " in ft  # the construction, with its interval
    # rescue report reads a scenario's output, the protect variant included, in protect's roles
    report = tmp_path / "report"
    assert cli.main(["report", str(out / "fast-thorough"), "--out", str(report), "--no-plots",
                     "--no-progress"]) == 0  # fmt: skip
    data = json.loads((report / "report.json").read_text())
    p6 = [r["binding"]["protect-0.5"] for r in data["cohorts"][0]["results"] if r["id"] == "P6"]
    assert p6 == ["protect-a0.5", "protect-a0.5-wnorm"]


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--scenario", "fast"], "allowed: fast-thorough, budget-three-outcome"),
        (["--scenario", "two-outcome,two-outcome"], "distinct names"),
        (["--scenario-file", "/nonexistent/x.toml"], "--scenario-file /nonexistent/x.toml"),
    ],
)
def test_a_bad_scenario_is_one_line(tmp_path, capsys, argv, named):
    assert cli.main(["sim", *argv, "--out", str(tmp_path), *TINY]) == 2
    assert named in capsys.readouterr().err
