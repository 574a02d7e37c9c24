"""What a seed budget can decide, before any run: each prediction's chance of a verdict.

``rescue power`` simulates replicates of a report's runs and judges them with the judge's own
code (``rescue.judge.power``): for n seeds per arm (2-10) and a true effect of e seed SDs
(0.5, 1, 1.5, 2, 3, and none), the share of replicates in which each prediction gets a
decisive verdict, and in which it makes a false claim, under the report's family-wise rule
and alone. The replicates' noise (``--noise``) is drawn from simulated runs of the
report's regime (``rescue.sim.power_pool``, cached), or from independent normal noise
(``synthetic``, quick). Examples::

    rescue power                                  # q2's and q3's reports, 2-10 seeds
    rescue power --question q2 --seeds 3 --line   # the one line make q2 prints
    rescue power --arms zero,mask --seeds 2 --gate   # exit 2: the judge would decide nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rescue import arms, flags
from rescue.errors import InputError

QUESTIONS = ("q2", "q3")
NOISES = ("sim", "synthetic")


def question_arms(question: str) -> list[str]:
    """The arms a question's command runs on the cluster (``rescue.arms.question_runs``)."""
    return [arm if a is None else f"{arm}:{a:g}" for arm, a in arms.question_runs(question)]


def _numbers(text: str, flag: str, kind=float) -> list:
    try:
        if kind is int and "-" in text and "," not in text:
            lo, hi = (int(x) for x in text.split("-"))
            return list(range(lo, hi + 1))
        return [kind(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise InputError(f"{flag}={text!r}; allowed: numbers separated by commas") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--question",
        choices=(*QUESTIONS, "all"),
        default="all",
        help="the report of a question's arms on the cluster (default: all: q2's and q3's)",
    )
    which.add_argument(
        "--arms",
        help="the report of these arms instead, comma-separated, as the launchers name them "
        f"({', '.join(arms.names())}; protect as protect:A, e.g. protect:0.5)",
    )
    parser.add_argument(
        "--seeds", default="2-10", help="seeds per arm: N, N-M or a list (default: 2-10)"
    )
    parser.add_argument(
        "--effects",
        default="0.5,1,1.5,2,3",
        help="true effects in seed SDs, besides none (default: 0.5,1,1.5,2,3)",
    )
    parser.add_argument(
        "--replicates",
        type=flags.integer(2),
        default=None,
        help="replicates (default: 300; 100 with --line)",
    )
    parser.add_argument(
        "--rng-seed",
        type=flags.NON_NEGATIVE,
        default=0,
        help="seed of the replicates' draws (default: 0)",
    )
    parser.add_argument(
        "--line",
        action="store_true",
        help="print one line per report: the chance of a verdict at 1.5 seed SDs and the "
        "false claims with no effect, for one --seeds value (what make q2, make q3 and "
        "make rlvr-sweep print before submitting)",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="exit 2 when --seeds is below the judge's minimum for a prediction the arms "
        "compare, naming it (default: report it only)",
    )
    parser.add_argument(
        "--force", action="store_true", help="with --gate: warn instead of refusing (FORCE=1)"
    )
    parser.add_argument(
        "--noise",
        choices=NOISES,
        default="sim",
        help="where a replicate's runs come from: sim (simulated runs of the report's regime, "
        "b noisy and read off the same rollouts as the cap-hit rate, as on the cluster; "
        "simulated once, then read from a cache) or synthetic (independent normal noise per "
        "step, b free of noise; quick) (default: sim)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )


def line_plan(seeds: list[int], arms) -> tuple[list[int], tuple[float, ...]]:
    """The seed counts and effects the one-line summary needs: the asked count at
    ``LINE_EFFECT``; with P3 among the predictions the arms compare, every count up to
    ``MAX_SEEDS`` at the map's P3 effect too, for the seeds P3 needs (``power.needs``)."""
    from rescue.judge import power as pw

    if "P3" not in pw.compared(arms):
        return seeds, (pw.LINE_EFFECT,)
    counts = sorted({*seeds, *range(pw.MIN_SEEDS, pw.MAX_SEEDS + 1)})
    return counts, (pw.LINE_EFFECT, pw.MAP_P3_EFFECT)


#: Simulated runs per run a replicate needs (a replicate draws distinct runs of the pool).
POOL_FACTOR = 2


def noise_of(noise: str, arms, seeds: int, *, progress: bool = True):
    """``(null, description)`` for ``power``: the pool of simulated runs of the arms'
    regime (``rescue.sim.power_pool``; ``POOL_FACTOR`` times the runs a replicate of
    ``seeds`` seeds needs), or the synthetic null (None)."""
    if noise == "synthetic":
        return None, "synthetic: independent normal noise per step, b free of noise"
    from rescue.judge import power as pw
    from rescue.sim import power_pool

    scenario, arm = power_pool.SCENARIOS[power_pool.regime(arms)]
    runs = POOL_FACTOR * len(arms) * seeds
    pool = power_pool.pool(scenario, arm, runs, workers=os.cpu_count() or 1, progress=progress)
    steps = int(max(pool[0].steps())) + 1 if pool and pool[0].rows else 0
    said = f"simulated: {len(pool)} runs of {scenario}'s {arm} arm, {steps} steps each"
    return pw.pool_null(pool), said


def main(args: argparse.Namespace) -> int:
    from rescue.judge import power as pw
    from rescue.output import check_file, write_text
    from rescue.progress import progress_bar

    seeds = _numbers(args.seeds, "--seeds", int)
    effects = _numbers(args.effects, "--effects")
    if not seeds or min(seeds) < 1 or max(seeds) > pw.MAX_SEEDS:
        raise InputError(f"--seeds={args.seeds!r}; allowed: 1 to {pw.MAX_SEEDS} seeds per arm")
    if not effects or min(effects) <= 0:
        raise InputError(f"--effects={args.effects!r}; allowed: effects > 0 (seed SDs)")
    if args.line and len(seeds) != 1:
        raise InputError(f"--line with --seeds={args.seeds!r}; allowed: one seed count")
    json_out = check_file(args.json, "--json") if args.json else None  # before computing
    replicates = args.replicates or (pw.LINE_REPLICATES if args.line else pw.REPLICATES)
    if args.arms:
        reports = [("--arms", [a.strip() for a in args.arms.split(",") if a.strip()])]
    else:
        qs = QUESTIONS if args.question == "all" else (args.question,)
        reports = [(q, question_arms(q)) for q in qs]
    for _, named in reports:  # every arm named before anything is simulated
        for arm in named:
            pw.arm_label(arm)
    if args.gate:
        for _, arms in reports:
            why = pw.refusal(arms, min(seeds))
            if why and not args.force:
                raise InputError(f"{why}: set SEEDS >= 3, or FORCE=1 to run anyway")
            if why:
                print(f"power: FORCE=1: {why}; running anyway", file=sys.stderr)
    out = {}
    for name, arms in reports:
        if args.line and seeds[0] < pw.MIN_SEEDS:  # nothing to simulate: the judge's minimum
            said = pw.line(pw.Power(tuple(arms), 0, tuple(seeds), (0.0,)), seeds[0], arms=arms)
            print(said if args.arms else f"{name}: {said}")
            continue
        t0 = time.perf_counter()
        counts, line_effects = line_plan(seeds, arms) if args.line else (seeds, effects)
        null, noise = noise_of(args.noise, arms, max(max(counts), pw.MIN_SEEDS),
                               progress=not args.no_progress)  # fmt: skip
        bar = progress_bar(replicates, unit="replicates", desc=f"power {name}",
                           enabled=not args.no_progress)  # fmt: skip
        table = pw.power(
            arms, seeds=counts, effects=line_effects,
            replicates=replicates, seed=args.rng_seed, progress=lambda n, bar=bar: bar.update(1),
            null=null, noise=noise,
        )  # fmt: skip
        bar.close()
        seconds = time.perf_counter() - t0
        if args.line:
            print(pw.line(table, seeds[0]) if args.arms else f"{name}: {pw.line(table, seeds[0])}")
        else:
            print("\n".join(pw.markdown(table, name, seconds)))
        out[name] = pw.as_json(table) | {"seconds": seconds}
    if json_out is not None:
        write_text(json_out, json.dumps(out, indent=1) + "\n")
    return 0
