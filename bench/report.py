"""Benchmark of `rescue report`: judging 8 arms x 5 seeds x 1000 steps from census JSONL.

The inputs are written first: one JSONL file per run in the simulator's layout
(``census/<arm>-seed<s>.jsonl``), every row with the keys a simulated step logs (taken
from a real simulator step) and values that drift and vary by seed. Then, in this
process:

- plain: ``json.loads`` of every line of every file (the floor any reader pays);
- read: ``rescue.judge.inputs.read_inputs`` on the directory (files, names, rows);
  both best of ``REPEAT``, alternating;
- judge: every prediction on the cohort (``report.judge``) and the markdown and JSON;

Prints the times, the read/plain ratio (target within 2x) and read + judge, including the
one import of scipy.stats (target under 10 s). Run: ``.venv/bin/python bench/report.py [--steps 1000] [--seeds 5]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

ARMS = (
    "drop",
    "never-drop",
    "protect-a0.5",
    "protect-a0.1",
    "mask",
    "zero",
    "survivor",
    "turn",
)
TARGET_RATIO = 2.0
TARGET_S = 10.0
REPEAT = 2


def template() -> dict[str, float]:
    """The keys (and typical values) of one simulated step, with the baseline paid added."""
    from rescue.sim import ArmSpec, SimConfig, Simulation

    cfg = SimConfig(steps=3, groups_per_step=4, group_size=4, concurrency=4, max_turns=12)
    step = Simulation(cfg, ArmSpec("mask"), 0).run()[-1]
    step["rollout/census/b_paid/masked"] = 0.3
    step["rollout/census/b_paid/masked_rollouts"] = 20.0
    return step


def write_inputs(out: Path, steps: int, seeds: int) -> list[Path]:
    base = template()
    keys = sorted(base)
    paths = []
    census = out / "census"
    census.mkdir(parents=True)
    for a, arm in enumerate(ARMS):
        for seed in range(seeds):
            rng = np.random.default_rng(1000 * a + seed)
            drift = np.linspace(0.0, 0.3, steps)
            noise = rng.normal(0, 0.05, (steps, len(keys)))
            values = np.array([base[k] for k in keys]) * (1 + drift[:, None] * 0.5 + noise)
            path = census / f"{arm}-seed{seed}.jsonl"
            with path.open("w") as f:
                for i in range(steps):
                    row = {"arm": arm, "seed": seed, "rollout/step": i}
                    row.update(zip(keys, map(float, values[i]), strict=True))
                    row["sim/time"] = 10.0 * (i + 1)
                    f.write(json.dumps(row) + "\n")
            paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="steps per run (default 1000)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (default 5)")
    args = p.parse_args()

    t0 = time.perf_counter()
    import scipy.stats  # noqa: F401 - the judge imports it on first use; timed apart

    scipy_s = time.perf_counter() - t0
    from rescue.judge.inputs import read_inputs
    from rescue.judge.report import as_json, judge, markdown

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim"
        paths = write_inputs(out, args.steps, args.seeds)
        size = sum(p.stat().st_size for p in paths) / 1e6

        def plain_pass() -> int:
            n = 0
            for path in paths:
                with open(path) as f:
                    for line in f:
                        json.loads(line)
                        n += 1
            return n

        # Best of REPEAT, the two readers alternating (the files are in the page cache).
        plain = read = float("inf")
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            n = plain_pass()
            plain = min(plain, time.perf_counter() - t0)
            t0 = time.perf_counter()
            inputs = read_inputs([out], progress=False)
            read = min(read, time.perf_counter() - t0)

        t0 = time.perf_counter()
        j = judge(inputs.runs, inputs.replays, notes=inputs.notes)
        markdown(j)
        json.dumps(as_json(j))
        judged = time.perf_counter() - t0

    print(
        f"{len(ARMS)} arms x {args.seeds} seeds x {args.steps} steps: {len(paths)} files, "
        f"{n} rows, {size:.0f} MB"
    )
    print(f"{'plain json.loads':<22}{plain:8.2f} s")
    print(
        f"{'read (rescue)':<22}{read:8.2f} s   ratio {read / plain:.2f}x (target < {TARGET_RATIO:g}x)"
    )
    print(f"{'judge + report':<22}{judged:8.2f} s   (+ {scipy_s:.2f} s importing scipy.stats once)")
    total = read + judged + scipy_s
    print(f"{'read + judge':<22}{total:8.2f} s   (target < {TARGET_S:g} s)")


if __name__ == "__main__":
    main()
