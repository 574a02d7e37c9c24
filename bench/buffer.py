"""Cost per group of ``RescueDataBuffer``: put + get + census, against the buffer it replaces.

With Miles importable (``MILES_SRC=/path/to/miles`` or Miles installed) the baseline is
Miles' ``DefaultDataBuffer`` and ours wraps it; otherwise the baseline is a plain FIFO
(``FifoStore`` from ``tests/buffer_store.py``, on the tests' ``Sample``) and ours wraps
that. Both sides see the same stream in the same run: steps
of ``--batch`` groups of ``--group-size`` samples, each step put, then got, then
``get_metrics()`` (where our census settles and reports). Scenarios:

- ``fresh``: every group fresh, samples without metadata (a math-RL batch);
- ``agentic``: every group fresh, samples with agent metadata (exit status, turns), so
  every rollout goes through the full classifier;
- ``stale``: a third of the groups one version too old, ``RESCUE_ARM=protect a=0.5``
  (Miles' buffer drops them inside ``get``; a plain FIFO returns them).

Prints µs/group for each side, the ratio, and the targets (ours <= 1.5x the baseline,
< 100 µs/group). Best of ``--repeats`` runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

from rescue.gate import Gate
from rescue.miles.buffer import RescueDataBuffer
from rescue.samples import group_staleness

# Without Miles, the tests' stand-ins: the FIFO store and Sample (tests/).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from buffer_store import FifoStore
from fake_sample import Sample


def miles_parts() -> Any:
    """Miles' buffer and Sample, or None when Miles cannot be imported."""
    if src := os.environ.get("MILES_SRC"):
        sys.path.insert(0, os.path.abspath(src))
    try:
        from miles.rollout.fully_async_data_buffer import (
            DataBufferConstructorInput,
            DataBufferInput,
            DefaultDataBuffer,
        )
        from miles.utils.types import Sample
    except ImportError:
        return None
    return SimpleNamespace(
        ctor=DataBufferConstructorInput,
        entry=DataBufferInput,
        default=DefaultDataBuffer,
        sample=lambda status, **kw: Sample(status=Sample.Status(status), **kw),
    )


def make_stream(n_groups: int, size: int, batch: int, scenario: str, make_sample) -> list:
    """Groups with the weight version of the step they belong to (one older for stale ones)."""
    groups = []
    for g in range(n_groups):
        step = g // batch
        version = step - 2 if scenario == "stale" and g % 3 == 0 else step
        group = []
        for i in range(size):
            metadata = {}
            if scenario == "agentic":
                metadata = {
                    "exit_status": "Submitted" if i % 4 else "LimitsExceeded",
                    "agent_metrics": {"turns": 5 + i},
                    "ran_repo_tests": i % 2 == 0,
                }
            group.append(
                make_sample(
                    "completed",
                    group_index=g,
                    index=g * size + i,
                    reward=float(i % 2),
                    weight_versions=[str(max(version, 0))] * 3,
                    metadata=metadata,
                )
            )
        groups.append(group)
    return groups


async def drive(buffer: Any, entries: list, batch: int, kept_per_step: list[int]) -> float:
    """Seconds for: per step, put the step's groups, get the kept ones, get_metrics()."""
    t0 = time.perf_counter()
    for step, n_kept in enumerate(kept_per_step):
        for e in entries[step * batch : (step + 1) * batch]:
            await buffer.put(e)
        for _ in range(n_kept):
            await buffer.get(current_version=step)
        buffer.get_metrics()
    return time.perf_counter() - t0


def kept_counts(stream: list, batch: int, gate: Gate) -> list[int]:
    """Groups each step's get() calls return (the others are dropped inside get())."""
    kept = [0] * ((len(stream) + batch - 1) // batch)
    for g, group in enumerate(stream):
        kept[g // batch] += gate.decide(g, group_staleness(group, g // batch)).keep
    return kept


def measure(scenario: str, args: argparse.Namespace, miles: Any) -> tuple[float, float]:
    make_sample = (
        miles.sample if miles else (lambda status, **kw: Sample(status=Sample.Status(status), **kw))
    )
    buffer_args = SimpleNamespace(
        rollout_batch_size=args.batch,
        async_data_buffer_capacity_factor=2.0,
        max_weight_staleness=1,
        dynamic_sampling_filter_path=None,
        reward_key=None,
    )
    env = {"RESCUE_ARM": "protect", "RESCUE_A": "0.5", "RESCUE_SEED": "0"}
    ours_gate = Gate.from_env(env, max_staleness=1)
    # Miles drops stale groups inside get(); a plain FIFO returns every group.
    base_gate = Gate(arm="drop" if miles else "never-drop", max_staleness=1)
    best = [float("inf"), float("inf")]
    for _ in range(args.repeats):
        for side in (0, 1):
            stream = make_stream(args.groups, args.group_size, args.batch, scenario, make_sample)
            wrap = (
                miles.entry
                if miles
                else (
                    lambda prompt_group, group: SimpleNamespace(
                        prompt_group=prompt_group, group=group
                    )
                )
            )
            entries = [wrap(prompt_group=g, group=g) for g in stream]
            ctor = (miles.ctor if miles else SimpleNamespace)(
                args=buffer_args, unused_handler_fn=lambda prompt_group: None
            )
            if side == 0:
                buffer = miles.default(ctor) if miles else FifoStore(2 * args.batch)
                kept = kept_counts(stream, args.batch, base_gate)
            else:
                store = None if miles else FifoStore(2 * args.batch)
                buffer = RescueDataBuffer(ctor, env=env, store=store)
                kept = kept_counts(stream, args.batch, ours_gate)
            seconds = asyncio.run(drive(buffer, entries, args.batch, kept))
            best[side] = min(best[side], seconds / args.groups * 1e6)
    return best[0], best[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=10_000, help="groups per run (default 10000)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per group (default 8)")
    parser.add_argument("--batch", type=int, default=32, help="groups per step (default 32)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per side, best kept (default 3)"
    )
    args = parser.parse_args()
    miles = miles_parts()
    baseline = "Miles DefaultDataBuffer" if miles else "plain FIFO (Miles not importable)"
    print(
        f"baseline: {baseline}; {args.groups} groups x {args.group_size} samples, {args.batch}/step"
    )
    print(f"{'scenario':<10} {'baseline us/group':>18} {'rescue us/group':>16} {'ratio':>7}")
    for scenario in ("fresh", "agentic", "stale"):
        base, ours = measure(scenario, args, miles)
        print(f"{scenario:<10} {base:>18.1f} {ours:>16.1f} {ours / base:>6.2f}x")
    print("targets: rescue <= 1.5x the baseline and < 100 us/group")
    return 0


if __name__ == "__main__":
    sys.exit(main())
