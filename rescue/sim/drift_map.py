"""``rescue sim map`` (``make map``): P3 over a declared grid of settings, the subsidy beside it.

Specification
-------------
The grid is a file (``rescue.sim.grid``) read before anything runs; its text is written
with the output. Every cell runs P3's arms (``zero``, ``mask``, ``matched``) over the
grid's seeds, all cells' runs side by side on the workers (``runner.run_grid``: worker
processes here, or Ray tasks on a cluster with ``--ray``; the results do not depend on
which). Each cell is judged by the judge's own P3 (``rescue.judge``, the rule and window
``rescue report`` applies), and the deciding checks of every cell are one family under
the report's family-wise rule (``rescue.judge.family``): the map is one report.

Per cell (``CellResult``):

- ``effect``: P3's first deciding check, the mask arm's cap-hit trend against b at
  matched b minus the zero arm's, in units of its margin, the zero arm's seed SD of the
  same trend (interval likewise); ``control``: the second (matched − mask, in the mask
  arm's seed SD); ``level``: P3's reported check beside them, the cap-hit rate at matched
  b, mask − zero, in the zero arm's seed SD of it (it decides nothing);
- the verdict of P3 under the map's family-wise rule and alone;
- ``ratio``: the subsidy ratio of the mask arm's runs, the mean of ``sim/subsidy/term``
  over the mean of ``|sim/subsidy/task|`` over every step and seed of the cell (the exact
  terms, ``rescue.sim.subsidy``: the mechanism's size whether or not behaviour moved);
- ``b``: the mask arm's b (``rollout/census/b_all``) over the final 20% of the steps;
- the truth beside the judged effect (``rescue.judge.truth``, the simulator's exact P(cap)
  and J on the same runs): ``exact``, the exact trend's mask − zero difference in the same
  unit as ``effect`` (the zero arm's seed SD of the judged trend), ``judged_abs`` and
  ``exact_abs`` the two differences themselves (cap-hit rate per unit b), ``fidelity`` the
  mean judged per-run trend over the mean exact one (every arm's runs) and ``same_sign``
  the share of runs whose judged trend has the exact one's sign: the estimator's fidelity,
  cell by cell;
- with the step-size control among the arms: ``control`` is P3's control clause as the
  judge decides it (step-control − mask, in the mask arm's seed SD), ``direction`` the
  matched control's reported direction check (matched − zero, in the zero arm's seed SD),
  and ``separations`` the exact trends' differences step-control − mask, step-control −
  matched, matched − zero and step-control − zero (cap-hit rate per unit b): where the
  step-size control separates from the mask and from the matched control.

With a ``[placement]`` in the grid, ``map_report.placement`` applies it: at its run length, the cells
whose ratio and b reach its thresholds qualify, and the one with the largest ratio (ties:
the earlier cell of the grid) is named. It reads no verdict.

Output (``--out``, default ``runs/map``; ``map_report`` writes it, to a temporary sibling
swapped in only when complete, so a failed map never destroys an earlier one): ``grid.toml`` (the
file as declared), ``map.md`` (the grid, the rule's account, the table, what was
measured and how long it took), ``map.json`` (the same as data, with every check's
per-seed values) and ``map.png`` (the heat map: P3's effect in seed SDs per cell, its
verdict and the subsidy ratio written in it).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rescue import flags
from rescue.sim import grid as gd
from rescue.sim.map_report import CellResult

#: The metric keys a map keeps per step: what P3, the subsidy ratio and b read.
KEEP = (
    "rollout/census/generated/rollouts",
    "rollout/census/generated/cap_hit_rate",
    "rollout/census/generated/outcome/",
    "rollout/census/rollouts",
    "rollout/census/b_all",
    "rollout/census/b_realized",
    "rollout/census/masked_frac",
    "sim/subsidy/",
    "sim/time",
)
DEFAULT_OUT = "runs/map"


def _sd_units(check) -> tuple[float, float, float, int]:
    e, m = check.estimate, check.margin
    if e is None or not (np.isfinite(m) and m > 0):
        return math.nan, math.nan, math.nan, (e.n if e is not None else 0)
    return e.value / m, e.lo / m, e.hi / m, e.n


def _mean_key(runs, key: str, last: float = 1.0, absolute: bool = False) -> float:
    vals = []
    for r in runs:
        x = np.array([m.get(key, np.nan) for m in r.steps], dtype=float)
        x = x[len(x) - max(1, round(last * len(x))) :]
        vals.append(np.abs(x) if absolute else x)
    with np.errstate(all="ignore"):
        return float(np.nanmean(np.concatenate(vals))) if vals else math.nan


def _curves(arms) -> dict:
    """Each arm's cap-hit rate against its prior b, binned, mean and t band over the seeds
    (``rescue.judge.plots``, the report's picture of P3)."""
    from rescue.judge import plots
    from rescue.judge import quantities as qs

    out = {}
    for label, runs in arms.items():
        try:
            per_seed = [plots._by_b(r, "cap_hit", 1) for r in runs.values()]
        except qs.MissingKey:
            continue
        centres = per_seed[0][0]
        mean, lo, hi = plots._band(np.vstack([y for _, y in per_seed]))
        out[label] = (centres, mean, lo, hi)
    return out


def judge_cells(grid: gd.Grid, simulated: dict, cells: list[gd.Cell]):
    """``(CellResult per cell, the family's account)``: P3 on each cell's runs, the
    family-wise rule over every cell's deciding checks."""
    from rescue.judge import truth
    from rescue.judge.evaluation import evaluate
    from rescue.judge.family import holm
    from rescue.judge.predictions import BY_ID
    from rescue.sim.subsidy import PREFIX
    from rescue.sim.summary import cohort

    p3 = BY_ID["P3"]
    judged = []
    for cell in cells:
        n = cell.config.steps
        res = {
            arm: [replace(r, steps=r.steps[:n]) for r in runs]
            for arm, runs in simulated[cell.simulated].items()
        }
        (result,) = evaluate([p3], cohort(res))
        judged.append((cell, res, result))
    family = holm([r for _, _, r in judged])
    out = []
    for cell, res, result in judged:
        deciding = [c for c in result.checks if c.decides]
        effect = _sd_units(deciding[0]) if deciding else (math.nan,) * 3 + (0,)
        control = _sd_units(deciding[1])[0] if len(deciding) > 1 else math.nan
        level = next(
            (_sd_units(c)[0] for c in result.checks if c.name.startswith("cap-hit rate at")),
            math.nan,
        )
        pairs = truth.fidelity(cohort(res), "zero", ("cap_trend",))
        j_diff, e_diff = truth.differences(pairs, "cap_trend", "mask", "zero")
        separations = {
            f"{a} − {b}": float(np.mean(d)) if (d := truth.differences(pairs, "cap_trend", a, b)[1])
            else math.nan
            for a, b in (("step-control", "mask"), ("step-control", "matched"),
                         ("matched", "zero"), ("step-control", "zero"))
            if a in res and b in res
        }  # fmt: skip
        direction = next(
            (_sd_units(c)[0] for c in result.checks if "the direction check" in c.name), math.nan
        )
        agree = truth.summary(pairs)
        runs_n = sum(a.runs for a in agree)
        judged_mean = sum(a.judged_mean * a.runs for a in agree) / runs_n if runs_n else math.nan
        exact_mean = sum(a.exact_mean * a.runs for a in agree) / runs_n if runs_n else math.nan
        margin = deciding[0].margin if deciding else math.nan
        unit = margin if np.isfinite(margin) and margin > 0 else math.nan
        longest = max(c.config.steps for c in cells)
        curves = _curves(cohort(res)) if cell.config.steps == longest else {}
        mask = res["mask"]
        term = _mean_key(mask, PREFIX + "term")
        task = _mean_key(mask, PREFIX + "task", absolute=True)
        out.append(
            CellResult(
                cell=cell,
                values=gd.values_of(grid, cell),
                verdict=result.verdict,
                alone=result.alone,
                effect=effect[0],
                effect_lo=effect[1],
                effect_hi=effect[2],
                seeds=effect[3],
                control=control,
                level=level,
                ratio=term / task if task > 0 else math.nan,
                b=_mean_key(mask, "rollout/census/b_all", last=0.2),
                note=result.note or (deciding[0].reason if deciding else ""),
                checks=[c.as_dict() for c in result.checks],
                exact=float(np.mean(e_diff)) / unit if e_diff else math.nan,
                judged_abs=float(np.mean(j_diff)) if j_diff else math.nan,
                exact_abs=float(np.mean(e_diff)) if e_diff else math.nan,
                fidelity=judged_mean / exact_mean if exact_mean else math.nan,
                same_sign=sum(a.same_sign for a in agree) / runs_n if runs_n else math.nan,
                curves=curves,
                separations=separations,
                direction=direction,
            )
        )
    return out, family


def run_map(grid: gd.Grid, *, workers: int = 1, ray: str | None = None, progress: bool = True):
    """Simulate every cell's arms and seeds, then judge (``judge_cells``)."""
    from rescue.sim.runner import run_grid

    cells = grid.cells()
    unique = list(dict.fromkeys(c.simulated for c in cells))
    results = run_grid(
        [(cfg, list(grid.arms), None) for cfg in unique], list(grid.seeds),
        workers=workers, progress=progress, ray=ray, keep=KEEP,
    )  # fmt: skip
    return judge_cells(grid, dict(zip(unique, results, strict=True)), cells)


# ---------------------------------------------------------------- command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grid",
        dest="grid",
        default=None,
        help=f"the grid file (TOML; format in rescue.sim.grid) (default: the shipped "
        f"rescue/sim/maps/{gd.DEFAULT})",
    )
    parser.add_argument(
        "--out",
        dest="map_out",
        default=DEFAULT_OUT,
        help=f"output folder, replaced only when the map completes (default: {DEFAULT_OUT})",
    )
    parser.add_argument(
        "--workers",
        dest="map_workers",
        type=flags.COUNT,
        default=None,
        help="worker processes (default: the number of CPUs); results do not depend on it",
    )
    parser.add_argument(
        "--ray", dest="map_ray", metavar="ADDRESS", help="run the runs as Ray tasks on the cluster at ADDRESS "
        "('auto': the one this machine belongs to) (default: worker processes here)",
    )  # fmt: skip
    parser.add_argument(
        "--describe", action="store_true", help="print the grid, its cells and runs, and exit"
    )
    parser.add_argument(
        "--no-plots",
        dest="map_no_plots",
        action="store_true",
        help="no heat map (default: write it)",
    )
    parser.add_argument(
        "--no-progress",
        dest="map_no_progress",
        action="store_true",
        help="no progress bar on stderr (default: show it)",
    )


def main(args: argparse.Namespace) -> int:
    grid = gd.load(args.grid)
    if args.describe:
        print("\n".join([grid.title, *gd.describe(grid)]))
        return 0
    workers = args.map_workers or (os.cpu_count() or 1)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    cells, family = run_map(
        grid, workers=workers, ray=args.map_ray, progress=not args.map_no_progress
    )
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": time.perf_counter() - t0,
        "cpus": os.cpu_count(),
        "workers": workers,
        "ray": args.map_ray,
        "load_start": load0,
        "load_end": os.getloadavg()[0],
    }
    from rescue.sim.map_report import markdown, write

    for line in write(Path(args.map_out), grid, cells, family, meta, plots=not args.map_no_plots):
        print(line)
    print(markdown(grid, cells, family, meta))
    return 0
