"""The grader under load: every subset task's reference solution, graded as a trial would be.

Specification
-------------
``validate(tasks, references, settings=..., concurrency=...)`` grades, for every task, its
reference solution (the SWE-smith row's ``patch`` is the bug; the fix is its reverse, as the
harness grades ``gold``) with ``grading.grade_patch`` in a fresh container of the task image
with the training sandbox (``AgentSettings``: the fixed ``--cpus``/``--memory``/
``--pids-limit``, the docker executable, the start timeout), ``concurrency`` tasks at once
(default ``settings.max_concurrency``: the training's concurrency), each in a worker thread.
The grader, the sandbox and the load are the trials' own, so a task whose reference does not
resolve here would not resolve for the policy either: its tests flake under load, time out
with the fixed CPUs, or its grader is broken.

Every task gets exactly one ``Validation``: ``resolved`` (the grade's verdict), or not,
with the grade's status and reason, or an ``error`` (a ``SandboxError`` of the grader's
containers, a task without a reference, a task the grader cannot judge). ``write_outputs``
writes ``validate.jsonl`` (one a line), ``subset.txt`` (the tasks whose reference resolved,
in input order, with a header saying how many were excluded; what ``prepare --subset``
reads) and ``summary.md`` (the fraction resolved, the excluded tasks and why).

References: ``prepare`` writes them beside the prompt file (``reference_path``): one line
``{"instance_id", "patch"}`` per task whose row has a patch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.output import write_text
from swe_smith_tasks.agent_settings import AgentSettings
from swe_smith_tasks.images import task_image
from swe_smith_tasks.prepare import read_subset, reference_path

RESULTS, SUBSET, SUMMARY = "validate.jsonl", "subset.txt", "summary.md"


@dataclass(frozen=True)
class Validation:
    """One task's reference solution under the grader."""

    instance_id: str
    resolved: bool
    status: str
    reason: str
    seconds: float
    error: str = ""


def load_references(path: str | os.PathLike[str]) -> dict[str, str]:
    """``instance_id -> patch`` from a reference file; a missing file is an error naming it."""
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"no reference file {str(p)!r}: rerun `rescue swe prepare` (make swe-prepare), "
            "which writes it beside the tasks from the rows' patch field"
        )
    out = {}
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[str(row["instance_id"])] = str(row["patch"])
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"{p} line {lineno}: not a reference ({e})") from None
    return out


def validate_one(
    instance_id: str,
    metadata: Mapping[str, Any],
    patch: str | None,
    settings: AgentSettings,
) -> Validation:
    """Grade one task's reference solution in a fresh container (module docstring)."""
    from swe_smith_tasks.grading import grade_patch, task_instance
    from swe_smith_tasks.sandbox import DockerContainer, LocalContainer, SandboxError

    start = time.monotonic()
    if not patch:
        return Validation(instance_id, False, "error", "no_reference", 0.0, "the row has no patch")
    try:
        instance = task_instance({**metadata, "instance_id": instance_id})
    except InputError as e:
        return Validation(instance_id, False, "error", "not_gradable", 0.0, str(e))
    container = None
    try:
        image = task_image(instance)
        if settings.environment == "local":
            container = LocalContainer(image, role="eval", images=str(settings.local_images))
        else:
            container = DockerContainer(
                image,
                role="eval",
                executable=settings.docker_executable,
                run_args=settings.docker_run_args,
                limits=settings.docker_limits(),
                lifetime_s=settings.trial_timeout_s + 60,
                start_timeout_s=settings.start_timeout_s,
            )
        grade = grade_patch(container, instance, patch, reverse=True)
    except SandboxError as e:
        return Validation(
            instance_id, False, "error", e.reason, time.monotonic() - start, str(e)[-500:]
        )
    finally:
        if container is not None:
            container.close()
    return Validation(
        instance_id, grade.resolved, grade.status, grade.reason, time.monotonic() - start
    )


def validate(
    tasks: Sequence[tuple[str, Mapping[str, Any]]],
    references: Mapping[str, str],
    *,
    settings: AgentSettings | None = None,
    concurrency: int | None = None,
    progress: bool = True,
) -> list[Validation]:
    """Validate every task (``(instance_id, metadata)``), ``concurrency`` at once (default
    ``settings.max_concurrency``; ``settings`` default ``AgentSettings.from_env()``), in
    input order."""
    settings = settings or AgentSettings.from_env()
    workers = concurrency or settings.max_concurrency
    if workers < 1:
        raise InputError(f"--concurrency {workers}: must be >= 1")
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(tasks), desc="validate", unit="task", file=sys.stderr)
        except ImportError:
            bar = None
    results: dict[str, Validation] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(validate_one, iid, meta, references.get(iid), settings): iid
            for iid, meta in tasks
        }
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return [results[iid] for iid, _ in tasks]


def write_outputs(
    out_dir: str | os.PathLike[str], results: Sequence[Validation], *, concurrency: int
) -> dict[str, Path]:
    """Write ``validate.jsonl``, ``subset.txt`` and ``summary.md``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / RESULTS, "subset": out / SUBSET, "summary": out / SUMMARY}
    kept = [r.instance_id for r in results if r.resolved]
    excluded = len(results) - len(kept)
    # each file replaced whole (rescue.output), the subset last: a subset.txt always
    # belongs to the results beside it
    write_text(paths["results"], "".join(json.dumps(asdict(r)) + "\n" for r in results))
    write_text(paths["summary"], render_summary(results, concurrency=concurrency))
    write_text(
        paths["subset"],
        f"# validated subset: {len(kept)} of {len(results)} tasks whose reference solution "
        f"resolves under the grader ({excluded} excluded; concurrency {concurrency})\n"
        + "".join(f"{i}\n" for i in kept),
    )
    return paths


def render_summary(results: Sequence[Validation], *, concurrency: int) -> str:
    """The markdown summary: the fraction resolved, then every excluded task and why."""
    resolved = sum(r.resolved for r in results)
    fraction = resolved / len(results) if results else 0.0
    reasons = Counter(r.reason for r in results if not r.resolved)
    lines = [
        "# Grader validation",
        "",
        f"Reference solutions resolved: {resolved} of {len(results)} ({fraction:.1%}), "
        f"graded {concurrency} at once in the training sandbox.",
        "",
    ]
    if reasons:
        lines += [
            "Not resolved, by reason: " + ", ".join(f"{r} {k}" for r, k in reasons.most_common()),
            "",
        ]
    failed = [r for r in results if not r.resolved]
    lines += ["## Excluded tasks", ""]
    if not failed:
        lines.append("None.")
    else:
        lines += ["| instance_id | status | reason | error |", "|---|---|---|---|"]
        lines += [
            f"| {r.instance_id} | {r.status} | {r.reason} | {r.error[:120].replace('|', '/')} |"
            for r in failed
        ]
    return "\n".join(lines) + "\n"


def main(args: Any) -> int:
    """``rescue swe validate`` (``swe_smith_tasks.cli``): the subset of ``--tasks`` validated,
    the outputs written and the excluded tasks printed; 1 when no reference resolves."""
    from swe_smith_tasks import pilot

    tasks = pilot.load_tasks(args.tasks)
    if args.subset is not None:
        wanted = set(read_subset(args.subset))
        missing = sorted(wanted - {t.instance_id for t in tasks})
        if missing:
            raise InputError(
                f"--subset {args.subset}: {len(missing)} id(s) not in --tasks {args.tasks}, "
                f"e.g. {missing[0]!r}"
            )
        tasks = [t for t in tasks if t.instance_id in wanted]
    references = load_references(args.references or reference_path(args.tasks))
    settings = AgentSettings.from_env()
    concurrency = args.concurrency or settings.max_concurrency
    results = validate(
        [(t.instance_id, t.metadata) for t in tasks],
        references,
        settings=settings,
        concurrency=concurrency,
        progress=not args.no_progress,
    )
    paths = write_outputs(args.out, results, concurrency=concurrency)
    resolved = sum(r.resolved for r in results)
    print(
        f"{resolved} of {len(results)} reference solutions resolved "
        f"({resolved / max(len(results), 1):.1%}) -> {paths['subset']}; "
        f"summary: {paths['summary']}"
    )
    for r in [r for r in results if not r.resolved][:20]:
        print(f"  excluded {r.instance_id}: {r.status} {r.reason} {r.error[:200]}".rstrip())
    if results and not resolved:
        reason = Counter(r.reason for r in results).most_common(1)[0][0]
        print(
            f"rescue swe validate: no reference solution resolved (most common: {reason}); "
            "check Docker, the images and the grader",
            file=sys.stderr,
        )
        return 1
    return 0
