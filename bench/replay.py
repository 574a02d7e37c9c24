"""Benchmark of `rescue replay`: the census of a 128-sample dump and all arms' advantages.

One step of 16 groups x 8 rollouts, each rollout 30k response tokens over 1-40 turns
(2/3 action tokens, 1/3 observation tokens), in the exact ``Sample.to_dict()`` schema.

- load: rescue's restricted loader (``read_payload``) beside torch's ``weights_only=True``
  loader and the unrestricted ``weights_only=False`` one (the floor);
- census: the parse (trajectories, outcomes, per-token turn indices) + ``outcome_metrics``
  of the loaded dict, as a ratio of the load;
- advantages: per-token advantages of every arm (a, b, c, d0.3, d0.6, d1, e) beside a
  plain group-mean advantage broadcast over the same tokens (the memory-bound floor).

Run: ``.venv/bin/python bench/replay.py`` (needs torch, the ``[replay]`` extra).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np


def make_payload(
    groups: int = 16, G: int = 8, tokens: int = 30_000, cap: int = 40, seed: int = 0
) -> dict:
    from rescue.replay.synthetic import sample_dict

    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        for k in range(G):
            turns = int(rng.integers(1, cap + 1))
            capped = turns == cap
            per_turn = tokens // turns
            mask = np.zeros(tokens, dtype=np.int64)
            for t in range(turns):
                start = t * per_turn
                mask[start : start + (2 * per_turn) // 3] = 1
            mask[turns * per_turn :] = 0
            solved = (not capped) and rng.random() < 0.4
            samples.append(
                sample_dict(
                    group_index=g,
                    index=g * G + k,
                    tokens=[1] * 64 + rng.integers(0, 32_000, tokens).tolist(),
                    response_length=tokens,
                    loss_mask=mask.tolist(),
                    reward=1.0 if solved else 0.0,
                    status="truncated" if capped else "completed",
                    weight_versions=["0"] * turns,
                )
            )
    return {"rollout_id": 0, "metadata": {}, "samples": samples}


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    import torch

    from rescue.advantages import group_advantages
    from rescue.census import outcome_metrics
    from rescue.replay.arms import broadcast, build_batch, token_advantages
    from rescue.replay.dumps import parse_payload, read_payload

    payload = make_payload()
    n = len(payload["samples"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rollout_0.pt")
        torch.save(payload, path)
        size = os.path.getsize(path) / 2**20

        loaded = read_payload(path)
        t_load = best_of(lambda: read_payload(path), 2)
        t_torch_safe = best_of(lambda: torch.load(path, weights_only=True), 2)
        t_unsafe = best_of(lambda: torch.load(path, weights_only=False), 2)

    def census():
        d = parse_payload(loaded, source=path)
        return outcome_metrics([t.record for t in d.trajectories])

    t_census = best_of(census)
    print(
        f"dump: {n} samples x {payload['samples'][0]['response_length']} response tokens, {size:.0f} MiB"
    )
    print(f"load     torch.load weights_only=False {t_unsafe:8.3f} s   (no safety: the floor)")
    print(
        f"load     torch.load weights_only=True  {t_torch_safe:8.3f} s   ratio {t_torch_safe / t_unsafe:5.2f}x"
    )
    print(
        f"load     rescue read_payload           {t_load:8.3f} s   ratio {t_load / t_unsafe:5.2f}x"
    )
    print(
        f"census   parse + outcome census        {t_census:8.3f} s   ratio {t_census / t_load:5.2f}x of the load"
    )

    batch = build_batch(parse_payload(payload).trajectories)
    T = int(batch.counts.sum())

    def floor():
        return broadcast(batch, group_advantages(batch.R0, batch.group))

    def arms():
        return token_advantages(batch)

    t_floor = best_of(floor, 5)
    t_arms = best_of(arms, 5)
    print(
        f"advantages over {T / 1e6:.2f}M tokens ({batch.n} rollouts, {int(batch.group.max()) + 1} groups):"
    )
    print(f"  group-mean broadcast (floor)  {t_floor:8.4f} s")
    print(
        f"  all arms a,b,c,d x3,e        {t_arms:8.4f} s   ratio {t_arms / t_floor:5.2f}x (7 arms)"
    )


if __name__ == "__main__":
    main()
