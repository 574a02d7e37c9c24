"""``rescue.sim.map_report``: the map's report, read from outside on hand-built cells.

Every expected answer is written out by hand: the placement rule on cells that sit on its
thresholds, fail exactly one of its conditions or have a non-finite ratio or b (a rule that
ignored the thresholds, the run length or finiteness would choose otherwise); the table's
and the two controls' lines with their numbers' formats and 'n/a's; the tallies ordered by
count; ``map.md`` whole, its medians and counts worked out by hand from values chosen so that
``>`` and ``>=``, ``== `` and ``!=``, the largest and the first all give different answers;
``map.json`` key by key; and the folder ``write`` leaves: every file, the heat map's notes
(``rescue.sim.map_plot`` replaced by a stand-in, or missing), and an earlier folder left as it
was when writing fails.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rescue import output
from rescue.judge.family import Family
from rescue.sim import grid as gd
from rescue.sim.map_report import (
    CellResult,
    _plain,
    as_json,
    counts,
    markdown,
    placement,
    separation_table,
    table,
    write,
)

GRID = """title = "a small map"
base = "two-outcome"
arms = ["zero", "mask"]
seeds = 2
first-seed = 1
rule = "the rule in words"
[placement]
steps = 9
min-ratio = 1.5
min-b = 0.25
[[axis]]
setting = "max_turns"
what = "the turn budget"
labels = ["short", "long"]
values = [6, 10]
[[axis]]
setting = "steps"
values = [6, 9]
"""
#: The same grid without a title or a placement rule.
PLAIN = GRID.replace('title = "a small map"\n', "").replace(
    "[placement]\nsteps = 9\nmin-ratio = 1.5\nmin-b = 0.25\n", ""
)
NAN = float("nan")
INF = float("inf")
META = {"date": "2026-01-02", "cpus": 2, "workers": 3, "seconds": 12.6,
        "load_start": 1.234, "load_end": 0.5}  # fmt: skip
FAMILY = Family(size=5, claims=3, kept=2, withdrawn=["P3 in cell 2"])

HEAD = (
    "| max-turns | steps | b (mask, final) | subsidy ratio | P3 effect, mask − zero (σ of zero) "
    "[95%] | exact effect (σ of zero) | judged / exact trend (runs of the exact sign) | control "
    "clause (σ of mask) | level at matched b, mask − zero (σ of zero; reported) | P3 (rule) | "
    "alone |"
)
RULE = "|---|---|---|---|---|---|---|---|---|---|---|"
JUDGED = (
    "Each cell is judged by the judge's P3 (`rescue report`'s rule and window); the effect is "
    "the mask arm's cap-hit trend against b at matched b minus the zero arm's, in units of the "
    "zero arm's seed SD of that trend (the check's margin). Beside it, the truth on the same "
    "runs: the exact effect (the slope of the simulator's exact P(cap) on its exact J over the "
    "same steps, mask − zero, in the same unit), and the judged trend over the exact one "
    "averaged over every arm's runs with the share of runs of the exact sign "
    "(`rescue.judge.truth`). The subsidy ratio is exact (the mean of `sim/subsidy/term` over "
    "the mean of `|sim/subsidy/task|` over the mask runs' steps): the mechanism's size, "
    "whether or not behaviour moved."
)
DESCRIBED = [
    "- max_turns (the turn budget): short, long",
    "- steps: 6, 9",
    "- 4 cells × 2 arms (zero, mask) × 2 seeds (1-2); 8 runs simulated (a shorter run length "
    "is the first steps of the longest)",
]


def grid(text: str = GRID) -> gd.Grid:
    return gd.parse(text, where="m.toml")


def result(g: gd.Grid, at: int, **given) -> CellResult:
    """A cell of ``g`` (0: short 6, 1: short 9, 2: long 6, 3: long 9) with chosen values;
    what is not given is not finite, empty or None."""
    cell = g.cells()[at]
    values = {"max_turns": ["short", "long"][cell.index[0]], "steps": ["6", "9"][cell.index[1]]}
    fields = dict(values=values, verdict=None, alone=None, effect=NAN, effect_lo=NAN,
                  effect_hi=NAN, seeds=0, control=NAN, level=NAN, ratio=NAN, b=NAN, note="",
                  checks=[])  # fmt: skip
    return CellResult(cell=cell, **{**fields, **given})


def four(g: gd.Grid) -> list[CellResult]:
    """The map's four cells: effects 0.5, 2, n/a, 0 (median 0.5, largest the second);
    exact 0, 0.5, 0.4, -1 (median 0.2; the sign agrees in one of three); levels 0, 0.5, 2."""
    return [
        result(g, 0, verdict="as predicted", alone="as predicted", effect=0.5, effect_lo=0.1,
               effect_hi=0.9, seeds=2, control=-0.25, level=0.0, ratio=3.0, b=0.8, exact=0.0,
               fidelity=0.8, same_sign=0.5),
        result(g, 1, verdict="inconclusive", alone="as predicted", effect=2.0, effect_lo=1.0,
               effect_hi=3.0, seeds=2, control=1.5, level=0.5, ratio=1.5, b=0.25, exact=0.5),
        result(g, 2, effect=NAN, note="too few seeds", ratio=0.4, b=0.1, exact=0.4),
        result(g, 3, verdict="inconclusive", alone="opposite", effect=0.0, effect_lo=-1.0,
               effect_hi=1.0, seeds=2, control=0.0, level=2.0, ratio=2.0, b=0.3, exact=-1.0,
               fidelity=1.2, same_sign=1.0),
    ]  # fmt: skip


ROWS = [
    "| short | 6 | 0.80 | 3.00 | +0.50 [+0.10, +0.90] (n=2) | +0.00 | 0.80 (50%) | -0.25 | +0.00 "
    "| as predicted | as predicted |",
    "| short | 9 | 0.25 | 1.50 | +2.00 [+1.00, +3.00] (n=2) | +0.50 | n/a | +1.50 | +0.50 "
    "| inconclusive | as predicted |",
    "| long | 6 | 0.10 | 0.40 | n/a (too few seeds) | +0.40 | n/a | n/a | n/a | — | — |",
    "| long | 9 | 0.30 | 2.00 | +0.00 [-1.00, +1.00] (n=2) | -1.00 | 1.20 (100%) | +0.00 "
    "| +2.00 | inconclusive | opposite |",
]


def full_markdown() -> str:
    sha = hashlib.sha256(GRID.encode()).hexdigest()[:12]
    return "\n".join([
        "# rescue sim map: a small map",
        "",
        f"Grid `m.toml` (sha256 {sha}, copied to `grid.toml`), base scenario `two-outcome`, "
        "declared before the map ran:",
        "",
        *DESCRIBED,
        "",
        "Run 2026-01-02 on 2 CPUs (3 workers): 13 s (load average 1.23 at the start, 0.50 at "
        "the end).",
        "",
        JUDGED,
        "",
        *FAMILY.lines(),
        "",
        "P3 under the rule: inconclusive 2, as predicted 1, does not apply 1. Alone: as "
        "predicted 2, does not apply 1, opposite 1.",
        "Effect over the 3 cells with an estimate: median +0.50 σ, largest +2.00 σ (max_turns "
        "short, steps 9); positive (the mask drifting up relative to zero) in 2 of 3.",
        "The exact effect: positive in 2 of 4 cells, median +0.20 σ; the judged effect has its "
        "sign in 1 of 3 cells with both. The judged trends over the exact ones: median 1.00, "
        "runs of the exact sign 75% on average.",
        "The cap-hit rate at matched b (P3's reported check, mask − zero, deciding nothing): "
        "median +0.50 σ, above 0 in 2 of 3 cells.",
        "",
        HEAD,
        RULE,
        *ROWS,
        "",
        "## The placement rule",
        "",
        "the rule in words",
        "",
        "At 9 steps, subsidy ratio >= 1.5 and final b >= 0.25: 2 cell(s) qualify (max_turns "
        "short, steps 9; max_turns long, steps 9); chosen: **max_turns long, steps 9** (ratio "
        "2.00, b 0.30).",
        "",
    ])  # fmt: skip


# --- placement -------------------------------------------------------------------------


def test_without_a_placement_rule_no_cell_qualifies_and_none_is_chosen():
    g = grid(PLAIN)
    assert placement(g, [result(g, 1, ratio=9.0, b=9.0)]) == ([], None)


def test_placement_applies_its_run_length_and_both_thresholds_at_their_boundary():
    g = grid()  # steps 9, min-ratio 1.5, min-b 0.25
    edge = result(g, 1, ratio=1.5, b=0.25)  # on both thresholds: qualifies
    cells = [
        result(g, 0, ratio=9.0, b=9.0),  # 6 steps
        edge,
        result(g, 3, ratio=1.49, b=5.0),  # ratio just below
        result(g, 1, ratio=5.0, b=0.24),  # b just below
        result(g, 3, ratio=INF, b=1.0),
        result(g, 3, ratio=2.0, b=INF),
        result(g, 3, ratio=NAN, b=1.0),
        result(g, 3, ratio=2.0, b=NAN),
        result(g, 2, ratio=8.0, b=1.0),  # 6 steps
    ]
    ok, best = placement(g, cells)
    assert ok == [edge] and best is edge


def test_placement_chooses_the_largest_ratio_and_the_earlier_cell_of_a_tie():
    g = grid()
    low, first, middle, second = (result(g, 1, ratio=r, b=1.0) for r in (1.6, 3.0, 2.5, 3.0))
    ok, best = placement(g, [low, first, middle, second])
    assert ok == [low, first, middle, second]
    assert best is first and best is not second


def test_placement_with_no_cell_qualifying_chooses_none():
    g = grid()
    assert placement(g, [result(g, 1, ratio=1.0, b=1.0)]) == ([], None)
    assert placement(g, []) == ([], None)


# --- the table -------------------------------------------------------------------------


def test_the_table_of_two_cells_written_out():
    g = grid()
    cells = [
        result(g, 1, verdict="opposite", alone="no difference", effect=-1.256, effect_lo=-2.0,
               effect_hi=-0.5, seeds=6, control=0.125, level=-0.3, ratio=1.234, b=0.567,
               exact=-0.7, fidelity=0.333, same_sign=0.25),
        result(g, 2, effect=NAN, note="", ratio=0.0, b=1.0),
    ]  # fmt: skip
    assert table(g, cells) == [
        HEAD,
        RULE,
        "| short | 9 | 0.57 | 1.23 | -1.26 [-2.00, -0.50] (n=6) | -0.70 | 0.33 (25%) | +0.12 "
        "| -0.30 | opposite | no difference |",
        "| long | 6 | 1.00 | 0.00 | n/a | n/a | n/a | n/a | n/a | — | — |",
    ]


def test_the_table_s_rule_line_has_a_column_per_axis_and_nine_more():
    g = grid(PLAIN.replace('[[axis]]\nsetting = "steps"\nvalues = [6, 9]\n', ""))
    lines = table(g, [])
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|---|"
    assert lines[0].startswith("| max-turns | b (mask, final) | ")


def test_the_table_of_the_four_cells():
    g = grid()
    assert table(g, four(g)) == [HEAD, RULE, *ROWS]


# --- the two controls ------------------------------------------------------------------

CONTROLS = (
    "The exact cap-hit trend against b (the simulator's P(cap) on J over each run's steps at "
    "matched b), differences of the arms' means over the seeds, in cap-hit rate per unit b; "
    "beside them, as judged: P3's control clause (step-control − mask, in the mask arm's seed "
    "SD; the clause expects it below 0) and the matched control's direction check (matched − "
    "zero, in the zero arm's seed SD; reported). A drift the mask's direction carries shows as "
    "matched − zero near mask − zero with step-control − mask below 0; a drift of step size, "
    "the other way round."
)


def two_controls(g: gd.Grid) -> list[CellResult]:
    return [
        result(g, 0, control=-0.25, direction=0.75,
               separations={"matched − zero": 0.1234, "step-control − mask": -0.05}),
        result(g, 3, control=1.5,
               separations={"step-control − mask": 0.2, "step-control − matched": 1.0}),
    ]  # fmt: skip


SEPARATIONS = [
    "## The two controls, cell by cell",
    "",
    CONTROLS,
    "",
    "| max-turns | steps | exact matched − zero | exact step-control − mask | exact "
    "step-control − matched | judged step-control − mask (σ) | judged matched − zero (σ) |",
    "|---|---|---|---|---|---|---|",
    "| short | 6 | +0.123 | -0.050 | n/a | -0.25 | +0.75 |",
    "| long | 9 | n/a | +0.200 | +1.000 | +1.50 | n/a |",
    "",
]


def test_the_two_controls_table_is_empty_without_the_step_size_control():
    g = grid()
    assert separation_table(g, [result(g, 0), result(g, 1)]) == []
    others = [result(g, 0, separations={"matched − zero": 0.1}),
              result(g, 1, separations={"mask − step-control": 0.2})]  # fmt: skip
    assert separation_table(g, others) == []


def test_the_two_controls_table_written_out():
    g = grid()
    assert separation_table(g, two_controls(g)) == SEPARATIONS


# --- the tallies -----------------------------------------------------------------------


def test_counts_are_ordered_by_count_ties_in_order_of_first_appearance():
    g = grid()
    cells = [result(g, 0, verdict="opposite", alone="opposite"),
             result(g, 1, verdict="as predicted"),
             result(g, 2, verdict="as predicted", alone="opposite"),
             result(g, 3, verdict=None, alone="opposite")]  # fmt: skip
    assert counts(cells, "verdict") == "as predicted 2, opposite 1, does not apply 1"
    assert counts(cells, "alone") == "opposite 3, does not apply 1"
    assert counts([], "verdict") == ""


# --- map.md ----------------------------------------------------------------------------


def test_the_markdown_of_the_four_cells_written_out():
    g = grid()
    assert markdown(g, four(g), FAMILY, META) == full_markdown()


def test_the_markdown_without_estimates_title_or_placement_names_ray():
    g = grid(PLAIN)
    sha = hashlib.sha256(PLAIN.encode()).hexdigest()[:12]
    family = Family(size=0, claims=0, kept=0, withdrawn=[])
    cells = [result(g, 1, verdict="not judgeable", ratio=1.0, b=0.5, note="no runs")]
    meta = {**META, "ray": "ray://head:10001", "seconds": 0.4}
    assert markdown(g, cells, family, meta) == "\n".join([
        "# rescue sim map: P3 over a grid",
        "",
        f"Grid `m.toml` (sha256 {sha}, copied to `grid.toml`), base scenario `two-outcome`, "
        "declared before the map ran:",
        "",
        *DESCRIBED,
        "",
        "Run 2026-01-02 on 2 CPUs (3 workers, Ray at ray://head:10001): 0 s (load average 1.23 "
        "at the start, 0.50 at the end).",
        "",
        JUDGED,
        "",
        *family.lines(),
        "",
        "P3 under the rule: not judgeable 1. Alone: does not apply 1.",
        "",
        HEAD,
        RULE,
        "| short | 9 | 0.50 | 1.00 | n/a (no runs) | n/a | n/a | n/a | n/a | not judgeable | — |",
        "",
    ])  # fmt: skip


def test_the_markdown_with_only_the_exact_effect_and_the_two_controls():
    g = grid()
    cells = two_controls(g)
    cells[0].exact, cells[1].exact = -0.5, -0.3
    cells[0].fidelity, cells[0].same_sign = 0.5, 1.0
    cells[0].ratio = cells[0].b = cells[1].ratio = cells[1].b = 0.0
    text = markdown(g, cells, FAMILY, {**META, "ray": ""})
    lines = text.split("\n")
    assert lines[8] == (
        "Run 2026-01-02 on 2 CPUs (3 workers): 13 s (load average 1.23 at the start, 0.50 at "
        "the end)."
    )
    at = lines.index("P3 under the rule: does not apply 2. Alone: does not apply 2.")
    assert lines[at + 1 :] == [
        "The exact effect: positive in 0 of 2 cells, median -0.40 σ; the judged effect has its "
        "sign in 0 of 0 cells with both. The judged trends over the exact ones: median 0.50, "
        "runs of the exact sign 100% on average.",
        "",
        HEAD,
        RULE,
        "| short | 6 | 0.00 | 0.00 | n/a | -0.50 | 0.50 (100%) | -0.25 | n/a | — | — |",
        "| long | 9 | 0.00 | 0.00 | n/a | -0.30 | n/a | +1.50 | n/a | — | — |",
        "",
        *SEPARATIONS,
        "## The placement rule",
        "",
        "the rule in words",
        "",
        "At 9 steps, subsidy ratio >= 1.5 and final b >= 0.25: no cell qualifies.",
        "",
    ]


# --- map.json --------------------------------------------------------------------------


def two_finite(g: gd.Grid) -> list[CellResult]:
    """Two cells of 9 steps that qualify, every field finite and distinct, some of them
    numpy scalars (``map.json`` writes them as numbers) and a path in a check (as text)."""
    return [
        CellResult(
            cell=g.cells()[1], values={"max_turns": "short", "steps": "9"}, verdict="opposite",
            alone="as predicted", effect=np.float64(1.5), effect_lo=0.5, effect_hi=2.5,
            seeds=np.int64(4), control=-0.5, level=0.25, ratio=np.float32(1.75), b=0.5,
            note="a note", checks=[{"name": "P3", "at": Path("runs/x")}], exact=1.25,
            effect_of_differences=1.125, judged_abs=0.0625, exact_abs=0.03125, fidelity=0.875,
            same_sign=0.75, separations={"step-control − mask": -0.125}, direction=0.375),
        CellResult(
            cell=g.cells()[3], values={"max_turns": "long", "steps": "9"}, verdict=None,
            alone=None, effect=-1.0, effect_lo=-2.0, effect_hi=-0.25, seeds=3, control=2.0,
            level=-0.75, ratio=2.5, b=1.0, note="", checks=[], exact=-0.5,
            effect_of_differences=-0.625, judged_abs=-0.25, exact_abs=-0.5, fidelity=0.5,
            same_sign=0.5, direction=-0.125),
    ]  # fmt: skip


def json_of_two(at: object) -> dict:
    """``map.json`` of ``two_finite`` in ``grid()``, a check's path as ``at``."""
    return {
        "grid": {"source": "m.toml", "sha256": hashlib.sha256(GRID.encode()).hexdigest(),
                 "base": "two-outcome",
                 "axes": [{"setting": "max_turns", "what": "the turn budget",
                           "labels": ["short", "long"]},
                          {"setting": "steps", "what": "", "labels": ["6", "9"]}],
                 "arms": ["zero", "mask"], "seeds": [1, 2]},
        "meta": META,
        "family": {"size": 5, "claims": 3, "kept": 2},
        "placement": {"qualifying": [{"max_turns": "short", "steps": "9"},
                                     {"max_turns": "long", "steps": "9"}],
                      "chosen": {"max_turns": "long", "steps": "9"}},
        "cells": [
            {"values": {"max_turns": "short", "steps": "9"}, "verdict": "opposite",
             "alone": "as predicted", "effect_sd": 1.5, "effect_sd_interval": [0.5, 2.5],
             "seeds": 4, "control_sd": -0.5, "level_sd": 0.25, "subsidy_ratio": 1.75,
             "b_final": 0.5, "note": "a note", "exact_sd": 1.25,
             "effect_sd_of_differences": 1.125, "judged_difference": 0.0625,
             "exact_difference": 0.03125, "fidelity": 0.875, "same_sign": 0.75,
             "direction_sd": 0.375, "exact_separations": {"step-control − mask": -0.125},
             "checks": [{"name": "P3", "at": at}]},
            {"values": {"max_turns": "long", "steps": "9"}, "verdict": None, "alone": None,
             "effect_sd": -1.0, "effect_sd_interval": [-2.0, -0.25], "seeds": 3,
             "control_sd": 2.0, "level_sd": -0.75, "subsidy_ratio": 2.5, "b_final": 1.0,
             "note": "", "exact_sd": -0.5, "effect_sd_of_differences": -0.625,
             "judged_difference": -0.25, "exact_difference": -0.5, "fidelity": 0.5,
             "same_sign": 0.5, "direction_sd": -0.125, "exact_separations": {}, "checks": []},
        ],
    }  # fmt: skip


def test_as_json_holds_every_field_of_the_grid_the_run_and_each_cell():
    g = grid()
    assert as_json(g, two_finite(g), FAMILY, META) == json_of_two(Path("runs/x"))


def test_as_json_placement_without_a_chosen_cell():
    g = grid()
    cells = [result(g, 1, ratio=1.0, b=1.0)]
    assert as_json(g, cells, FAMILY, META)["placement"] == {"qualifying": [], "chosen": None}
    plain = grid(PLAIN)
    assert as_json(plain, cells, FAMILY, META)["placement"] == {"qualifying": [], "chosen": None}


def test_plain_gives_numpy_scalars_as_numbers_and_anything_else_as_text():
    assert _plain(np.int64(3)) == 3 and type(_plain(np.int64(3))) is int
    assert _plain(np.float32(0.5)) == 0.5 and type(_plain(np.float32(0.5))) is float
    assert _plain(Path("a/b")) == "a/b"


# --- write -----------------------------------------------------------------------------


def stand_in(calls: list, cap: bool = True, fail: bool = False) -> types.ModuleType:
    """A ``rescue.sim.map_plot`` that records its calls and writes a byte per plot."""
    module = types.ModuleType("rescue.sim.map_plot")

    def heatmap(g, cells, path):
        calls.append(("heatmap", g, cells, path))
        if fail:
            raise RuntimeError("the plot failed")
        Path(path).write_bytes(b"h")
        return path

    def cap_against_b(g, cells, path):
        calls.append(("cap_against_b", g, cells, path))
        if not cap:
            return None
        Path(path).write_bytes(b"c")
        return path

    module.heatmap, module.cap_against_b = heatmap, cap_against_b
    return module


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_write_without_plots_writes_the_grid_the_markdown_and_the_json(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "rescue.sim.map_plot", stand_in(calls))
    g = grid()
    out = tmp_path / "map"
    said = write(out, g, four(g), FAMILY, META, plots=False)
    assert said == [f"map: {out}/map.md (table), {out}/map.json, grid {out}/grid.toml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map"]
    files = listing(out)
    assert sorted(files) == ["grid.toml", "map.json", "map.md"] and calls == []
    assert files["grid.toml"].decode() == GRID
    assert files["map.md"].decode() == full_markdown() + "\n"


def test_write_gives_numpy_scalars_in_map_json_as_numbers(tmp_path):
    g = grid()
    out = tmp_path / "map"
    write(out, g, two_finite(g), FAMILY, META, plots=False)
    text = (out / "map.json").read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == json_of_two("runs/x")


def test_write_draws_the_heat_map_and_the_cap_curves_by_default(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "rescue.sim.map_plot", stand_in(calls))
    g = grid()
    cells = four(g)
    out = tmp_path / "map"
    said = write(str(out), g, cells, FAMILY, META)
    assert said == [
        f"map: {out}/map.md (table), {out}/map.json, grid {out}/grid.toml",
        f"heat map: {out}/map.png",
        f"cap-hit rate against b per cell: {out}/map_cap_b.png",
    ]
    files = listing(out)
    assert sorted(files) == ["grid.toml", "map.json", "map.md", "map.png", "map_cap_b.png"]
    assert files["map.png"] == b"h" and files["map_cap_b.png"] == b"c"
    assert [(name, a, b) for name, a, b, _ in calls] == [
        ("heatmap", g, cells), ("cap_against_b", g, cells)]  # fmt: skip
    assert [p.name for *_, p in calls] == ["map.png", "map_cap_b.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map"]


def test_write_names_no_cap_curves_when_no_cell_has_them(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "rescue.sim.map_plot", stand_in(calls, cap=False))
    g = grid()
    out = tmp_path / "map"
    said = write(out, g, four(g), FAMILY, META, plots=True)
    assert said == [
        f"map: {out}/map.md (table), {out}/map.json, grid {out}/grid.toml",
        f"heat map: {out}/map.png",
    ]
    assert sorted(listing(out)) == ["grid.toml", "map.json", "map.md", "map.png"]


def test_write_without_matplotlib_says_so_and_writes_the_rest(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rescue.sim.map_plot", None)
    g = grid()
    out = tmp_path / "map"
    said = write(out, g, four(g), FAMILY, META)
    assert said == [
        f"map: {out}/map.md (table), {out}/map.json, grid {out}/grid.toml",
        "heat map: matplotlib not installed (pip install 'rescue[sim]'): skipped",
    ]
    assert sorted(listing(out)) == ["grid.toml", "map.json", "map.md"]


def test_a_map_that_fails_while_written_leaves_the_earlier_one(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "rescue.sim.map_plot", stand_in(calls, fail=True))
    out = tmp_path / "map"
    out.mkdir()
    (out / "map.md").write_text("the earlier map\n")
    (out / "notes.txt").write_text("mine\n")
    g = grid()
    with pytest.raises(RuntimeError, match="the plot failed"):
        write(out, g, four(g), FAMILY, META)
    assert listing(out) == {"map.md": b"the earlier map\n", "notes.txt": b"mine\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map"] and len(calls) == 1
    output.forget()
