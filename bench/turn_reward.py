"""Cost of the turn-reached reward hook against Miles' own conversion of the same batch.

A step of ``--groups`` groups x ``--group-size`` rollouts, each one merged multi-turn Miles
``Sample`` of ``--tokens`` response tokens with up to ``--max-turns`` turns (runs of 1s in
the loss mask, one weight version per model call), rewards 0/1. In the same run, best of
``--repeats`` (the two sides interleaved):

- ``conversion``: Miles' ``convert_samples_to_train_data`` with its own reward
  normalization (no hook);
- ``hook + conversion``: the same with ``--custom-reward-post-process-path
  rescue.miles.reward.post_process_rewards`` under ``RESCUE_ESTIMATOR=turn``
  (``RESCUE_TRUNCATED_REWARD=zero`` too, as the R = 0 arm runs it), on samples whose turn
  spans the rollout recorded where it built the loss mask (``rescue.turns.TURN_SPANS_KEY``,
  written before the clock starts, as a rollout writes them before the step): the hook
  does not read the masks;
- ``hook (read back) + conversion``: the same samples without the record, so the hook
  reads each rollout's turns back from its loss mask (the fallback).

Prints the three times and the two ratios to the conversion alone (the target is a ratio
<= 1.5 for the recorded spans), and the time of one pass over the loss masks alone: the
read-back must read every mask once, Miles' conversion reads each once too (``sum``), so
that pass bounds the read-back's ratio from below. Needs Miles
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
    """The step's samples, each with its turn spans recorded as its mask is built."""
    import numpy as np

    from rescue.turns import TurnSpans, record_turn_spans

    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        for k in range(group_size):
            turns = int(rng.integers(1, max_turns + 1))
            # Turn and observation lengths that fill the response exactly.
            cuts = np.sort(rng.choice(np.arange(1, tokens), size=2 * turns - 1, replace=False))
            widths = np.diff(np.r_[0, cuts, tokens])
            mask: list[int] = []
            edges = np.r_[0, np.cumsum(widths)]
            for j, w in enumerate(widths):
                mask += [1 - j % 2] * int(w)
            spans = TurnSpans(edges[0:-1:2], edges[1::2], tokens)  # each call's tokens
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
            record_turn_spans(s.metadata, spans)
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

    from rescue.turns import TURN_SPANS_KEY

    read_back = build(Sample, a.groups, a.group_size, a.tokens, a.max_turns, a.seed)
    for s in read_back:
        del s.metadata[TURN_SPANS_KEY]

    def timed(hook, batch=samples) -> float:
        for s in batch:
            s.opd_reverse_kl = None
        t = time.perf_counter()
        tdc.convert_samples_to_train_data(args, batch, {}, None, hook)
        return time.perf_counter() - t

    def read_masks() -> float:
        t = time.perf_counter()
        for s in samples:
            bytearray(s.loss_mask)
        return time.perf_counter() - t

    # Interleaved, so both sides see the same load on a shared machine.
    runs = [
        (
            timed(None),
            timed(post_process_rewards),
            timed(post_process_rewards, read_back),
            read_masks(),
        )
        for _ in range(a.repeats)
    ]
    base, ours, back, read = (min(r[k] for r in runs) for k in range(4))
    for x, y in zip(samples, read_back, strict=True):  # the same advantages either way
        if not (x.opd_reverse_kl == y.opd_reverse_kl).all():
            raise SystemExit("turn_reward: recorded and read-back spans gave different advantages")
    n_tokens = a.groups * a.group_size * a.tokens
    print(
        f"{a.groups} groups x {a.group_size} rollouts x {a.tokens} tokens "
        f"(<= {a.max_turns} turns), {n_tokens / 1e6:.2f} M tokens, best of {a.repeats}"
    )
    print(f"  conversion                        {base * 1e3:8.1f} ms")
    print(f"  hook + conversion (spans recorded) {ours * 1e3:7.1f} ms")
    print(f"  hook + conversion (read back)     {back * 1e3:8.1f} ms")
    print(f"  ratio, spans recorded             {ours / base:8.2f}x   (target <= 1.5x)")
    print(f"  ratio, read back from the masks   {back / base:8.2f}x")
    print(
        f"  one pass over the loss masks (bytearray, the fastest full read of a list of ints "
        f"we measured): {read * 1e3:.1f} ms = {read / base:.2f}x conversion"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
