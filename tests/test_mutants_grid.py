"""``rescue.sim.grid``: what a grid file records and what it refuses, read from outside.

The grid's sha256 recomputed from the file's bytes, the cells' order written out by hand
(first axis slowest), each refusal's whole line, the labels a value gets, the description's
counts worked out by hand, and a placement whose thresholds are not 0 (where a rule that
ignored them would agree).
"""

from __future__ import annotations

import hashlib

import pytest

from rescue.errors import InputError
from rescue.sim import grid as gd

GRID = """title = "two by three"
base = "two-outcome"
arms = ["zero", "mask"]
seeds = 3
first-seed = 4
rule = "a rule in words"
[placement]
steps = 6
min-ratio = 1.5
min-b = 0.25
[config]
groups-per-step = 4
[[axis]]
setting = "lr"
what = "the step size"
values = [0.1, 0.2]
[[axis]]
setting = "max_turns"
labels = ["short", "mid", "long"]
values = [6, 8, 10]
"""


def grid(text: str = GRID, where: str = "g.toml") -> gd.Grid:
    return gd.parse(text, where=where)


def refusal(text: str) -> str:
    with pytest.raises(InputError) as e:
        grid(text)
    return str(e.value)


def test_a_grid_records_its_file_its_hash_and_its_settings():
    g = grid()
    assert g.text == GRID and g.source == "g.toml"
    assert g.sha256 == hashlib.sha256(GRID.encode()).hexdigest()
    assert (g.title, g.base, g.rule) == ("two by three", "two-outcome", "a rule in words")
    assert [a.label for a in g.arms] == ["zero", "mask"] and g.seeds == (4, 5, 6)
    assert g.placement == gd.Placement(6, 1.5, 0.25)
    assert type(g.placement.steps) is int and type(g.placement.min_ratio) is float
    assert g.config == {"groups_per_step": 4}
    assert [(a.setting, a.what, a.values, a.labels) for a in g.axes] == [
        ("lr", "the step size", (0.1, 0.2), ("0.1", "0.2")),
        ("max_turns", "", (6, 8, 10), ("short", "mid", "long")),
    ]
    assert gd.names(g) == ["lr", "max_turns"]
    assert gd.axis_index(g, "max_turns") == 1 and gd.axis_index(g, "lr") == 0
    assert gd.axis_index(g, "steps") is None


def test_the_cells_are_every_combination_first_axis_slowest():
    g = grid()
    cells = g.cells()
    assert [c.index for c in cells] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [(c.config.lr, c.config.max_turns) for c in cells] == [
        (0.1, 6), (0.1, 8), (0.1, 10), (0.2, 6), (0.2, 8), (0.2, 10)]  # fmt: skip
    assert all(c.config.groups_per_step == 4 and c.simulated == c.config for c in cells)
    assert cells[4].label(g) == "lr 0.2, max_turns mid"
    assert gd.values_of(g, cells[4]) == {"lr": "0.2", "max_turns": "mid"}


def test_a_steps_axis_simulates_each_cell_at_its_longest_value():
    g = grid(GRID + '[[axis]]\nsetting = "steps"\nvalues = [3, 9, 5]\n')
    cells = g.cells()
    assert len(cells) == 18 and {c.simulated.steps for c in cells} == {9}
    assert [c.config.steps for c in cells[:3]] == [3, 9, 5]
    said = gd.describe(g)
    assert said[:2] == ["- lr (the step size): 0.1, 0.2", "- max_turns: short, mid, long"]
    assert said[2] == "- steps: 3, 9, 5"
    assert said[3] == (
        "- 18 cells × 2 arms (zero, mask) × 3 seeds (4-6); 36 runs simulated (a shorter run "
        "length is the first steps of the longest)"
    )


def test_describe_without_a_steps_axis_simulates_every_cell():
    said = gd.describe(grid())
    assert said[-1].startswith("- 6 cells × 2 arms (zero, mask) × 3 seeds (4-6); 36 runs")


def test_a_value_s_label_is_its_shortest_form():
    text = GRID.replace('setting = "lr"\nwhat = "the step size"\nvalues = [0.1, 0.2]',
                        'setting = "difficulty"\nvalues = [[[1, 0.5], [2, 0.5]], [[3, 1.0]]]')  # fmt: skip
    g = grid(text)
    assert g.axes[0].labels == ("1,0.5,2,0.5", "3,1")


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ('title = "two by three"', 'colour = "red"',
         "g.toml: unknown key(s) colour; allowed: title, base, arms, seeds, first-seed, rule, "
         "placement, config, axis"),
        ('base = "two-outcome"', 'base = "nowhere"', "g.toml: base='nowhere'; allowed: "),
        ('arms = ["zero", "mask"]', 'arms = "zero,mask"',
         'g.toml: arms must be a list of arm names, e.g. ["zero", "mask"]'),
        ('arms = ["zero", "mask"]', 'arms = ["zero", 3]',
         'g.toml: arms must be a list of arm names, e.g. ["zero", "mask"]'),
        ('arms = ["zero", "mask"]', 'arms = ["zero", "nothing"]', "g.toml: arms: "),
        ('arms = ["zero", "mask"]', 'arms = ["zero", "matched"]',
         "g.toml: arms must include mask (P3 compares them)"),
        ("seeds = 3", "seeds = 0",
         "g.toml: seeds=0, first-seed=4; allowed: seeds >= 1, first-seed >= 0"),
        ("first-seed = 4", "first-seed = -1",
         "g.toml: seeds=3, first-seed=-1; allowed: seeds >= 1, first-seed >= 0"),
        ("seeds = 3", 'seeds = "3"', "g.toml: seeds='3', first-seed=4; allowed"),
        ("groups-per-step = 4", "colour = 4", "g.toml: [config]: 'colour' is not a setting; allowed: "),
        ("groups-per-step = 4", "groups-per-step = true",
         "g.toml: [config]: --groups-per-step=True; allowed: "),
        ("groups-per-step = 4", "groups-per-step = 0",
         "g.toml: a cell's settings: --groups-per-step=0; allowed: an integer >= 1"),
        ('setting = "lr"\n', 'setting = "lr"\ncolour = 1\n',
         "g.toml: [[axis]] 1: unknown key(s) colour; allowed: setting, what, labels, values"),
        ("values = [6, 8, 10]", "values = []",
         "g.toml: [[axis]] 2 (max_turns): values must be a non-empty list"),
        ("values = [6, 8, 10]", "values = 6",
         "g.toml: [[axis]] 2 (max_turns): values must be a non-empty list"),
        ("values = [6, 8, 10]", 'values = [6, "8", 10.5]',
         "g.toml: [[axis]] 2 (max_turns): --max-turns=10.5; allowed: "),
        ('labels = ["short", "mid", "long"]', 'labels = ["short", "mid"]',
         "g.toml: [[axis]] 2 (max_turns): labels must name each value once"),
        ('labels = ["short", "mid", "long"]', 'labels = ["short", "mid", 3]',
         "g.toml: [[axis]] 2 (max_turns): labels must name each value once"),
        ('setting = "max_turns"', 'setting = "lr"',
         "g.toml: [[axis]] 2: lr is set twice (an axis and [config] or two axes)"),
        ('setting = "max_turns"', 'setting = "groups-per-step"',
         "g.toml: [[axis]] 2: groups_per_step is set twice (an axis and [config] or two axes)"),
        ("min-b = 0.25", "", "g.toml: [placement] needs exactly steps, min-ratio, min-b"),
        ("min-b = 0.25", 'min-b = "high"',
         "g.toml: [placement]: steps an integer, min-ratio and min-b numbers"),
        ("[placement]\nsteps = 6\nmin-ratio = 1.5\nmin-b = 0.25", "placement = 3",
         "g.toml: [placement] needs exactly steps, min-ratio, min-b"),
    ],
)  # fmt: skip
def test_each_bad_grid_is_refused_naming_the_file_the_place_and_what_is_allowed(old, new, said):
    assert old in GRID
    assert refusal(GRID.replace(old, new, 1)).startswith(said)


def test_a_config_that_is_not_a_table_is_refused():
    text = GRID.replace("[config]\ngroups-per-step = 4\n", "").replace(
        'rule = "a rule in words"\n', 'rule = "a rule in words"\nconfig = 3\n'
    )
    assert refusal(text) == "g.toml: [config] must be a table of settings"


def test_a_grid_without_an_axis_is_refused():
    text = GRID[: GRID.index("[[axis]]")]
    assert refusal(text) == "g.toml: no [[axis]]; a map needs at least one axis"


def test_a_cell_s_impossible_combination_is_refused_naming_the_file():
    # every value is valid alone; a cell's settings together are checked too
    said = refusal(GRID.replace('setting = "lr"', 'setting = "baseline-scope"').replace(
        "values = [0.1, 0.2]", 'values = ["group", "batch"]').replace(
        "[config]\n", "[config]\nsubsidy = true\n"))  # fmt: skip
    assert said.startswith("g.toml: a cell's settings: ") and "--subsidy" in said


def test_the_defaults_of_a_grid_file(tmp_path):
    text = '[[axis]]\nsetting = "lr"\nvalues = [0.1]\n'
    g = grid(text)
    assert g.base == "budget-three-outcome" and g.title == "" and g.rule == ""
    assert [a.label for a in g.arms] == ["zero", "mask", "matched"]
    assert g.seeds == (0, 1, 2, 3, 4) and g.placement is None and g.config == {}


def test_a_grid_file_is_loaded_with_its_path_named_in_errors(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    assert gd.load(path).source == str(path) and gd.load(str(path)).text == GRID
    with pytest.raises(InputError) as e:
        gd.load(tmp_path / "absent.toml")
    assert str(e.value) == f"--grid {tmp_path / 'absent.toml'}: No such file or directory"
    shipped = gd.load(None)
    assert shipped.source == "the default grid (p3-drift.toml)"
    assert shipped.sha256 == hashlib.sha256(shipped.text.encode()).hexdigest()


def test_an_unknown_setting_is_refused_listing_every_setting_by_its_flag_s_name():
    from rescue.sim.config import settings

    said = refusal(GRID.replace("groups-per-step = 4", "colour = 4"))
    names = [s.flag.removeprefix("--") for s in settings()]
    assert said == "g.toml: [config]: 'colour' is not a setting; allowed: " + ", ".join(names)
    assert "max-turns" in names and "groups-per-step" in names


def test_lists_in_a_refusal_are_comma_separated_and_the_file_is_named():
    from rescue.sim import scenario as sc
    from rescue.sim.config import settings

    flags = ", ".join(s.flag.removeprefix("--") for s in settings())
    two_unknown = GRID.replace('title = "two by three"', 'colour = "red"\nsize = 2')
    assert refusal(two_unknown).startswith("g.toml: unknown key(s) colour, size; allowed: ")
    assert refusal(GRID.replace('base = "two-outcome"', 'base = "x"')) == (
        "g.toml: base='x'; allowed: " + ", ".join(sc.names()))  # fmt: skip
    assert refusal(GRID.replace('arms = ["zero", "mask"]', 'arms = ["matched"]')) == (
        "g.toml: arms must include zero, mask (P3 compares them)")  # fmt: skip
    axis_keys = GRID.replace('setting = "lr"\n', 'setting = "lr"\ncolour = 1\nsize = 2\n')
    assert refusal(axis_keys) == (
        "g.toml: [[axis]] 1: unknown key(s) colour, size; allowed: setting, what, labels, values")  # fmt: skip
    assert refusal(GRID.replace('setting = "lr"\n', 'setting = "speed"\n')) == (
        f"g.toml: [[axis]] 1: 'speed' is not a setting; allowed: {flags}")  # fmt: skip
    assert refusal(GRID.replace('setting = "lr"\n', "")) == (
        f"g.toml: [[axis]] 1: '' is not a setting; allowed: {flags}")  # fmt: skip
    assert refusal("title = [unclosed\n").startswith("g.toml: not valid TOML")


def test_one_seed_is_a_grid():
    assert grid(GRID.replace("seeds = 3", "seeds = 1")).seeds == (4,)
