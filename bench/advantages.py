"""Benchmark: turn-reached baseline + per-token broadcast vs a plain group-mean broadcast.

One training step of B=16 groups x G=8 rollouts, each up to 40 turns and 30k tokens
(16*8*30000 ≈ 3.8M tokens). Two floors, both a plain group-mean advantage broadcast:

- write-only: each rollout's scalar written to all its tokens (the memory-bound minimum
  of producing the output; reads no per-token input);
- through the token mask: the same scalar on action tokens, 0 on observation tokens,
  which reads the same per-token turn array the turn-reached side reads.

The turn-reached side builds the [B, G, L_max] baseline table, then in two input forms:

- per-token turn index: checks every token's turn index and gathers the table;
- turn spans (``rescue.turns.TurnSpans``, the runs of the loss mask): checks the spans and
  writes each segment's value with one ``np.repeat``; reads no per-token input.

Both give the same numbers (checked here). Deriving the spans from the loss mask is data
preparation, done once per batch like the turn index array; its time is printed apart.
Target: within 3x of the floor and under 0.2 s.

Run: .venv/bin/python bench/advantages.py
"""

from __future__ import annotations

import time

import numpy as np

from rescue.advantages import group_advantages, per_token_advantages
from rescue.turns import turn_spans

B, G, L_MAX, T = 16, 8, 40, 30_000
REPEATS = 7


def make_step(seed: int = 0):
    """Rewards, turn counts and each token's turn index (0 = observation tokens)."""
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, size=(B, G)).astype(np.float64)
    lengths = rng.integers(1, L_MAX + 1, size=(B, G))
    turns = np.zeros((B, G, T), dtype=np.int64)
    for b in range(B):
        for i in range(G):
            # each turn: some action tokens (turn index) then observation tokens (0)
            bounds = np.sort(rng.choice(np.arange(1, T), size=2 * lengths[b, i] - 1, replace=False))
            seg = np.split(np.arange(T), bounds)
            for k, idx in enumerate(seg):
                turns[b, i, idx] = k // 2 + 1 if k % 2 == 0 else 0
    return rewards, lengths, turns


def best_of(fn, repeats: int = REPEATS) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    rewards, lengths, turns = make_step()
    gid = np.repeat(np.arange(B), G)

    def floor():
        a = group_advantages(rewards.reshape(-1), gid, std_normalize=False).astype(np.float32)
        out = np.empty((B * G, T), dtype=np.float32)
        out[...] = a[:, None]
        return out

    def floor_masked():
        a = group_advantages(rewards.reshape(-1), gid, std_normalize=False).astype(np.float32)
        return np.where(turns > 0, a.reshape(B, G, 1), np.float32(0.0))

    def turn_reached():
        return per_token_advantages(rewards, lengths, turns)

    spans = turn_spans(turns > 0)

    def turn_reached_spans():
        return per_token_advantages(rewards, lengths, spans)

    same = np.array_equal(np.stack(turn_reached_spans()).reshape(B, G, T), turn_reached())
    if not same:
        raise SystemExit("the span form and the turn index form disagree")
    t_floor = best_of(floor)
    t_masked = best_of(floor_masked)
    t_turn = best_of(turn_reached)
    t_spans = best_of(turn_reached_spans)
    t_derive = best_of(lambda: turn_spans(turns > 0))
    n_tok = B * G * T
    print(
        f"tokens per step        {n_tok:,} ({B} groups x {G} rollouts x {T:,} tokens, <= {L_MAX} turns)"
    )
    print(f"group-mean broadcast, write-only      {t_floor * 1e3:8.2f} ms  (floor 1)")
    print(f"group-mean broadcast, via token mask  {t_masked * 1e3:8.2f} ms  (floor 2)")
    print(f"turn-reached, per-token turn index    {t_turn * 1e3:8.2f} ms  (target < 200 ms)")
    print(f"  ratio to floor 1                    {t_turn / t_floor:8.2f}x")
    print(f"  ratio to floor 2                    {t_turn / t_masked:8.2f}x  (target <= 3x)")
    print(f"turn-reached, turn spans              {t_spans * 1e3:8.2f} ms  (target < 200 ms)")
    print(f"  ratio to floor 1                    {t_spans / t_floor:8.2f}x  (target <= 3x)")
    print(f"  ratio to floor 2                    {t_spans / t_masked:8.2f}x")
    print(f"data preparation: turn_spans(mask)    {t_derive * 1e3:8.2f} ms  (once per batch)")


if __name__ == "__main__":
    main()
