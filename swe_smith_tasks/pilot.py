"""The pilot: estimate each task's success rate under the policy, keep the informative tasks.

Specification
-------------
Trials. Each task (a line of the prompt JSONL that ``prepare`` writes) gets ``n`` trials,
``await trial_fn(base_url=, prompt=, request_kwargs=, metadata=)`` (default
``swe_smith_tasks.agent.run``, the agent function the trainer calls), at most
``concurrency`` at a time, tasks in file order. ``request_kwargs`` holds the sampling
parameters (as Miles passes them), ``metadata`` the task's metadata plus ``pilot_trial``;
``trial_kwargs`` go to the trial function as they are (for the default agent,
``default_agent_kwargs``: its settings with the served model name and the concurrency).

Results. A finished trial is one JSON line appended (and flushed) to ``results.jsonl``
at once. A trial ``(instance_id, trial)`` with a line is finished; a rerun of the same
command skips finished trials, so an interruption loses only the trials in flight. A
trial cancelled by the pilot's own shutdown is never written (even when the agent turns
the cancellation into a result). With ``retry_infra`` a rerun also repeats trials whose
outcome was ``infra_no_result``; the later line for a trial wins. A torn last line (the
process killed mid-write) is dropped on resume; any other bad line is an error.

Outcome of a trial: the result goes through ``rescue.outcomes.classify`` as an agentic
sample, which takes the agent's ``outcome`` as is (and labels a result without
``exit_status``, e.g. ``None``, ``infra_no_result``). A no-result line keeps the agent's
``error`` text.

Errors. The agent turns every infrastructure fault into a result; an exception raised by
the trial function is a fault in the code, not a lost trial: it is written to
``errors.jsonl`` (the trial, the error, its traceback; the first one is also printed),
never to ``results.jsonl``, so a rerun tries the trial again. The other trials go on;
at the end ``run_pilot`` raises ``TrialErrors`` with the count.

The subset rule (success window, Wilson interval, infra threshold) is in
``swe_smith_tasks.subset``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.outcomes import OUTCOMES, Outcome, classify

TrialFn = Callable[..., Awaitable[Mapping[str, Any] | None]]
Key = tuple[str, int]

DEFAULT_TRIAL_FN = "swe_smith_tasks.agent.run"
#: Fields of the agent's result kept in a results line.
KEPT_FIELDS = (
    "reward",
    "exit_status",
    "turns",
    "ran_repo_tests",
    "ran_tests_after_last_edit",
    "n_test_runs",
    "timings",
    "error",
)
RESULTS = "results.jsonl"
ERRORS = "errors.jsonl"


class TrialErrors(RuntimeError):
    """Trials whose function raised (a fault in the code): written to ``errors.jsonl``."""

    def __init__(self, count: int, path: Path) -> None:
        super().__init__(
            f"{count} trial(s) raised an error (a fault in the code, not infrastructure): "
            f"see {path}; fix it and rerun the same command (finished trials are kept)"
        )
        self.count = count
        self.path = path


@dataclass(frozen=True)
class PilotTask:
    instance_id: str
    prompt: Any
    metadata: dict[str, Any]


def load_tasks(path: str | os.PathLike[str]) -> list[PilotTask]:
    """Tasks from a prompt JSONL (``prepare``'s output); errors name the line and field."""
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"tasks file {str(p)!r} does not exist (write it with `rescue swe prepare`)"
        )
    tasks, seen = [], set()
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p} line {lineno}: not valid JSON ({e})") from None
        meta = row.get("metadata") if isinstance(row, dict) else None
        iid = meta.get("instance_id") if isinstance(meta, dict) else None
        if not isinstance(iid, str) or not iid or "prompt" not in row:
            raise InputError(f"{p} line {lineno}: need 'prompt' and 'metadata.instance_id'")
        if iid in seen:
            raise InputError(f"{p} line {lineno}: duplicate instance_id {iid!r}")
        seen.add(iid)
        tasks.append(PilotTask(iid, row["prompt"], meta))
    return tasks


def sample_tasks(
    tasks: Sequence[PilotTask], max_tasks: int | None, seed: int = 0
) -> list[PilotTask]:
    """``max_tasks`` tasks drawn with ``seed`` (same draw on every rerun), in file order; all when None."""
    if max_tasks is None or max_tasks >= len(tasks):
        return list(tasks)
    if max_tasks <= 0:
        raise InputError(f"--max-tasks {max_tasks}: must be > 0")
    chosen = set(random.Random(seed).sample(range(len(tasks)), max_tasks))
    return [t for i, t in enumerate(tasks) if i in chosen]


def load_results(
    path: str | os.PathLike[str], *, repair: bool = False
) -> dict[Key, dict[str, Any]]:
    """Finished trials, ``(instance_id, trial) -> line`` (the later line wins).

    A torn last line is ignored, and cut from the file when ``repair`` (default False).
    """
    p = Path(path)
    if not p.exists():
        return {}
    data = p.read_bytes()
    lines = data.split(b"\n")
    records: dict[Key, dict[str, Any]] = {}
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            key = (str(rec["instance_id"]), int(rec["trial"]))
            Outcome.parse(rec["outcome"], field=f"{p} line {i}: outcome")
        except (ValueError, KeyError, TypeError) as e:
            if i == len(lines):  # no newline after it: torn by an interruption
                if repair:
                    p.write_bytes(data[: len(data) - len(raw)])
                break
            raise InputError(
                f"{p} line {i}: not a pilot result ({type(e).__name__}: {e})"
            ) from None
        records[key] = rec
        if i == len(lines) and repair:  # complete but unterminated: end it before appending
            with p.open("ab") as f:
                f.write(b"\n")
    return records


def attempts(path: str | os.PathLike[str]) -> dict[Key, list[str]]:
    """Every attempt of every trial, ``(instance_id, trial) -> [outcome, ...]`` in file order
    (a retried trial has several; a torn last line is not one)."""
    p = Path(path)
    out: dict[Key, list[str]] = {}
    if not p.exists():
        return out
    for raw in p.read_bytes().split(b"\n"):
        try:
            rec = json.loads(raw)
            key = (str(rec["instance_id"]), int(rec["trial"]))
            out.setdefault(key, []).append(Outcome.parse(rec["outcome"]).value)
        except (ValueError, KeyError, TypeError):
            continue  # load_results has already refused a bad line in the middle
    return out


def default_agent_kwargs(
    model: str, concurrency: int, log_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``swe_smith_tasks.agent.run``: its settings from the environment
    (``RESCUE_SWE_*``, as in training) with ``model_name=model``, ``max_concurrency=concurrency``
    and, when given, ``log_dir`` (trajectories and grader logs; default none)."""
    from swe_smith_tasks.agent import AgentSettings

    overrides: dict[str, Any] = {"model_name": model, "max_concurrency": concurrency}
    if log_dir is not None:
        overrides["log_dir"] = str(log_dir)
    return {"settings": AgentSettings.from_env(**overrides)}


def resolve_trial_fn(spec: str | TrialFn = DEFAULT_TRIAL_FN) -> TrialFn:
    """The trial function: a callable, or ``"pkg.module.func"`` / ``"pkg.module:func"``."""
    if callable(spec):
        return spec
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module or not name:
        raise InputError(f"--agent {spec!r}: expected 'package.module.function'")
    return getattr(importlib.import_module(module), name)


def _record(task: PilotTask, trial: int, model: str, result: Any, elapsed: float) -> dict[str, Any]:
    result = dict(result) if isinstance(result, Mapping) else {}
    c = classify(reward=result.get("reward"), metadata=result, agentic=True)
    rec = {
        "instance_id": task.instance_id,
        "trial": trial,
        "outcome": c.outcome.value,
        "reason": c.reason,
    }
    rec.update({k: result[k] for k in KEPT_FIELDS if k in result})
    rec.update({"model": model, "elapsed_s": round(elapsed, 3)})
    return rec


class _Progress:
    """tqdm when installed, else a one-line bar on stderr; silent when disabled."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, initial, enabled
        self.counts: Counter[str] = Counter()
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total, initial=initial, desc="pilot", unit="trial", file=sys.stderr
                )
            except ImportError:
                self.bar = None

    def update(self, outcome: str) -> None:
        self.done += 1
        self.counts[outcome] += 1
        if not self.enabled:
            return
        mix = " ".join(f"{o.value.split('_')[0]}={self.counts[o.value]}" for o in OUTCOMES)
        if self.counts["error"]:
            mix += f" error={self.counts['error']}"
        if self.bar is not None:
            self.bar.set_postfix_str(mix, refresh=False)
            self.bar.update(1)
        else:
            filled = int(30 * self.done / max(self.total, 1))
            sys.stderr.write(
                f"\rpilot [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {mix}"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


async def _run_trials(
    pending,
    tasks,
    trial_fn,
    trial_kwargs,
    base_url,
    request_kwargs,
    model,
    concurrency,
    sink,
    progress,
):
    queue = list(reversed(pending))
    first_error = True

    async def one(key: Key) -> dict[str, Any]:
        nonlocal first_error
        task, trial = tasks[key[0]], key[1]
        start = time.monotonic()
        inner = asyncio.ensure_future(
            trial_fn(
                base_url=base_url,
                prompt=task.prompt,
                request_kwargs=dict(request_kwargs),
                metadata={**task.metadata, "pilot_trial": trial},
                **trial_kwargs,
            )
        )
        try:
            # asyncio.wait does not pass a cancellation on to the trial, so the pilot sees
            # its own shutdown even when the agent turns cancellation into a result.
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            inner.cancel()
            await asyncio.wait({inner})  # let the agent clean up; its answer is not an outcome
            if not inner.cancelled():
                inner.exception()  # retrieved: no "never retrieved" warning
            raise
        try:
            result = inner.result()
        except Exception as e:  # a fault in the code: an error, never a lost trial
            if first_error:
                first_error = False
                traceback.print_exception(e, file=sys.stderr)
            return {
                "instance_id": task.instance_id,
                "trial": trial,
                "error": f"{type(e).__name__}: {e}",
                "traceback": "".join(traceback.format_exception(e)),
                "model": model,
            }
        return _record(task, trial, model, result, time.monotonic() - start)

    async def worker() -> None:
        while queue:
            rec = await one(queue.pop())
            sink(rec)
            progress.update(rec.get("outcome", "error"))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(queue)))))


def run_pilot(
    tasks: Sequence[PilotTask],
    out_dir: str | os.PathLike[str],
    *,
    base_url: str,
    model: str,
    n: int = 8,
    concurrency: int = 32,
    trial_fn: str | TrialFn = DEFAULT_TRIAL_FN,
    request_kwargs: Mapping[str, Any] | None = None,
    trial_kwargs: Mapping[str, Any] | None = None,
    retry_infra: bool = False,
    progress: bool = True,
) -> dict[Key, dict[str, Any]]:
    """Run the unfinished trials of ``tasks``, appending to ``out_dir/results.jsonl``.

    Defaults: ``n=8`` trials per task, ``concurrency=32``, ``trial_fn`` the agent function,
    ``request_kwargs`` ``{}`` (sampling parameters), ``trial_kwargs`` ``{}`` (extra keyword
    arguments of the trial function), ``retry_infra=False``. ``model`` names the policy in
    the results (a results file of another model is refused). Returns every
    finished trial of these tasks. A ``KeyboardInterrupt`` propagates; what finished is on
    disk and a rerun continues. Trials whose function raised are in ``errors.jsonl`` and
    raise ``TrialErrors`` once the others are done.
    """
    if n < 1 or concurrency < 1:
        raise InputError(f"--n {n} / --concurrency {concurrency}: both must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    done = load_results(path, repair=True)
    others = {r["model"] for r in done.values() if r.get("model") not in (None, model)}
    if others:
        raise InputError(
            f"{path} holds trials of model {sorted(others)[0]!r}, not --model {model!r}; "
            "use another --out directory"
        )
    by_id = {t.instance_id: t for t in tasks}
    finished = {
        k
        for k, r in done.items()
        if not (retry_infra and r["outcome"] == Outcome.INFRA_NO_RESULT.value)
    }
    pending = [
        (t.instance_id, i) for t in tasks for i in range(n) if (t.instance_id, i) not in finished
    ]
    fn = resolve_trial_fn(trial_fn)
    bar = _Progress(total=len(tasks) * n, initial=len(tasks) * n - len(pending), enabled=progress)
    errors = 0
    with path.open("a") as f:

        def sink(rec: dict[str, Any]) -> None:
            nonlocal errors
            if "outcome" not in rec:
                errors += 1
                with (out / ERRORS).open("a") as e:
                    e.write(json.dumps(rec, default=str) + "\n")
                return
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            done[(rec["instance_id"], rec["trial"])] = rec

        try:
            if pending:
                asyncio.run(
                    _run_trials(
                        pending,
                        by_id,
                        fn,
                        dict(trial_kwargs or {}),
                        base_url,
                        dict(request_kwargs or {}),
                        model,
                        concurrency,
                        sink,
                        bar,
                    )
                )
        finally:
            bar.close()
    if errors:
        raise TrialErrors(errors, out / ERRORS)
    return {k: r for k, r in done.items() if k[0] in by_id}
