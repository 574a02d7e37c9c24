"""SWE-smith tasks: prepare the prompt data, pull the images, run the pilot, validate the
grader, reap leftover containers.

``rescue swe prepare`` writes the Miles prompt JSONL from the SWE-smith dataset (or a
local file), optionally restricted to a subset, and the tasks' reference solutions beside
it. ``rescue swe pull`` makes sure the images of the tasks the pilot will run are present
and reports a failed pull per task. ``rescue swe probe`` checks that a served endpoint
returns tool calls as the agent reads them and, with ``--check-sampling``, that it fills no
sampling parameter otherwise than training's engines. ``rescue swe pilot`` runs n trials
per task against an OpenAI-compatible endpoint, sampling as training samples
(``swe_smith_tasks.sampling``), and writes the subset of tasks whose success rate lies in
the window. ``rescue swe validate`` grades the subset's reference solutions in the
training sandbox under the training concurrency and writes the subset without those that
do not resolve. ``rescue swe reap`` removes the containers trials left behind. Each step's
heavy imports happen inside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from rescue import flags
from rescue.errors import InputError
from swe_smith_tasks.pilot import DEFAULT_TRIAL_FN
from swe_smith_tasks.prepare import HF_DATASET, IMAGE_NAMESPACE
from swe_smith_tasks.reaper import DEFAULT_PREFIXES
from swe_smith_tasks.sampling import Sampling
from swe_smith_tasks.subset import Window

_WINDOW = Window()
_SAMPLING = Sampling()


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare``, ``pull``, ``probe``, ``pilot``, ``validate`` and ``reap`` subcommands."""
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

    g = sub.add_parser("pull", help="pull the images of the tasks the pilot will run")
    g.add_argument("--tasks", required=True, help="prompt JSONL written by `rescue swe prepare`")
    g.add_argument("--out", default="pilot", help="where images.jsonl goes (default ./pilot)")
    _task_sample_flags(g)
    g.add_argument(
        "--docker",
        default=None,
        help="Docker command (default $RESCUE_DOCKER, else $MSWEA_DOCKER_EXECUTABLE, else docker)",
    )
    g.add_argument(
        "--timeout", type=flags.SECONDS, default=1800, help="seconds per pull (default 1800)"
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")

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
    e.add_argument(
        "--check-sampling",
        action="store_true",
        help="also refuse a server that fills omitted sampling parameters otherwise than "
        "training's engines (--sampling-defaults openai, no --preferred-sampling-params; "
        "default off)",
    )

    q = sub.add_parser("pilot", help="n trials per task; keep tasks with success in the window")
    q.add_argument("--tasks", required=True, help="prompt JSONL written by `rescue swe prepare`")
    q.add_argument("--out", default="pilot", help="pilot directory (default ./pilot)")
    q.add_argument("--base-url", help="OpenAI-compatible endpoint of the policy (required to run)")
    q.add_argument("--model", help="model name sent to the endpoint (required to run)")
    q.add_argument("--n", type=flags.COUNT, default=8, help="trials per task (default 8)")
    q.add_argument(
        "--concurrency", type=flags.COUNT, default=32, help="trials at once (default 32)"
    )
    _task_sample_flags(q)
    q.add_argument(
        "--temperature",
        type=flags.number(0),
        default=_SAMPLING.temperature,
        help=f"--rollout-temperature of training (default {_SAMPLING.temperature:g})",
    )
    q.add_argument(
        "--top-p",
        type=flags.number(0, 1, low_open=True),
        default=_SAMPLING.top_p,
        help=f"--rollout-top-p of training (default {_SAMPLING.top_p:g})",
    )
    q.add_argument(
        "--top-k",
        type=flags.integer(-1),
        default=_SAMPLING.top_k,
        help=f"--rollout-top-k of training (default {_SAMPLING.top_k}: off)",
    )
    q.add_argument(
        "--max-tokens",
        type=flags.COUNT,
        default=_SAMPLING.max_tokens,
        help="--rollout-max-response-len of training: tokens per model call "
        f"(default {_SAMPLING.max_tokens})",
    )
    q.add_argument(
        "--skip-special-tokens",
        action="store_true",
        help="--rollout-skip-special-tokens of training (default off, as Miles)",
    )
    q.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        help="JSON object sent as chat_template_kwargs with every request, as Miles' session "
        "server sends its family's (default: none)",
    )
    q.add_argument(
        "--skip-sampling-check",
        action="store_true",
        help="run against an endpoint whose sampling defaults cannot be read (not SGLang); "
        "by default the pilot refuses a server that fills omitted sampling parameters "
        "otherwise than training's engines",
    )
    q.add_argument(
        "--images",
        default=None,
        help="images.jsonl of `rescue swe pull`: tasks whose image failed are skipped, not "
        "tried (default OUT/images.jsonl when it exists)",
    )
    q.add_argument(
        "--low",
        type=flags.PROBABILITY,
        default=_WINDOW.low,
        help=f"lowest success rate kept (default {_WINDOW.low:g})",
    )
    q.add_argument(
        "--high",
        type=flags.PROBABILITY,
        default=_WINDOW.high,
        help=f"highest success rate kept (default {_WINDOW.high:g})",
    )
    q.add_argument(
        "--max-infra-fraction",
        type=flags.PROBABILITY,
        default=_WINDOW.max_infra_fraction,
        help="drop a task when more than this fraction of its trial attempts (a retried "
        f"trial's earlier ones too) had no result (default {_WINDOW.max_infra_fraction:g})",
    )
    q.add_argument(
        "--z",
        type=flags.number(0, low_open=True),
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

    v = sub.add_parser(
        "validate", help="grade the subset's reference solutions in the training sandbox"
    )
    v.add_argument("--tasks", required=True, help="prompt JSONL written by `rescue swe prepare`")
    v.add_argument(
        "--subset",
        default=None,
        help="validate only the instance ids in this file (the pilot's subset.txt; default all)",
    )
    v.add_argument(
        "--references",
        default=None,
        help="reference solutions (default TASKS with .reference.jsonl, written by prepare)",
    )
    v.add_argument("--out", default="validate", help="output directory (default ./validate)")
    v.add_argument(
        "--concurrency",
        type=flags.COUNT,
        default=None,
        help="tasks graded at once (default $RESCUE_SWE_MAX_CONCURRENCY: the training's)",
    )
    v.add_argument("--no-progress", action="store_true", help="no progress bar")

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
        type=flags.number(0),
        default=0.0,
        help="only containers created at least this many seconds ago (default 0: all)",
    )
    r.add_argument("--dry-run", action="store_true", help="list, remove nothing")


def _task_sample_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-tasks",
        type=flags.COUNT,
        default=None,
        help="a random sample of this many tasks (default all)",
    )
    parser.add_argument(
        "--seed",
        type=flags.NON_NEGATIVE,
        default=0,
        help="seed of the --max-tasks sample (default 0)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the chosen step; 0 on success."""
    steps = {
        "prepare": _prepare,
        "pull": _pull,
        "probe": _probe,
        "pilot": _pilot,
        "validate": _validate,
        "reap": _reap,
    }
    return steps[args.swe_command](args)


def pilot_sampling(args: argparse.Namespace) -> Sampling:
    """The pilot's sampling settings from its flags (what ``rescue swe pilot`` sends)."""
    return Sampling(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        skip_special_tokens=args.skip_special_tokens,
        chat_template_kwargs=args.chat_template_kwargs or {},
    )


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
    if not probe.ok:
        print(f"rescue swe probe: {probe.message}", file=sys.stderr)
        return 1
    print(f"ok: {probe.message}")
    if args.check_sampling:
        from swe_smith_tasks.sampling import check_endpoint

        if problems := check_endpoint(args.base_url):
            for problem in problems:
                print(f"rescue swe probe: {problem}", file=sys.stderr)
            return 1
        print(f"ok: {args.base_url} fills omitted sampling parameters as training's engines do")
    return 0


def _pull(args: argparse.Namespace) -> int:
    from swe_smith_tasks.images import main as pull

    return pull(args)


def _validate(args: argparse.Namespace) -> int:
    from swe_smith_tasks.validate import main as validate

    return validate(args)


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
    from swe_smith_tasks import images, pilot, subset

    no_result = Outcome.INFRA_NO_RESULT.value

    window = subset.Window(args.low, args.high, args.max_infra_fraction, args.z)
    tasks = pilot.sample_tasks(pilot.load_tasks(args.tasks), args.max_tasks, args.seed)
    failed_images = images.unavailable(args.images or f"{args.out}/{images.REPORT}")
    skipped = {
        t.instance_id: failed_images[t.instance_id] for t in tasks if t.instance_id in failed_images
    }
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
        request_kwargs = pilot_sampling(args).request_kwargs()
        if not args.skip_sampling_check:
            from swe_smith_tasks.sampling import check_endpoint

            if problems := check_endpoint(args.base_url):
                raise InputError(
                    f"--base-url {args.base_url} would not sample as training does: "
                    + "; ".join(problems)
                )
        if skipped:
            print(
                f"skipping {len(skipped)} task(s) whose image failed to pull (decision no_image)",
                file=sys.stderr,
            )
        trial_kwargs = (
            pilot.default_agent_kwargs(args.model, args.concurrency, args.log_dir)
            if args.agent == pilot.DEFAULT_TRIAL_FN
            else {}
        )
        try:
            records = pilot.run_pilot(
                [t for t in tasks if t.instance_id not in skipped],
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
    stats = subset.summarize(
        [t.instance_id for t in tasks],
        records,
        args.n,
        window,
        attempts=pilot.attempts(f"{args.out}/{pilot.RESULTS}"),
        no_image=skipped,
    )
    paths = subset.write_outputs(
        args.out, stats, records, n=args.n, window=window, model=args.model
    )
    infra = Counter(r.get("reason") for r in records.values() if r["outcome"] == no_result)
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
    if records and infra.total() == len(records):
        reason, count = infra.most_common(1)[0]
        errors = (r.get("error") for r in records.values() if r.get("reason") == reason)
        example = " ".join(str(next((e for e in errors if e), "")).split())[:300]
        print(
            f"rescue swe pilot: no trial had a result ({len(records)} without one; most often "
            f"{reason}, {count}{f': {example}' if example else ''}): check the endpoint, "
            "Docker and the task images",
            file=sys.stderr,
        )
        return 1
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
