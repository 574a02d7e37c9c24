"""Simulated rollouts per second: the whole simulator against its episode floor, per scenario.

For each scenario (``rescue sim --scenarios``) and each of its arms, one seed at the
scenario's settings, measured in this process (CPU seconds):

- simulator: ``Simulation.run`` (episodes, event loop, gate, filter, normalizer, census,
  the policy update, the launch view);
- floor: ``env.play`` alone on the same number of groups, in chunks of the same size,
  under the initial policy (what no bookkeeping could go below).

Prints both, rollouts per second and the ratio, then the CPU seconds ``make demo`` needs
(every scenario's distinct arms × 5 seeds, the judge and plots aside) and that over 2
cores against its 90 s target. Run: ``.venv/bin/python bench/sim.py [--scenario NAME]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rescue.sim import Simulation, env
from rescue.sim import scenario as sc
from rescue.sim.arms import parse_arms
from rescue.sim.config import SimConfig
from rescue.sim.policy import Policy

DEMO_SEEDS = 5
DEMO_TARGET_S = 90.0
CORES = 2


def floor_seconds(cfg: SimConfig, n_groups: int) -> float:
    rng = np.random.default_rng(0)
    probs = Policy(np.array(cfg.initial_logits)).probs()
    chunk = 2 * cfg.groups_per_step
    t0 = time.process_time()
    for _ in range(int(np.ceil(n_groups / chunk))):
        k = np.repeat(env.draw_tasks(rng, chunk, cfg), cfg.group_size)
        env.play(probs, k, rng, cfg)
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="all", help="a scenario name, or all (default: all)")
    args = p.parse_args()
    names = sc.names() if args.scenario == "all" else [args.scenario]
    print(
        f"{'scenario':<22}{'arm':<20}{'steps':>6}{'sim s':>8}{'rollouts/s':>12}"
        f"{'floor s':>9}{'ratio':>7}"
    )
    demo_cpu = 0.0
    for name in names:
        s = sc.preset(name)
        cfg = s.sim_config()
        seen = set()
        for arm in parse_arms(",".join(s.arms)):
            if arm.behaviour in seen:  # the runner simulates such arms once
                continue
            seen.add(arm.behaviour)
            sim = Simulation(cfg, arm, 0)
            t0 = time.process_time()
            sim.run()
            t_sim = time.process_time() - t0
            groups = sim.census.totals()["entered"]
            t_floor = floor_seconds(cfg, groups)
            demo_cpu += t_sim * DEMO_SEEDS
            print(
                f"{name:<22}{arm.label:<20}{cfg.steps:>6}{t_sim:>8.2f}"
                f"{groups * cfg.group_size / t_sim:>12.0f}{t_floor:>9.2f}{t_sim / t_floor:>7.2f}"
            )
    if args.scenario == "all":
        print(
            f"make demo: {demo_cpu:.1f} CPU s of simulation ({DEMO_SEEDS} seeds), "
            f"{demo_cpu / CORES:.1f} s on {CORES} cores: {demo_cpu / CORES / DEMO_TARGET_S:.2f}x "
            f"the {DEMO_TARGET_S:g} s target before the judge and plots"
        )


if __name__ == "__main__":
    main()
