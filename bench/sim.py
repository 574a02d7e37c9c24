"""Simulated rollouts per second: the whole simulator against its episode floor.

One run = 300 trainer steps × 16 groups × 8 rollouts, up to 40 turns each, one core.
Target: under 20 s per arm and seed. Measured in the same process, per arm:

- simulator: ``Simulation.run`` (episodes, event loop, gate, filter, normalizer,
  census, the policy update);
- floor: ``env.run_episodes`` alone on the same number of rollouts, in chunks of
  the same size, under the initial policy (what no bookkeeping could go below).

Prints both times (CPU seconds of this process), rollouts per second and the ratio.
Run: ``.venv/bin/python bench/sim.py [--steps 300] [--arms drop,protect:0.5,turn-baseline]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rescue.sim import ArmSpec, SimConfig, Simulation, env
from rescue.sim.policy import Policy

TARGET_S = 20.0


def floor_seconds(cfg: SimConfig, n_groups: int) -> float:
    rng = np.random.default_rng(0)
    probs = Policy(np.array(cfg.initial_logits)).probs()
    chunk = 2 * cfg.groups_per_step
    t0 = time.process_time()
    for _ in range(int(np.ceil(n_groups / chunk))):
        k = np.repeat(env.draw_tasks(rng, chunk, cfg), cfg.group_size)
        env.run_episodes(probs, k, rng, cfg)
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="trainer steps (default 300)")
    p.add_argument(
        "--arms",
        default="drop,protect:0.5,mask,turn-baseline",
        help="arms to time (default: %(default)s)",
    )
    args = p.parse_args()
    cfg = SimConfig(steps=args.steps)
    print(
        f"{cfg.steps} steps x {cfg.groups_per_step} groups x {cfg.group_size} rollouts, "
        f"turn cap {cfg.max_turns}; target < {TARGET_S:g} s per arm and seed (one core)"
    )
    print(
        f"{'arm':<16}{'simulator s':>12}{'rollouts/s':>12}{'floor s':>10}{'ratio':>8}{'vs target':>11}"
    )
    for text in args.arms.split(","):
        arm = ArmSpec.parse(text)
        sim = Simulation(cfg, arm, 0)
        t0 = time.process_time()
        sim.run()
        t_sim = time.process_time() - t0
        generated = sim.census.totals()["entered"]  # groups played to the end
        t_floor = floor_seconds(cfg, generated)
        rollouts = generated * cfg.group_size
        print(
            f"{arm.label:<16}{t_sim:>12.2f}{rollouts / t_sim:>12.0f}{t_floor:>10.2f}"
            f"{t_sim / t_floor:>8.2f}{t_sim / TARGET_S:>10.2f}x"
        )


if __name__ == "__main__":
    main()
