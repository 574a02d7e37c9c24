"""The judge against the truth on the map's cells: judged trends beside the exact ones.

Runs the arms zero, mask and matched of ``budget-three-outcome`` on two cells of the
declared map (``rescue/sim/maps/p3-drift.toml``): easy tasks under an 8-turn cap, and the
scenario's tasks under its 12-turn cap, both at lr 0.1 and 300 steps, seeds 0-5, with the
exact terms logged (``subsidy``). For each cell and arm it prints, side by side on the same
runs (``rescue.judge.truth``):

- the cap-hit trend against b at matched b: the mean judged per-run slope (the judge's
  rule, against the prior b), the mean exact one (P(cap) on J over the same steps), their
  ratio and how many runs have the exact sign; beside them the slope against the step's own
  b, the rule the judge had before (read off the same rollouts as the cap-hit rate);
- P3's deciding difference mask − zero, judged and exact, with their 95% t intervals over
  the seeds and the exact one in units of its seed SD;
- the drift per 100 steps and the final success and cap-hit levels, judged over exact.

Run: ``.venv/bin/python bench/judge_truth.py [--seeds 6] [--steps 300] [--workers N]``;
prints the wall-clock it took.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge import truth
from rescue.judge.stats import slope, t_interval
from rescue.sim import scenario as sc
from rescue.sim.arms import parse_arms
from rescue.sim.runner import run_arms
from rescue.sim.summary import cohort

CELLS = {
    "easy tasks, 8-turn cap, lr 0.1": {"difficulty": ((1, 0.5), (2, 0.5)), "max_turns": 8},
    "the scenario's tasks, 12-turn cap, lr 0.1": {},
}


def same_step_slope(run) -> float:
    """The rule the judge had before: the per-step cap-hit rate on the same step's b."""
    b = qs.series(run, "b").trailing(1)[1]
    cap = qs.series(run, "cap_hit").trailing(1, len(b) - 1)[1]
    _, smooth = qs.series(run, "b").trailing(qs.B_SMOOTH)
    sel = np.nan_to_num(smooth, nan=-1) > qs.B_THRESHOLD
    return slope(b[sel], cap[sel]).value


def one_cell(name: str, settings: dict, seeds: int, steps: int, workers: int) -> None:
    cfg = sc.preset("budget-three-outcome").sim_config(
        lr=0.1, steps=steps, subsidy=True, **settings
    )
    runs = run_arms(
        cfg, parse_arms("zero,mask,matched"), list(range(seeds)), workers=workers, progress=False
    )
    arms = cohort(runs)
    pairs = truth.fidelity(arms, "zero")
    print(f"\n## {name} ({seeds} seeds × {steps} steps)\n")
    print("| arm | judged trend | exact trend | judged / exact | same sign | same-step b trend "
          "| same sign | drift judged / exact | final success judged / exact | final cap-hit "
          "judged / exact |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    agree = {(a.quantity, a.label): a for a in truth.summary(pairs)}
    exact = {(p.label, p.seed): p.exact for p in pairs if p.quantity == "cap_trend"}
    for label, runs in arms.items():
        t = agree[("cap_trend", label)]
        old = [same_step_slope(r) for r in runs.values()]
        old_sign = sum(
            np.sign(v) == np.sign(exact[(label, s)]) for s, v in zip(runs, old, strict=True)
        )
        d, fs, fc = (agree[(q, label)] for q in ("cap_drift", "final_success", "final_cap_hit"))
        print(f"| {label} | {t.judged_mean:+.3f} | {t.exact_mean:+.3f} | {t.ratio:.2f} | "
              f"{t.same_sign}/{t.runs} | {np.mean(old):+.3f} | {old_sign}/{len(old)} | "
              f"{d.ratio:.2f} | {fs.ratio:.3f} | {fc.ratio:.3f} |")  # fmt: skip
    for arm in ("mask", "matched"):
        judged, exact_d = truth.differences(pairs, "cap_trend", arm, "zero")
        j, e = t_interval(judged), t_interval(exact_d)
        sd = float(np.std(exact_d, ddof=1)) if len(exact_d) > 1 else float("nan")
        print(f"\n{arm} − zero, cap-hit trend against b: judged {j.value:+.3f} "
              f"[{j.lo:+.3f}, {j.hi:+.3f}]; exact {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}], "
              f"{e.value / sd:+.1f} seed SDs of the exact difference; judged / exact "
              f"{j.value / e.value:.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    for name, settings in CELLS.items():
        one_cell(name, settings, args.seeds, args.steps, args.workers)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
