"""SWE-smith tasks: prepare the prompt data, run the pilot, reap leftover containers.

``rescue swe prepare`` writes the Miles prompt JSONL from the SWE-smith dataset (or a
local file), optionally restricted to a pilot subset. ``rescue swe probe`` checks that a
served endpoint returns tool calls as the agent reads them. ``rescue swe pilot`` runs n
trials per task against an OpenAI-compatible endpoint and writes the subset of tasks
whose success rate lies in the window. ``rescue swe reap`` removes the containers trials
left behind. Each step's heavy imports happen inside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from rescue.errors import InputError
from swe_smith_tasks.pilot import DEFAULT_TRIAL_FN
from swe_smith_tasks.prepare import HF_DATASET, IMAGE_NAMESPACE
from swe_smith_tasks.reaper import DEFAULT_PREFIXES
from swe_smith_tasks.subset import Window

_WINDOW = Window()


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare``, ``probe``, ``pilot`` and ``reap`` subcommands."""
    sub = parser.add_subparsers(dest="swe_command", metavar="STEP", required=True)

    p = sub.add_parser("prepare", help="SWE-smith rows -> Miles prompt JSONL")
    p.add_argument(
        "--source",
        default=HF_DATASET,
        help="Hugging Face dataset name, or a local .jsonl/.json/.parquet file of its rows "
        f"(default {HF_DATASET})",
    )
    p.add_argument("--split", default="train", help="dataset split (default train)")
    p.add_argument("--out", required=True, help="output prompt JSONL")
    p.add_argument(
        "--subset",
        default=None,
        help="keep only the instance ids listed in this file (the pilot's subset.txt; default: all)",
    )
    p.add_argument(
        "--image-namespace",
        default=IMAGE_NAMESPACE,
        help="namespace task images are rewritten to, from swebench/ or jyangballin/ "
        f"(default {IMAGE_NAMESPACE}; e.g. a local mirror registry.local:5000/swebench)",
    )

    e = sub.add_parser("probe", help="check that an endpoint returns tool calls in tool_calls")
    e.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint of the policy")
    e.add_argument("--model", required=True, help="model name sent to the endpoint")
    e.add_argument(
        "--tool-call-parser",
        default=None,
        help="the tool-call parser the server should run, named when it does not (default: none)",
    )
    e.add_argument(
        "--reasoning-parser",
        default=None,
        help="the reasoning parser the server should run, named when it does not (default: none)",
    )
    e.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        help="JSON object sent as chat_template_kwargs, as training sends it (default: none)",
    )

    q = sub.add_parser("pilot", help="n trials per task; keep tasks with success in the window")
    q.add_argument("--tasks", required=True, help="prompt JSONL written by `rescue swe prepare`")
    q.add_argument("--out", default="pilot", help="pilot directory (default ./pilot)")
    q.add_argument("--base-url", help="OpenAI-compatible endpoint of the policy (required to run)")
    q.add_argument("--model", help="model name sent to the endpoint (required to run)")
    q.add_argument("--n", type=int, default=8, help="trials per task (default 8)")
    q.add_argument("--concurrency", type=int, default=32, help="trials at once (default 32)")
    q.add_argument(
        "--max-tasks",
        type=int,
        default=None,
        help="pilot a random sample of this many tasks (default all)",
    )
    q.add_argument("--seed", type=int, default=0, help="seed of the --max-tasks sample (default 0)")
    q.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature; match the trainer's (default 1.0)",
    )
    q.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="max new tokens per model call (default: the server's)",
    )
    q.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        help="JSON object sent as chat_template_kwargs with every request, as Miles' session "
        "server sends its family's (default: none)",
    )
    q.add_argument(
        "--low",
        type=float,
        default=_WINDOW.low,
        help=f"lowest success rate kept (default {_WINDOW.low:g})",
    )
    q.add_argument(
        "--high",
        type=float,
        default=_WINDOW.high,
        help=f"highest success rate kept (default {_WINDOW.high:g})",
    )
    q.add_argument(
        "--max-infra-fraction",
        type=float,
        default=_WINDOW.max_infra_fraction,
        help="drop a task when more than this fraction of its trials had no result "
        f"(default {_WINDOW.max_infra_fraction:g})",
    )
    q.add_argument(
        "--z",
        type=float,
        default=_WINDOW.z,
        help=f"Wilson interval z (default {_WINDOW.z:g}, 95%%)",
    )
    q.add_argument(
        "--retry-infra",
        action="store_true",
        help="on resume, rerun trials that had no result (default off)",
    )
    q.add_argument(
        "--summarize-only",
        action="store_true",
        help="run nothing; rewrite subset.txt and summary.md from results.jsonl (e.g. a new window)",
    )
    q.add_argument(
        "--agent",
        default=DEFAULT_TRIAL_FN,
        help=f"trial function, package.module.function (default {DEFAULT_TRIAL_FN}); "
        "another function gets base_url, prompt, request_kwargs and metadata only",
    )
    q.add_argument(
        "--log-dir",
        default=None,
        help="keep each trial's trajectory and grader logs here (default agent only; default: none)",
    )
    q.add_argument("--no-progress", action="store_true", help="no progress bar")

    r = sub.add_parser("reap", help="remove containers SWE-smith trials left behind")
    r.add_argument(
        "--prefix",
        action="append",
        default=None,
        help=f"container name prefix, repeatable (default {' and '.join(DEFAULT_PREFIXES)})",
    )
    r.add_argument(
        "--docker",
        default=None,
        help="Docker command (default $RESCUE_DOCKER, else $MSWEA_DOCKER_EXECUTABLE, else docker)",
    )
    r.add_argument(
        "--older-than",
        type=float,
        default=0.0,
        help="only containers created at least this many seconds ago (default 0: all)",
    )
    r.add_argument("--dry-run", action="store_true", help="list, remove nothing")


def main(args: argparse.Namespace) -> int:
    """Run the chosen step; 0 on success."""
    steps = {"prepare": _prepare, "probe": _probe, "pilot": _pilot, "reap": _reap}
    return steps[args.swe_command](args)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


def _probe(args: argparse.Namespace) -> int:
    from swe_smith_tasks.endpoint import probe_tool_calls

    probe = probe_tool_calls(
        args.base_url,
        args.model,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        request_kwargs=(
            {"chat_template_kwargs": args.chat_template_kwargs}
            if args.chat_template_kwargs
            else None
        ),
    )
    if probe.ok:
        print(f"ok: {probe.message}")
        return 0
    print(f"rescue swe probe: {probe.message}", file=sys.stderr)
    return 1


def _prepare(args: argparse.Namespace) -> int:
    from swe_smith_tasks.prepare import prepare

    report = prepare(
        args.source,
        args.out,
        split=args.split,
        subset=args.subset,
        image_namespace=args.image_namespace,
    )
    print(report.render())
    return 0


def _pilot(args: argparse.Namespace) -> int:
    from rescue.outcomes import Outcome
    from swe_smith_tasks import pilot, subset

    no_result = Outcome.INFRA_NO_RESULT.value

    window = subset.Window(args.low, args.high, args.max_infra_fraction, args.z)
    tasks = pilot.sample_tasks(pilot.load_tasks(args.tasks), args.max_tasks, args.seed)
    if args.summarize_only:
        records = pilot.load_results(f"{args.out}/{pilot.RESULTS}")
        if not records:
            raise InputError(
                f"--summarize-only: no results in {args.out}/{pilot.RESULTS}: "
                "run the pilot first (without --summarize-only)"
            )
    else:
        missing = [f for f in ("base_url", "model") if not getattr(args, f)]
        if missing:
            raise InputError(
                f"--{missing[0].replace('_', '-')} is required (or pass --summarize-only)"
            )
        request_kwargs = {"temperature": args.temperature}
        if args.max_tokens is not None:
            request_kwargs["max_tokens"] = args.max_tokens
        if args.chat_template_kwargs:
            request_kwargs["chat_template_kwargs"] = args.chat_template_kwargs
        trial_kwargs = (
            pilot.default_agent_kwargs(args.model, args.concurrency, args.log_dir)
            if args.agent == pilot.DEFAULT_TRIAL_FN
            else {}
        )
        try:
            records = pilot.run_pilot(
                tasks,
                args.out,
                base_url=args.base_url,
                model=args.model,
                n=args.n,
                concurrency=args.concurrency,
                trial_fn=args.agent,
                request_kwargs=request_kwargs,
                trial_kwargs=trial_kwargs,
                retry_infra=args.retry_infra,
                progress=not args.no_progress,
            )
        except KeyboardInterrupt:
            print(
                f"\ninterrupted; finished trials are in {args.out}/{pilot.RESULTS}: "
                "rerun the same command to continue",
                file=sys.stderr,
            )
            return 130
        except pilot.TrialErrors as e:
            print(f"rescue swe pilot: {e}", file=sys.stderr)
            return 1
    stats = subset.summarize([t.instance_id for t in tasks], records, args.n, window)
    paths = subset.write_outputs(
        args.out, stats, records, n=args.n, window=window, model=args.model
    )
    infra = Counter(r.get("reason") for r in records.values() if r["outcome"] == no_result)
    if records and infra.total() == len(records):
        reason = infra.most_common(1)[0][0]
        print(
            f"warning: no trial had a result (most common reason: {reason}); "
            "check the endpoint, Docker and the task images",
            file=sys.stderr,
        )
    if infra and not args.summarize_only:
        reasons = ", ".join(f"{r} {k}" for r, k in infra.most_common(3))
        print(
            f"{infra.total()} trial(s) had no result ({reasons}; error text in "
            f"{args.out}/{pilot.RESULTS}); a rerun skips them: rerun with --retry-infra "
            "(make pilot PILOT_RETRY_INFRA=1) to try them again",
            file=sys.stderr,
        )
    kept = sum(s.decision == "keep" for s in stats)
    print(f"{kept} of {len(stats)} tasks kept -> {paths['subset']}; summary: {paths['summary']}")
    return 0


def _reap(args: argparse.Namespace) -> int:
    from swe_smith_tasks.reaper import DockerUnavailable, reap

    try:
        report = reap(
            tuple(args.prefix or DEFAULT_PREFIXES),
            docker=args.docker,
            dry_run=args.dry_run,
            older_than=args.older_than,
        )
    except DockerUnavailable as e:
        print(f"rescue swe reap: {e}", file=sys.stderr)
        return 1
    print(report.render())
    return 1 if report.failed else 0
