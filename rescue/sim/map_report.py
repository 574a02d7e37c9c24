"""The map's report: ``map.md`` (the grid, the rule's account, the table), ``map.json``, and
the output folder written whole or not at all (``write``); the heat map is ``map_plot``.

Specification
-------------
``write`` puts every output into a temporary sibling of the output folder and swaps it in
only when complete: a map that fails (an error, an interrupt) leaves the earlier one as it
was and no temporary folder behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rescue.sim import grid as gd


@dataclass
class CellResult:
    """One cell of the map, judged (module docstring)."""

    cell: gd.Cell
    values: dict[str, str]
    verdict: str | None
    alone: str | None
    effect: float
    effect_lo: float
    effect_hi: float
    seeds: int
    control: float
    level: float
    ratio: float
    b: float
    note: str
    checks: list[dict]
    exact: float = float("nan")
    judged_abs: float = float("nan")
    exact_abs: float = float("nan")
    fidelity: float = float("nan")
    same_sign: float = float("nan")
    #: Each arm's cap-hit rate against the prior b, binned: ``{arm: (centres, mean, lo,
    #: hi)}`` over the seeds (the cells of the grid's longest run length only).
    curves: dict = field(default_factory=dict)
    #: The exact trends' differences between controls (``drift_map``), by ``"a − b"``.
    separations: dict = field(default_factory=dict)
    direction: float = float("nan")


def placement(grid: gd.Grid, cells: list[CellResult]) -> tuple[list[CellResult], CellResult | None]:
    """The cells that qualify under the grid's ``[placement]``, and the one it chooses
    (largest subsidy ratio; ties: the earlier cell). Reads no verdict."""
    rule = grid.placement
    if rule is None:
        return [], None
    ok = [
        c
        for c in cells
        if c.cell.config.steps == rule.steps
        and np.isfinite(c.ratio)
        and c.ratio >= rule.min_ratio
        and np.isfinite(c.b)
        and c.b >= rule.min_b
    ]
    best = max(ok, key=lambda c: c.ratio, default=None)  # max keeps the first of a tie
    return ok, best


def _f(x: float, digits: int = 2) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:+.{digits}f}"


def table(grid: gd.Grid, cells: list[CellResult]) -> list[str]:
    head = [a.setting.replace("_", "-") for a in grid.axes]
    lines = [
        "| " + " | ".join(head) + " | b (mask, final) | subsidy ratio | P3 effect, mask − zero "
        "(σ of zero) [95%] | exact effect (σ of zero) | judged / exact trend (runs of the "
        "exact sign) | control clause (σ of mask) | level at matched b, mask − zero "
        "(σ of zero; reported) | P3 (rule) | alone |",
        "|" + "---|" * (len(head) + 9),
    ]
    for c in cells:
        eff = (
            f"{_f(c.effect)} [{_f(c.effect_lo)}, {_f(c.effect_hi)}] (n={c.seeds})"
            if np.isfinite(c.effect)
            else "n/a" + (f" ({c.note})" if c.note else "")
        )
        lines.append(
            "| " + " | ".join(c.values[a.setting] for a in grid.axes)
            + f" | {c.b:.2f} | {c.ratio:.2f} | {eff} | {_f(c.exact)} | {_fid(c)} "
            f"| {_f(c.control)} | {_f(c.level)} "
            f"| {c.verdict or '—'} "
            f"| {c.alone or '—'} |"
        )  # fmt: skip
    return lines


def separation_table(grid: gd.Grid, cells: list[CellResult]) -> list[str]:
    """Where the step-size control separates from the mask and from the matched control:
    the exact trends' differences per cell, beside P3's judged control clause and the
    matched control's direction check (empty without the step-size control)."""
    keys = list(dict.fromkeys(k for c in cells for k in c.separations))
    if not any(k.startswith("step-control") for k in keys):
        return []
    head = [a.setting.replace("_", "-") for a in grid.axes]
    lines = [
        "## The two controls, cell by cell",
        "",
        "The exact cap-hit trend against b (the simulator's P(cap) on J over each run's steps "
        "at matched b), differences of the arms' means over the seeds, in cap-hit rate per "
        "unit b; beside them, as judged: P3's control clause (step-control − mask, in the "
        "mask arm's seed SD; the clause expects it below 0) and the matched control's "
        "direction check (matched − zero, in the zero arm's seed SD; reported). A drift the "
        "mask's direction carries shows as matched − zero near mask − zero with "
        "step-control − mask below 0; a drift of step size, the other way round.",
        "",
        "| " + " | ".join(head) + " | " + " | ".join(f"exact {k}" for k in keys)
        + " | judged step-control − mask (σ) | judged matched − zero (σ) |",
        "|" + "---|" * (len(head) + len(keys) + 2),
    ]  # fmt: skip
    for c in cells:
        lines.append(
            "| " + " | ".join(c.values[a.setting] for a in grid.axes) + " | "
            + " | ".join(_f(c.separations.get(k, float("nan")), 3) for k in keys)
            + f" | {_f(c.control)} | {_f(c.direction)} |"
        )  # fmt: skip
    return [*lines, ""]


def _fid(c: CellResult) -> str:
    if not np.isfinite(c.fidelity):
        return "n/a"
    return f"{c.fidelity:.2f} ({c.same_sign:.0%})"


def counts(cells: list[CellResult], attr: str) -> str:
    tally: dict[str, int] = {}
    for c in cells:
        v = getattr(c, attr) or "does not apply"
        tally[v] = tally.get(v, 0) + 1
    return ", ".join(f"{v} {n}" for v, n in sorted(tally.items(), key=lambda kv: -kv[1]))


def markdown(grid: gd.Grid, cells: list[CellResult], family, meta: dict) -> str:
    ok, best = placement(grid, cells)
    finite = [c for c in cells if np.isfinite(c.effect)]
    lines = [
        f"# rescue sim map: {grid.title or 'P3 over a grid'}",
        "",
        f"Grid `{grid.source}` (sha256 {grid.sha256[:12]}, copied to `grid.toml`), base scenario "
        f"`{grid.base}`, declared before the map ran:",
        "",
        *gd.describe(grid),
        "",
        f"Run {meta['date']} on {meta['cpus']} CPUs ({meta['workers']} workers"
        + (f", Ray at {meta['ray']}" if meta.get("ray") else "")
        + f"): {meta['seconds']:.0f} s (load average {meta['load_start']:.2f} at the start, "
        f"{meta['load_end']:.2f} at the end).",
        "",
        "Each cell is judged by the judge's P3 (`rescue report`'s rule and window); the "
        "effect is the mask arm's cap-hit trend against b at matched b minus the zero arm's, "
        "in units of the zero arm's seed SD of that trend (the check's margin). Beside it, "
        "the truth on the same runs: the exact effect (the slope of the simulator's exact "
        "P(cap) on its exact J over the same steps, mask − zero, in the same unit), and the "
        "judged trend over the exact one averaged over every arm's runs with the share of "
        "runs of the exact sign (`rescue.judge.truth`). The subsidy "
        "ratio is exact (the mean of `sim/subsidy/term` over the mean of "
        "`|sim/subsidy/task|` over the mask runs' steps): the mechanism's size, whether or "
        "not behaviour moved.",
        "",
        *family.lines(),
        "",
        f"P3 under the rule: {counts(cells, 'verdict')}. Alone: {counts(cells, 'alone')}.",
    ]
    if finite:
        top = max(finite, key=lambda c: c.effect)
        lines.append(
            f"Effect over the {len(finite)} cells with an estimate: median "
            f"{np.median([c.effect for c in finite]):+.2f} σ, largest {top.effect:+.2f} σ "
            f"({top.cell.label(grid)}); positive (the mask drifting up relative to zero) in "
            f"{sum(c.effect > 0 for c in finite)} of {len(finite)}."
        )
    exact = [c for c in cells if np.isfinite(c.exact)]
    if exact:
        lines.append(
            f"The exact effect: positive in {sum(c.exact > 0 for c in exact)} of {len(exact)} "
            f"cells, median {np.median([c.exact for c in exact]):+.2f} σ; the judged effect has "
            f"its sign in {sum(np.sign(c.effect) == np.sign(c.exact) for c in exact if np.isfinite(c.effect))} "
            f"of {sum(np.isfinite(c.effect) for c in exact)} cells with both. The judged trends "
            f"over the exact ones: median {np.nanmedian([c.fidelity for c in exact]):.2f}, runs of "
            f"the exact sign {np.nanmean([c.same_sign for c in exact]):.0%} on average."
        )
    levels = [c.level for c in cells if np.isfinite(c.level)]
    if levels:
        lines.append(
            f"The cap-hit rate at matched b (P3's reported check, mask − zero, deciding "
            f"nothing): median {np.median(levels):+.2f} σ, above 0 in "
            f"{sum(x > 0 for x in levels)} of {len(levels)} cells."
        )
    lines += ["", *table(grid, cells), ""]
    lines += separation_table(grid, cells)
    if grid.placement is not None:
        p = grid.placement
        lines += [
            "## The placement rule",
            "",
            grid.rule,
            "",
            f"At {p.steps} steps, subsidy ratio >= {p.min_ratio:g} and final b >= {p.min_b:g}: "
            + (
                f"{len(ok)} cell(s) qualify ({'; '.join(c.cell.label(grid) for c in ok)}); "
                f"chosen: **{best.cell.label(grid)}** (ratio {best.ratio:.2f}, b {best.b:.2f})."
                if best is not None
                else "no cell qualifies."
            ),
            "",
        ]
    return "\n".join(lines)


def as_json(grid: gd.Grid, cells: list[CellResult], family, meta: dict) -> dict:
    ok, best = placement(grid, cells)
    return {
        "grid": {"source": grid.source, "sha256": grid.sha256, "base": grid.base,
                 "axes": [{"setting": a.setting, "what": a.what, "labels": list(a.labels)}
                          for a in grid.axes],
                 "arms": [a.label for a in grid.arms], "seeds": list(grid.seeds)},
        "meta": meta,
        "family": {"size": family.size, "claims": family.claims, "kept": family.kept},
        "placement": {"qualifying": [c.values for c in ok],
                      "chosen": best.values if best is not None else None},
        "cells": [
            {"values": c.values, "verdict": c.verdict, "alone": c.alone, "effect_sd": c.effect,
             "effect_sd_interval": [c.effect_lo, c.effect_hi], "seeds": c.seeds,
             "control_sd": c.control, "level_sd": c.level, "subsidy_ratio": c.ratio, "b_final": c.b, "note": c.note,
             "exact_sd": c.exact, "judged_difference": c.judged_abs, "exact_difference": c.exact_abs,
             "fidelity": c.fidelity, "same_sign": c.same_sign,
             "direction_sd": c.direction, "exact_separations": c.separations,
             "checks": c.checks}
            for c in cells
        ],
    }  # fmt: skip


def write(out: Path, grid: gd.Grid, cells, family, meta: dict, plots: bool = True) -> list[str]:
    """Every output into a temporary sibling of ``out``, swapped in when complete
    (``rescue.output.staged``: a failed or interrupted map leaves the previous one)."""
    from rescue.output import staged

    out = Path(out)
    notes = []
    with staged(out) as stage:
        tmp = stage.path
        (tmp / "grid.toml").write_text(grid.text)
        (tmp / "map.md").write_text(markdown(grid, cells, family, meta) + "\n")
        data = as_json(grid, cells, family, meta)
        (tmp / "map.json").write_text(json.dumps(data, indent=1, default=_plain) + "\n")
        if plots:
            try:
                from rescue.sim.map_plot import heatmap

                heatmap(grid, cells, tmp / "map.png")
                notes.append(f"heat map: {out / 'map.png'}")
                from rescue.sim.map_plot import cap_against_b

                if cap_against_b(grid, cells, tmp / "map_cap_b.png") is not None:
                    notes.append(f"cap-hit rate against b per cell: {out / 'map_cap_b.png'}")
            except ImportError:
                notes.append(
                    "heat map: matplotlib not installed (pip install 'rescue[sim]'): skipped"
                )
    return [f"map: {out / 'map.md'} (table), {out / 'map.json'}, grid {out / 'grid.toml'}", *notes]


def _plain(x):
    """numpy scalars as Python numbers (JSON), anything else as its text."""
    return x.item() if hasattr(x, "item") else str(x)
