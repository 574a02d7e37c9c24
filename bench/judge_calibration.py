"""Calibration of the judge: false claims when the arms are one arm, power for a planted effect.

For each scenario, one arm is simulated on ``blocks × roles × seeds`` disjoint seeds and
its runs are relabelled: block k, role j, seed i is the run of seed
``FIRST_SEED + (k · roles + j) · seeds + i``, labelled as the role's arm with seed i. Every
arm of a block is therefore the same arm (an A/A comparison for every arm pair the
predictions compare), and every block is one report: ``rescue.judge.report.judge`` on its
runs, with the family-wise rule over the report's deciding checks.

- False claims: a prediction's verdict that the truth contradicts. The arms do not differ,
  so for a prediction that expects a difference (P3, P4, P5) ``as predicted`` and
  ``opposite`` are false; for one that expects an equivalence (P6's ``same``, P7 online's
  ``not lower``) ``opposite`` is. P7 offline (a property of one arm) and the reported
  comparisons are not counted. Printed per prediction and pooled, under the rule and
  alone, with the Clopper–Pearson upper 95% bound. Goal: at most 5%, bound at most 10%.
- Power: the same blocks with an effect planted in one arm's logged rows, of 1.5 σ, σ the
  seed-to-seed SD of the deciding check's per-seed differences over the A/A blocks (the
  σ a paired t test on n seeds sees): P3, the mask arm's cap-hit rate + c·(prior b) at
  every step (its trend against the prior b, which P3 reads, is c higher: the mask drifts,
  the matched control does not); P4,
  the survivor arm's cap-hit rate + c·step/100 (its drift); P5, the drop arm's turns of
  successes − c₁·step/100 and of failures + c₂·step/100 (every generated rollout); P6 and
  P7 online, the protect / turn arm's success − (m + c) over the final window, m the
  block's equivalence margin (a shortfall the equivalence must call ``opposite``: an
  equivalence's null is the margin, so its effect is measured from there, as a difference's
  is from 0). Power is the share of blocks whose prediction gets the verdict the planted
  effect makes true. Goal: at least 65% at n = 5. The same runs regrouped into fewer
  blocks of more seeds (``--power-seeds``) give the power at larger n: how many seeds a
  prediction needs, under the report's family-wise rule and alone.
- Beside them: the A/A rate of P4's gap-growth check, against the mean of the two arms'
  rates (the judge's) and against the mask arm's own rate (the rule it replaced); and P5
  decided on the trends (the judge's) against the same prediction decided on the level
  over the run, at equal false-claim rate.

The runs are shorter than the scenarios' (``--steps``, ``--groups-per-step``): what is
calibrated is the judge's statistics on runs shaped like the scenarios', not the
scenarios' outcomes. Run: ``.venv/bin/python bench/judge_calibration.py [--blocks 30]
[--seeds 5] [--power-seeds 8,10] [--workers N]``; prints the wall-clock it took.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from rescue.judge import quantities as qs
from rescue.judge.report import judge
from rescue.judge.runs import Run, parse_name
from rescue.judge.stats import AS_PREDICTED, OPPOSITE, combine, slope, t_interval
from rescue.sim import scenario as sc
from rescue.sim.arms import ArmSpec
from rescue.sim.runner import run_arms

FIRST_SEED = 10_000
EFFECT = 1.5  # planted effect, in seed SDs of the deciding check's per-seed difference
GOAL_FALSE, GOAL_BOUND, GOAL_POWER = 0.05, 0.10, 0.65
GEN = qs.GEN


@dataclass(frozen=True)
class Setup:
    """One scenario of the calibration: the arm simulated and the roles it is relabelled as."""

    scenario: str
    arm: str
    roles: tuple[str, ...]
    predictions: tuple[str, ...]


SETUPS = (
    Setup(
        "budget-three-outcome",
        "zero",
        ("zero", "mask", "matched", "survivor", "turn"),
        ("P3", "P4", "P7 online"),
    ),
    Setup("swe-like", "never-drop", ("drop", "never-drop", "protect-a0.5"), ("P5", "P6")),
)

#: What each prediction expects: a difference (False claims: as predicted, opposite) or an
#: equivalence (false: opposite); and the verdict a planted effect makes true.
EXPECTS_DIFFERENCE = {"P3": True, "P4": True, "P5": True, "P6": False, "P7 online": False}
PLANTED_TRUTH = {"P3": AS_PREDICTED, "P4": AS_PREDICTED, "P5": AS_PREDICTED}
PLANTED_TRUTH |= {"P6": OPPOSITE, "P7 online": OPPOSITE}


def relabel(result, label: str, seed: int) -> Run:
    cond = parse_name(label)[0]
    return Run(cond, seed, result.steps, source=f"{label} seed {seed}", offline={"p7": result.p7})


def blocks(results, setup: Setup, n: int, k: int) -> list[list[Run]]:
    """The runs of each of ``k`` blocks, relabelled."""
    roles = len(setup.roles)
    out = []
    for b in range(k):
        runs = []
        for j, label in enumerate(setup.roles):
            for i in range(n):
                runs.append(relabel(results[(b * roles + j) * n + i], label, i))
        out.append(runs)
    return out


@dataclass
class Tally:
    judged: int = 0
    false: int = 0
    found: int = 0
    per_seed: list[float] = field(default_factory=list)


def upper(k: int, n: int) -> float:
    """Clopper–Pearson upper 95% bound of a rate k / n (two-sided)."""
    return 1.0 if k >= n else float(sps.beta.ppf(0.975, k + 1, n - k))


def is_false(pid: str, verdict: str | None) -> bool:
    bad = (AS_PREDICTED, OPPOSITE) if EXPECTS_DIFFERENCE[pid] else (OPPOSITE,)
    return verdict in bad


# ---------------------------------------------------------------- planted effects


def _with_rows(run: Run, edit: Callable[[int, dict], None]) -> Run:
    rows = copy.deepcopy(run.rows)
    for i, row in enumerate(rows):
        edit(i, row)
    return Run(run.condition, run.seed, rows, run.source, dict(run.offline))


def plant(pid: str, runs: list[Run], sigma: dict[str, float], margin: float = 0.0) -> list[Run]:
    """The block's runs with the prediction's effect planted (module docstring); ``margin``
    is the block's equivalence margin of the deciding check (P6, P7 online), the boundary the
    shortfall is measured from."""
    out = []
    for run in runs:
        label = run.label
        if pid == "P3" and label == "mask":
            c = EFFECT * sigma["P3"]
            prior = qs.prior(qs.series(run, "b"), qs.B_SMOOTH, run.steps().max())
            steps = run.steps()

            def edit(i, row, c=c, prior=prior, steps=steps):
                t = int(steps[i])
                if GEN + "cap_hit_rate" in row and np.isfinite(prior[t]):
                    row[GEN + "cap_hit_rate"] += c * prior[t]

        elif pid == "P4" and label == "survivor":
            c = EFFECT * sigma["P4"]

            def edit(i, row, c=c):
                if GEN + "cap_hit_rate" in row:
                    row[GEN + "cap_hit_rate"] += c * i / 100

        elif pid == "P5" and label == "drop":
            c1, c2 = EFFECT * sigma["P5 successes"], EFFECT * sigma["P5 failures"]

            def edit(i, row, c1=c1, c2=c2):
                if GEN + "turns_mean/solved" in row:
                    row[GEN + "turns_mean/solved"] -= c1 * i / 100
                for o in ("submitted_failure", "budget_failure"):
                    if GEN + f"turns_mean/{o}" in row:
                        row[GEN + f"turns_mean/{o}"] += c2 * i / 100

        elif (pid, label) in (("P6", "protect-a0.5"), ("P7 online", "turn")):
            c, start = margin + EFFECT * sigma[pid], qs.final_start(len(run.rows) - 1)

            def edit(i, row, c=c, start=start):
                if i >= start and GEN + "outcome/solved" in row:
                    moved = c * row[GEN + "rollouts"]
                    row[GEN + "outcome/solved"] -= moved
                    row[GEN + "outcome/submitted_failure"] += moved

        else:
            out.append(run)
            continue
        out.append(_with_rows(run, edit))
    return out


#: The deciding check whose per-seed differences give each planted effect's σ.
SIGMA_OF = {
    "P3": ("P3", "cap-hit trend against b at matched b, mask"),
    "P4": ("P4", "cap-hit drift"),
    "P5 successes": ("P5", "trend of the turns of successes"),
    "P5 failures": ("P5", "trend of the turns of failures"),
    "P5 successes, level": ("P5", "turns of successes over the run"),
    "P5 failures, level": ("P5", "turns of failures (submitted or capped) over the run"),
    "P6": ("P6", "final success, protect-a0.5"),
    "P7 online": ("P7 online", "final success, turn"),
}


def differences(check) -> list[float]:
    (_, a), (_, r) = list(check.values.items())[:2]
    return [a[s] - r[s] for s in a if s in r and np.isfinite(a[s]) and np.isfinite(r[s])]


# ---------------------------------------------------------------- the old P4 regressor


def gap_on_own_rate(s: Run, m: Run) -> float:
    """The rule P4's gap growth replaced: the gap regressed on the mask arm's own rate."""
    ss, sm = qs.series(s, "cap_hit"), qs.series(m, "cap_hit")
    stop = min(ss.last_step, sm.last_step)
    _, ys = ss.trailing(qs.B_SMOOTH, stop)
    _, ym = sm.trailing(qs.B_SMOOTH, stop)
    return slope(ym, ys - ym).value


def declared(values: list[float]) -> bool:
    e = t_interval(values)
    return bool(e.finite and (e.lo > 0 or e.hi < 0))


# ---------------------------------------------------------------- the run


def power(results, setup: Setup, n: int, k: int, sigma: dict[str, float]):
    """Per prediction, the share of ``k`` blocks of ``n`` seeds whose verdict is the one the
    planted effect makes true: under the report's rule and alone. An equivalence's shortfall
    is planted beyond the block's own margin (read from the block judged without it)."""
    rule, alone = {}, {}
    for pid in setup.predictions:
        hits_rule = hits_alone = 0
        for runs in blocks(results, setup, n, k):
            margin = 0.0
            if not EXPECTS_DIFFERENCE[pid]:
                aa = next(
                    r for c in judge(runs).cohorts for r in c.results if r.prediction.id == pid
                )
                start = SIGMA_OF[pid][1]
                margin = next(c.margin for c in aa.checks if c.name.startswith(start))
                if not np.isfinite(margin):
                    continue  # no margin: the block cannot call a shortfall (counted a miss)
            j = judge(plant(pid, runs, sigma, margin))
            r = next(r for c in j.cohorts for r in c.results if r.prediction.id == pid)
            hits_rule += r.verdict == PLANTED_TRUTH[pid]
            hits_alone += r.alone == PLANTED_TRUTH[pid]
        rule[pid], alone[pid] = hits_rule / k, hits_alone / k
    return rule, alone


def calibrate(
    setup: Setup, n: int, k: int, workers: int, settings: dict, more_seeds: tuple[int, ...] = ()
) -> dict:
    cfg = sc.preset(setup.scenario).sim_config(**settings)
    seeds = list(range(FIRST_SEED, FIRST_SEED + k * len(setup.roles) * n))
    t0 = time.perf_counter()
    results = run_arms(cfg, [ArmSpec.parse(setup.arm)], seeds, workers=workers)[setup.arm]
    sim_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    aa = [judge(runs) for runs in blocks(results, setup, n, k)]
    by_block = [{r.prediction.id: r for c in j.cohorts for r in c.results} for j in aa]
    rule, alone = {p: Tally() for p in setup.predictions}, {p: Tally() for p in setup.predictions}
    for res in by_block:
        for pid in setup.predictions:
            r = res[pid]
            if r.verdict is None:
                continue
            for tally, verdict in ((rule[pid], r.verdict), (alone[pid], r.alone)):
                tally.judged += 1
                tally.false += is_false(pid, verdict)
    sigma = {}
    for key, (pid, start) in SIGMA_OF.items():
        if pid in setup.predictions:
            d = [
                x
                for res in by_block
                for c in res[pid].checks
                if c.name.startswith(start)
                for x in differences(c)
            ]
            sigma[key] = float(np.std(d, ddof=1)) if len(d) > 1 else float("nan")
    power_rule, power_alone = power(results, setup, n, k, sigma)
    by_n = {m: power(results, setup, m, len(results) // (len(setup.roles) * m), sigma)
            for m in more_seeds if len(results) // (len(setup.roles) * m) >= 1}  # fmt: skip
    extra = {}
    if "P4" in setup.predictions:
        new = [next(c for c in res["P4"].checks if c.name.startswith("growth")) for res in by_block]
        extra["P4 gap growth A/A, on the mean rate"] = sum(
            c.alone in (AS_PREDICTED, OPPOSITE) for c in new
        ) / len(new)
        old = []
        for runs in blocks(results, setup, n, k):
            arm = {r.label: {} for r in runs}
            for r in runs:
                arm[r.label][r.seed] = r
            old.append(
                declared([gap_on_own_rate(arm["survivor"][s], arm["mask"][s]) for s in range(n)])
            )
        extra["P4 gap growth A/A, on the mask's own rate (replaced)"] = float(np.mean(old))
    if "P5" in setup.predictions:
        extra |= p5_level_against_trend(results, setup, n, k, sigma)
    return {
        "setup": setup,
        "rule": rule,
        "alone": alone,
        "power_rule": power_rule,
        "power_alone": power_alone,
        "power_by_seeds": by_n,
        "sigma": sigma,
        "extra": extra,
        "sim_s": sim_s,
        "judge_s": time.perf_counter() - t0,
    }


def p5_level_against_trend(results, setup: Setup, n: int, k: int, sigma) -> dict[str, float]:
    """P5 decided on its level over the run (both turn checks, combined as P5 combines)
    and on its trends: A/A false claims of each, and power for the same planted trend,
    each alone."""
    out = {}
    kinds = {"level": " over the run, drop − never-drop", "trend": "trend of the turns of "}
    for name, planted in (("A/A false claims", False), ("power", True)):
        counts = dict.fromkeys(kinds, 0)
        for runs in blocks(results, setup, n, k):
            j = judge(plant("P5", runs, sigma) if planted else runs)
            r = next(r for c in j.cohorts for r in c.results if r.prediction.id == "P5")
            for kind, mark in kinds.items():
                alone = [c.alone for c in r.checks if mark in c.name and "turns" in c.name]
                v = combine(alone, "all")
                counts[kind] += (v == AS_PREDICTED) if planted else is_false("P5", v)
        for kind, c in counts.items():
            out[f"P5 decided on the {kind}, {name} (alone)"] = c / k
    return out


def report(out: dict, n: int, k: int) -> list[str]:
    s = out["setup"]
    lines = [
        f"== {s.scenario}: arm {s.arm} relabelled as {', '.join(s.roles)}; {k} blocks of "
        f"{n} seeds per arm ({k * len(s.roles) * n} runs; simulated in {out['sim_s']:.0f} s, "
        f"judged in {out['judge_s']:.0f} s)",
        f"{'prediction':<11} {'judged':>6} {'false (rule)':>13} {'bound':>6} "
        f"{'false (alone)':>13} {'bound':>6} {'power (rule)':>12} {'power (alone)':>13}",
    ]
    for pid in s.predictions:
        r, a = out["rule"][pid], out["alone"][pid]
        lines.append(
            f"{pid:<11} {r.judged:>6} {r.false / max(r.judged, 1):>13.3f} "
            f"{upper(r.false, r.judged):>6.3f} {a.false / max(a.judged, 1):>13.3f} "
            f"{upper(a.false, a.judged):>6.3f} {out['power_rule'][pid]:>12.3f} "
            f"{out['power_alone'][pid]:>13.3f}"
        )
    lines.append(
        "σ of the planted effects: " + ", ".join(f"{k} {v:.3g}" for k, v in out["sigma"].items())
    )
    for m, (rule, alone) in out["power_by_seeds"].items():
        blocks_m = len(s.roles) * n * k // (len(s.roles) * m)
        lines.append(
            f"power at n = {m} ({blocks_m} blocks of the same runs), rule / alone: "
            + ", ".join(f"{pid} {rule[pid]:.2f} / {alone[pid]:.2f}" for pid in s.predictions)
        )
    lines += [f"{name}: {v:.3f}" for name, v in out["extra"].items()]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=30, help="disjoint seed blocks (default 30)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm in a block (default 5)")
    p.add_argument("--steps", type=int, default=100, help="trainer steps per run (default 100)")
    p.add_argument("--groups-per-step", type=int, default=8, help="groups per step (default 8)")
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (default: the CPUs)"
    )
    p.add_argument(
        "--power-seeds",
        default="8,10",
        help="more seed counts n to measure power at, comma-separated, by regrouping the same "
        "runs into fewer blocks of n seeds (default 8,10; empty: none)",
    )
    args = p.parse_args()
    try:
        more = tuple(int(x) for x in args.power_seeds.replace(",", " ").split())
    except ValueError:
        p.error(f"--power-seeds={args.power_seeds!r}: seed counts, e.g. 8,10")
    if any(m < 3 for m in more):
        p.error(f"--power-seeds={args.power_seeds!r}: each count at least 3 (a verdict's minimum)")
    t0 = time.perf_counter()
    settings = {"steps": args.steps, "groups_per_step": args.groups_per_step}
    outs = [calibrate(s, args.seeds, args.blocks, args.workers, settings, more) for s in SETUPS]
    lines = []
    for out in outs:
        lines += [*report(out, args.seeds, args.blocks), ""]
    for key in ("rule", "alone"):
        judged = sum(t.judged for o in outs for t in o[key].values())
        false = sum(t.false for o in outs for t in o[key].values())
        power = [v for o in outs for v in o[f"power_{key}"].values()]
        lines.append(
            f"pooled, {key:<5}: false claims {false}/{judged} = {false / judged:.3f} (upper 95% "
            f"bound {upper(false, judged):.3f}; goal <= {GOAL_FALSE:g}, bound <= {GOAL_BOUND:g}); "
            f"power for a planted {EFFECT:g}σ effect at n = {args.seeds}: "
            f"{', '.join(f'{x:.2f}' for x in power)} (goal >= {GOAL_POWER:g})"
        )
    lines.append(f"wall-clock: {time.perf_counter() - t0:.0f} s on {args.workers} worker(s)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
