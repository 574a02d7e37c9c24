"""The one reader of a run's wandb records, with one key convention.

Specification
-------------
``read_offline(folders)`` reads the ``offline-run-*`` folders of one run id (Miles' driver,
rollout manager and train actor each log to the run from their own process, each into a
folder of its own) with wandb's own reader of the transaction log, ``wandb leet inspect
--json`` (wandb >= 0.31), or ``wandb.sdk.internal.datastore.DataStore`` where the installed
wandb still has it (<= 0.28). Every ``run-*.wandb`` file of a folder is read, folders in the
order given (their names start with their start time, so sorted is time order); the rows
are joined in that order, the config merged, and the group, name and tags are the first
folder's that has them, the ``define_metric`` declarations (``RunLog.axes``: a name or
glob and the step key it plots against) gathered. ``history_rows(folders)`` is the rows
alone.

One key convention, wandb's own: a key logged nested (``run.log({"a": {"b": 1}})``) is
``a.b``, as wandb's reader, its public API and its app name it; a flat key keeps its
slashes (``rollout/census/b_all``). One value convention: wandb writes a non-finite number
as the JSON string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; ``decode`` turns those back
into floats (a logged string of those words reads as the number: wandb stores them alike).

A folder without a transaction log, a file that is not one (no ``:W&B`` header) and a
wandb that has neither reader are one-line errors (``InputError``) naming the path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError

#: How a nested key's parts are joined: wandb's own convention (its reader, API and app).
KEY_JOIN = "."
#: wandb's JSON spelling of the non-finite numbers.
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: The first bytes of a wandb transaction log.
MAGIC = b":W&B"


@dataclass
class RunLog:
    """What wandb holds of one run: who it is and the history rows it logged.

    ``state`` (``running``, ``finished``, ``crashed``, ...) and ``last_step`` (wandb's
    ``_step`` of the last row) are known for runs read online; ``source`` says where the
    rows came from (a folder, or ``wandb:ENTITY/PROJECT/RUN_ID``).
    """

    run_id: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    group: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    state: str | None = None
    last_step: int | None = None
    #: ``define_metric`` declarations read offline: name or glob -> its step key.
    axes: dict[str, str] = field(default_factory=dict)


def decode(value: Any) -> Any:
    """A logged value as wandb wrote it back into Python (``NON_FINITE`` strings as floats)."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    return value


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """``decode`` over a row's values."""
    return {k: decode(v) for k, v in row.items()}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``KEY_JOIN``-joined keys (how wandb names a nested key)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{KEY_JOIN}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def run_id_of(folder: Path) -> str:
    """The run id of an offline folder: its transaction log's name, ``run-<id>.wandb``."""
    return transaction_logs(folder)[0].stem.removeprefix("run-")


def transaction_logs(folder: Path) -> list[Path]:
    """The ``run-*.wandb`` files of an offline folder, sorted; an error when there is none."""
    files = sorted(Path(folder).glob("run-*.wandb"))
    if not files:
        raise InputError(f"{folder}: no run-*.wandb transaction log")
    return files


def read_offline(folders: Sequence[Path]) -> RunLog:
    """One run from the offline folders of one run id, in the order given (docstring)."""
    if not folders:
        raise InputError("no offline-run folder to read")
    log = RunLog(run_id=run_id_of(folders[0]))
    for folder in folders:
        for path in transaction_logs(folder):
            _check_magic(path)
            meta, rows = _scan(path)
            for key in ("group", "name"):
                if meta.get(key) and not getattr(log, key):
                    setattr(log, key, meta[key])
            if meta.get("tags") and not log.tags:
                log.tags = list(meta["tags"])
            log.config.update(meta.get("config") or {})
            log.axes.update(meta.get("axes") or {})
            log.rows.extend(rows)
    n = len(folders)
    log.source = str(folders[-1]) if n == 1 else f"{folders[-1]} (+{n - 1})"
    return log


def history_rows(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """The history rows of offline folders, joined in the order given (``read_offline``)."""
    rows: list[dict[str, Any]] = []
    for folder in folders:
        rows.extend(read_offline([Path(folder)]).rows)
    return rows


def _check_magic(path: Path) -> None:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise InputError(f"{path}: not a wandb run file (no {MAGIC.decode()} header)")


def _scan(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(meta, rows)`` of one transaction log, through the installed wandb's reader."""
    try:
        from wandb.sdk.internal.datastore import DataStore  # wandb <= 0.28
    except ImportError:
        return _from_records(_leet_records(path))
    return _from_records(_datastore_records(path, DataStore))


def _from_records(records: Iterator[dict[str, Any]]) -> tuple[dict[str, Any], list[dict]]:
    """Meta and rows from records in ``wandb leet inspect --json``'s shape."""
    meta: dict[str, Any] = {"config": {}, "axes": {}}
    rows = []
    for rec in records:
        kind = rec.get("type")
        if kind == "history":
            rows.append(decode_row(rec["history"].get("item") or {}))
        elif kind == "metric":
            metric = rec["metric"]
            name = metric.get("name") or metric.get("glob_name")
            if name and metric.get("step_metric"):
                meta["axes"][name] = metric["step_metric"]
        elif kind == "run":
            run = rec["run"]
            meta["group"] = run.get("run_group") or None
            meta["name"] = run.get("display_name") or None
            meta["tags"] = list(run.get("tags") or [])
            meta["config"].update((run.get("config") or {}).get("update") or {})
        elif kind == "config":
            meta["config"].update((rec["config"] or {}).get("update") or {})
    return meta, rows


def _leet_records(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a transaction log through ``wandb leet inspect --json`` (wandb >= 0.31),
    which writes a nested key joined with ``.`` (``KEY_JOIN``)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise InputError(
            f"{path}: `wandb leet inspect --json` failed ({done.stderr.strip()[-300:]}); reading "
            "wandb offline runs needs wandb >= 0.31 or <= 0.28 (pip install 'rescue[sim]'), or "
            "export the history to CSV/JSON"
        )
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            yield json.loads(line)


def _datastore_records(path: Path, store_cls: Any) -> Iterator[dict[str, Any]]:
    """Records of a transaction log through wandb's ``DataStore`` (wandb <= 0.28), in the
    shape ``wandb leet inspect --json`` prints (a nested key joined with ``KEY_JOIN``)."""
    from wandb.proto import wandb_internal_pb2

    def items(updates: Any) -> dict[str, Any]:
        return {i.key or KEY_JOIN.join(i.nested_key): json.loads(i.value_json) for i in updates}

    store = store_cls()
    store.open_for_scan(str(path))
    while (data := store.scan_data()) is not None:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            yield {"type": "history", "history": {"item": items(rec.history.item)}}
        elif kind == "run":
            run = {
                "run_group": rec.run.run_group,
                "display_name": rec.run.display_name,
                "tags": list(rec.run.tags),
                "config": {"update": items(rec.run.config.update)},
            }
            yield {"type": "run", "run": run}
        elif kind == "config":
            yield {"type": "config", "config": {"update": items(rec.config.update)}}
        elif kind == "metric":
            yield {
                "type": "metric",
                "metric": {
                    "name": rec.metric.name,
                    "glob_name": rec.metric.glob_name,
                    "step_metric": rec.metric.step_metric,
                },
            }
