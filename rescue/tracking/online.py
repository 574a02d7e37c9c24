"""Runs of a wandb project read through ``wandb.Api``, each history scanned once.

Specification
-------------
``read_project("wandb:ENTITY/PROJECT[/GROUP]", cache=DIR)`` lists the project's runs
(those of wandb group GROUP only, when given) with wandb's public API and returns each as
a ``history.RunLog`` (group, name, tags, config, state, the history rows), which the judge
reads exactly as it reads an offline folder's (``rescue.judge.inputs.run_from_log``): the
same arm and seed naming, the same cohorts, checks and report.

Each run's history is scanned once: its rows are cached on disk, under
``DIR/ENTITY/PROJECT/<run id>.json`` with the run's last step (wandb's ``_step`` of its last
row, ``Run.lastHistoryStep``). A later reading asks the run's last step only; when it moved
on, only the rows after the cached last step are scanned and appended (when it went back,
as a rewound resume does, the whole history is scanned again). The cache file is replaced
whole when a run has been read, so an interrupted reading keeps every run read before it.
Rows keep wandb's key convention (``history.KEY_JOIN``) and values (``history.decode``).

A run still running is judged on the steps it logged so far, with a note saying so. A run
that logged no key of rescue's (nothing under ``rollout/census/``) is an error naming it.
What the service answers with a failure is one line each (``InputError``): no such project,
no credentials (``wandb login`` / ``WANDB_API_KEY``), credentials the server cannot verify
(a wrong key, or no network at login), the server out of reach, a rate limit (HTTP 429, once
wandb's own retries gave up).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.tracking.history import RunLog, decode_row

#: How a ``RUNS`` argument names a wandb project.
PREFIX = "wandb:"
#: Key prefix every run of rescue logs (the census of the buffer, the log function or the
#: simulator): a run without any is not rescue's.
RESCUE_KEYS = ("rollout/census/",)
#: Format tag of a cache file.
CACHE_FORMAT = "rescue-wandb-history/1"
#: History rows asked per request.
PAGE_SIZE = 1000
#: Seconds wandb's API waits for one request.
TIMEOUT_S = 60

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Project:
    """``wandb:ENTITY/PROJECT[/GROUP]``."""

    entity: str
    project: str
    group: str | None = None

    @property
    def path(self) -> str:
        return f"{self.entity}/{self.project}"

    def __str__(self) -> str:
        return PREFIX + self.path + (f"/{self.group}" if self.group else "")


def parse_project(text: str) -> Project:
    """``wandb:ENTITY/PROJECT[/GROUP]`` -> ``Project``; a one-line error otherwise."""
    body = text.removeprefix(PREFIX)
    parts = body.split("/", 2)
    if len(parts) < 2 or not all(_NAME.match(p) for p in parts[:2]) or "" in parts:
        raise InputError(
            f"RUNS: {text!r}; allowed: wandb:ENTITY/PROJECT or wandb:ENTITY/PROJECT/GROUP "
            "(letters, digits, '_', '.', '-')"
        )
    return Project(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/rescue/wandb`` (``~/.cache/rescue/wandb`` when it is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rescue" / "wandb"


class HistoryCache:
    """The rows of each run read, by run id, with its last step (module docstring)."""

    def __init__(self, root: Path, project: Project) -> None:
        self.dir = Path(root) / project.entity / project.project

    def path(self, run_id: str) -> Path:
        return self.dir / f"{run_id}.json"

    def load(self, run_id: str) -> tuple[int, list[dict[str, Any]]] | None:
        """``(last step, rows)`` cached for the run, or None (none, or not a cache file)."""
        try:
            data = json.loads(self.path(run_id).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            return None
        return int(data["last_step"]), [decode_row(r) for r in data["rows"]]

    def save(self, run_id: str, last_step: int, rows: list[dict[str, Any]]) -> None:
        """Replace the run's cache file whole (a temporary sibling renamed over it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(run_id).with_suffix(".tmp")
        data = {"format": CACHE_FORMAT, "run_id": run_id, "last_step": last_step, "rows": rows}
        tmp.write_text(json.dumps(data, allow_nan=True))
        tmp.replace(self.path(run_id))


def read_project(
    text: str,
    *,
    cache: Path | None = None,
    progress: bool = True,
    api_factory: Callable[[], Any] | None = None,
) -> tuple[list[RunLog], list[str]]:
    """Every run of ``wandb:ENTITY/PROJECT[/GROUP]`` and a note per thing said about them
    (module docstring). ``api_factory`` makes the ``wandb.Api`` (default: wandb's own)."""
    project = parse_project(text)
    store = HistoryCache(cache or default_cache(), project)
    try:
        api = (api_factory or _api)()
        filters = {"group": project.group} if project.group else None
        runs = list(api.runs(project.path, filters=filters, per_page=100, lazy=False))
        logs, notes = [], []
        from rescue.progress import progress_bar

        desc = f"reading {project}"
        with progress_bar(len(runs), unit="runs", desc=desc, enabled=progress) as bar:
            for run in runs:
                log = _read_run(run, project, store)
                if log.state == "running":
                    notes.append(
                        f"{log.source}: run {log.name or log.run_id} is still running: judged on "
                        f"the {len(log.rows)} rows it logged so far (the next reading adds what "
                        "follows)"
                    )
                logs.append(log)
                bar.update(1)
    except InputError:
        raise
    except Exception as e:
        raise InputError(
            f"{project}: {explain(e, project.entity, project.project, store.dir)}"
        ) from None
    if not logs:
        where = f"group {project.group!r} of " if project.group else ""
        raise InputError(f"{project}: no run in {where}{project.path}")
    return logs, notes


def _api() -> Any:
    import wandb

    return wandb.Api(timeout=TIMEOUT_S)


def _read_run(run: Any, project: Project, store: HistoryCache) -> RunLog:
    """One run: its history from the cache, scanning what it does not hold yet."""
    last = int(run.lastHistoryStep)
    cached = store.load(run.id)
    if cached is not None and cached[0] == last:
        rows = cached[1]
    else:
        keep = cached is not None and cached[0] < last
        start = cached[0] + 1 if keep and cached is not None else 0
        new = [decode_row(dict(r)) for r in run.scan_history(page_size=PAGE_SIZE, min_step=start)]
        rows = (cached[1] if keep and cached is not None else []) + new
        store.save(run.id, last, rows)
    log = RunLog(
        run_id=run.id,
        rows=rows,
        group=run.group or None,
        name=run.name or None,
        tags=list(run.tags or []),
        config=dict(run.config or {}),  # wandb's {"value": x} unwrapped by the API
        source=f"{PREFIX}{project.path}/{run.id}",
        state=run.state,
        last_step=last,
    )
    if not any(k.startswith(RESCUE_KEYS) for r in rows for k in r):
        raise InputError(
            f"{log.source}: run {log.name or log.run_id} logged no key of rescue's (nothing "
            f"under {', '.join(RESCUE_KEYS)}); allowed: runs of rescue's launchers or simulator "
            "(name their group: wandb:ENTITY/PROJECT/GROUP)"
        )
    return log


def explain(e: Exception, entity: str, project: str, cache: Path | None = None) -> str:
    """One line saying what a failure of wandb's service means and what to do."""
    if isinstance(e, ImportError):
        return f"reading a wandb project needs wandb ({e}): pip install 'rescue[sim]'"
    from wandb.errors import AuthenticationError, UsageError

    cause = getattr(e, "exc", None) or e  # wandb's CommError wraps the service's error
    text = " ".join(str(e).split())[:300]
    status = getattr(getattr(cause, "response", None), "http_status", None) or None
    if isinstance(e, UsageError):
        return f"no wandb credentials ({text}): run `wandb login` or export WANDB_API_KEY"
    if isinstance(e, AuthenticationError):
        return (
            f"the wandb credentials could not be verified ({text}): check WANDB_API_KEY and "
            "WANDB_BASE_URL, and that this machine reaches the server"
        )
    if isinstance(e, ValueError) and str(e).startswith("Could not find project"):
        return (
            f"no such project: entity {entity!r} has no project {project!r} these credentials "
            "can read"
        )
    if status == 429:
        kept = f"; the runs read so far are cached in {cache}" if cache else ""
        return (
            f"the wandb server is limiting the rate of requests (HTTP 429: {text}){kept}: run "
            "the command again later"
        )
    if status in (401, 403):
        return f"the wandb server refused the credentials (HTTP {status}: {text})"
    if status is None and type(cause).__name__ == "WandbApiFailedError":
        return f"cannot reach the wandb server ({text}); check the network and WANDB_BASE_URL"
    if status is not None:
        return f"the wandb server failed (HTTP {status}: {text})"
    return f"reading the project failed: {type(e).__name__}: {text}"
