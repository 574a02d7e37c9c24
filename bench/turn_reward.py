"""Cost of the turn-reached reward hook against Miles' own conversion of the same batch.

A step of ``--groups`` groups x ``--group-size`` rollouts, each one merged multi-turn Miles
``Sample`` of ``--tokens`` response tokens with up to ``--max-turns`` turns (runs of 1s in
the loss mask, one weight version per model call), rewards 0/1. In the same run, best of
``--repeats`` (the two sides interleaved):

- ``conversion``: Miles' ``convert_samples_to_train_data`` with its own reward
  normalization (no hook);
- ``hook + conversion``: the same with ``--custom-reward-post-process-path
  rescue.miles.reward.post_process_rewards`` under ``RESCUE_ESTIMATOR=turn``
  (``RESCUE_TRUNCATED_REWARD=zero`` too, as the R = 0 arm runs it).

Prints both times and their ratio (the target is a ratio <= 1.5), and the time of one pass
over the loss masks alone: the hook must read every mask once to find the turns, Miles'
conversion reads each once too (``sum``), so that pass bounds the ratio from below. Needs Miles
(``MILES_SRC=/path/to/miles``) and the ``[integration]`` extra; without them it says so
and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace


def miles_parts():
    """Miles' conversion module and Sample, or None."""
    if src := os.environ.get("MILES_SRC"):
        sys.path.insert(0, os.path.abspath(src))
    try:
        from miles.ray.rollout import train_data_conversion
        from miles.utils.types import Sample
    except ImportError:
        return None
    return train_data_conversion, Sample


def build(Sample, groups: int, group_size: int, tokens: int, max_turns: int, seed: int) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        for k in range(group_size):
            turns = int(rng.integers(1, max_turns + 1))
            # Turn and observation lengths that fill the response exactly.
            cuts = np.sort(rng.choice(np.arange(1, tokens), size=2 * turns - 1, replace=False))
            widths = np.diff(np.r_[0, cuts, tokens])
            mask: list[int] = []
            for j, w in enumerate(widths):
                mask += [1 - j % 2] * int(w)
            s = Sample(
                group_index=g,
                index=g * group_size + k,
                reward=float(rng.random() < 0.3),
                tokens=[1] * (200 + tokens),
                response_length=tokens,
                loss_mask=mask,
                weight_versions=["3"] * turns,
            )
            s.status = Sample.Status.TRUNCATED if turns == max_turns else Sample.Status.COMPLETED
            samples.append(s)
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=16, help="groups per step (default 16)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per group (default 8)")
    p.add_argument("--tokens", type=int, default=30_000, help="response tokens (default 30000)")
    p.add_argument(
        "--max-turns", type=int, default=40, help="most turns a rollout has (default 40)"
    )
    p.add_argument(
        "--repeats", type=int, default=9, help="runs of each side; best kept (default 9)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the batch (default 0)")
    a = p.parse_args(argv)
    parts = miles_parts()
    if parts is None:
        print(
            "turn_reward: needs Miles (MILES_SRC=/path/to/miles) and the [integration] extra; skipped"
        )
        return 0
    tdc, Sample = parts
    from rescue.miles.loss import LOSS_PATH
    from rescue.miles.reward import post_process_rewards

    samples = build(Sample, a.groups, a.group_size, a.tokens, a.max_turns, a.seed)
    args = SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        normalize_advantages=False,
        reward_key=None,
        n_samples_per_prompt=a.group_size,
        rollout_batch_size=a.groups,
        use_dynamic_global_batch_size=False,
        use_opd=False,
        loss_type="custom_loss",
        custom_loss_function_path=LOSS_PATH,
        object_store_backend="ray",
    )
    os.environ["RESCUE_ESTIMATOR"] = "turn"
    os.environ["RESCUE_TRUNCATED_REWARD"] = "zero"

    def timed(hook) -> float:
        for s in samples:
            s.opd_reverse_kl = None
        t = time.perf_counter()
        tdc.convert_samples_to_train_data(args, samples, {}, None, hook)
        return time.perf_counter() - t

    def read_masks() -> float:
        t = time.perf_counter()
        for s in samples:
            bytearray(s.loss_mask)
        return time.perf_counter() - t

    # Interleaved, so both sides see the same load on a shared machine.
    runs = [(timed(None), timed(post_process_rewards), read_masks()) for _ in range(a.repeats)]
    base, ours, read = (min(r[k] for r in runs) for k in range(3))
    n_tokens = a.groups * a.group_size * a.tokens
    print(
        f"{a.groups} groups x {a.group_size} rollouts x {a.tokens} tokens "
        f"(<= {a.max_turns} turns), {n_tokens / 1e6:.2f} M tokens, best of {a.repeats}"
    )
    print(f"  conversion            {base * 1e3:8.1f} ms")
    print(f"  hook + conversion     {ours * 1e3:8.1f} ms")
    print(f"  ratio                 {ours / base:8.2f}x   (target <= 1.5x)")
    print(
        f"  of which one pass over the loss masks (bytearray, the fastest full read of a "
        f"list of ints we measured): {read * 1e3:.1f} ms = {read / base:.2f}x conversion"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
