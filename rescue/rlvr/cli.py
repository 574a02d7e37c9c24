"""Single-turn RLVR with a length cap: prepare the data, calibrate the cap, watch a sweep.

``rescue rlvr prepare`` writes Miles prompt JSONL from GSM8K or MATH. ``rescue rlvr
calibrate`` samples the initial policy through SGLang and writes the smallest cap whose
truncation rate lies in the window. ``rescue rlvr cap`` prints the cap of a cap file.
``rescue rlvr watch`` follows a sweep's Ray jobs until every run has ended. The launchers
(``launch/rlvr_*.sh``, ``make rlvr-*``) call these; each step's heavy imports happen inside it.
"""

from __future__ import annotations

import argparse
import sys

from rescue import flags
from rescue.errors import InputError
from rescue.rlvr.data import DATASETS


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare``, ``calibrate``, ``cap`` and ``watch`` subcommands."""
    sub = parser.add_subparsers(dest="rlvr_command", metavar="STEP", required=True)

    p = sub.add_parser("prepare", help="GSM8K or MATH rows -> Miles prompt JSONL")
    p.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="the rows' schema")
    p.add_argument(
        "--source",
        default=None,
        help="Hugging Face dataset name or local .jsonl/.json/.parquet file (default: "
        + ", ".join(f"{k} {v.default_source}" for k, v in DATASETS.items())
        + ")",
    )
    p.add_argument("--split", default="train", help="dataset split (default train)")
    p.add_argument(
        "--config",
        default=None,
        help="dataset config (default: the default source's, e.g. main for openai/gsm8k)",
    )
    p.add_argument("--out", required=True, help="output prompt JSONL")

    c = sub.add_parser("calibrate", help="pick the length cap from the initial policy's lengths")
    c.add_argument("--data", required=True, help="prompt JSONL written by `rescue rlvr prepare`")
    c.add_argument("--model", required=True, help="Hugging Face checkpoint (tokenizer, template)")
    c.add_argument("--base-url", required=True, help="SGLang server serving the checkpoint")
    c.add_argument("--caps", required=True, help="candidate caps, e.g. '512 1024 2048'")
    c.add_argument("--out", required=True, help="cap file to write (read by rlvr-arm)")
    c.add_argument("--prompts", type=flags.COUNT, default=256, help="prompts sampled (default 256)")
    c.add_argument("--n", type=flags.COUNT, default=8, help="responses per prompt (default 8)")
    c.add_argument(
        "--low", type=flags.PROBABILITY, default=0.2, help="window's low end (default 0.2)"
    )
    c.add_argument(
        "--high", type=flags.PROBABILITY, default=0.4, help="window's high end (default 0.4)"
    )
    c.add_argument(
        "--temperature", type=flags.number(0), default=1.0, help="sampling temperature (default 1)"
    )
    c.add_argument(
        "--seed", type=flags.NON_NEGATIVE, default=1, help="seed of the prompt sample (default 1)"
    )
    c.add_argument(
        "--concurrency", type=flags.COUNT, default=64, help="requests at once (default 64)"
    )
    c.add_argument(
        "--timeout", type=flags.SECONDS, default=3600.0, help="seconds per request (default 3600)"
    )

    k = sub.add_parser("cap", help="print the cap of a cap file")
    k.add_argument("file", help="cap file written by `rescue rlvr calibrate`")
    k.add_argument("--model", default=None, help="refuse a file calibrated for another model")
    k.add_argument("--data", default=None, help="refuse a file calibrated on other data")

    w = sub.add_parser("watch", help="follow a sweep's Ray jobs until every run has ended")
    w.add_argument("--plan", required=True, help="the sweep's plan.jsonl")
    w.add_argument("--address", required=True, help="Ray dashboard address (http://host:port)")
    w.add_argument(
        "--poll-s", type=flags.SECONDS, default=60.0, help="seconds between polls (default 60)"
    )
    w.add_argument(
        "--lost-after",
        type=flags.COUNT,
        default=10,
        help="polls in a row without an answer before a run is reported lost (default 10)",
    )
    w.add_argument("--ray", default="ray", help="the ray command (default ray)")
    w.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (default: show it)"
    )


def main(args: argparse.Namespace) -> int:
    if args.rlvr_command == "prepare":
        from rescue.rlvr.data import prepare

        report = prepare(
            args.dataset, args.out, source=args.source, split=args.split, config=args.config
        )
        print(report.render())
        return 0
    if args.rlvr_command == "calibrate":
        return _calibrate(args)
    if args.rlvr_command == "cap":
        from rescue.rlvr.calibrate import read_cap

        print(read_cap(args.file, model=args.model, data=args.data))
        return 0
    from rescue.rlvr.sweep import Watcher, read_plan

    watcher = Watcher(
        read_plan(args.plan),
        address=args.address,
        ray=args.ray,
        poll_s=args.poll_s,
        lost_after=args.lost_after,
        progress=not args.no_progress,
    )
    return watcher.watch()


def _calibrate(args: argparse.Namespace) -> int:
    from rescue.rlvr import calibrate as cal

    for name in ("prompts", "n", "concurrency"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: allowed an integer >= 1")
    if not (0.0 <= args.low <= args.high <= 1.0):
        raise InputError(f"--low {args.low} --high {args.high}: allowed 0 <= low <= high <= 1")
    caps = cal.parse_caps(args.caps)
    window = (args.low, args.high)
    prompts = cal.read_prompts(args.data, args.prompts, args.seed)
    ids = cal.encode_prompts(args.model, prompts)
    try:
        lengths = cal.sample_lengths(
            ids,
            n=args.n,
            max_cap=caps[-1],
            temperature=args.temperature,
            base_url=args.base_url,
            concurrency=args.concurrency,
            timeout=args.timeout,
        )
    except cal.EngineError as e:
        print(f"rescue rlvr calibrate: the engine failed: {e}", file=sys.stderr)
        return 1
    rates = cal.truncation_rates(lengths, caps)
    print(f"truncation rates at initialization ({args.prompts} prompts x {args.n} responses):")
    print(cal.render_rates(rates, window))
    chosen = cal.choose_cap(rates, window)
    cal.write_cap_file(
        args.out,
        chosen,
        rates,
        model=args.model,
        data=args.data,
        window=list(window),
        prompts=args.prompts,
        n=args.n,
        temperature=args.temperature,
        seed=args.seed,
    )
    print(f"cap {chosen.cap} (truncated {chosen.rate:.1%}) written to {args.out}")
    return 0
