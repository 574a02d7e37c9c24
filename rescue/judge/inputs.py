"""Reading runs: the simulator's census JSONL, wandb offline runs, CSV/JSON exports, replay reports.

Specification
-------------
``read_inputs(paths)`` takes files, directories and globs and returns the runs, the replay
reports and a note per thing it skipped (never silently):

- a directory with ``census/*.jsonl`` is a ``rescue sim`` output: its census JSONL and its
  ``runs.json`` (the P7 variances, attached to the runs of the same directory) are read;
  its ``wandb/`` holds the same runs and is not read again, its ``timing.json`` (seconds
  per run) is not a run and is skipped with a note;
- ``*.jsonl``: history rows, one JSON object per line; the run is named by the rows'
  ``arm`` / ``seed`` (the simulator), ``group`` / ``name`` / ``tags`` fields, or the file
  name (``<arm>-seed<s>.jsonl``, ``swe-drop-k2-seed1.jsonl``); the first row's
  ``scenario`` and ``config`` (the simulator writes its scenario and ``SimConfig`` there)
  place it in its cohort;
- ``*.csv``: a history export, one row per logged step, a column per key (empty cell =
  not logged). Several runs in one file are split by a ``group``, ``run`` or ``name``
  column; otherwise the file name names the run;
- ``*.json``: a ``rescue replay`` report (``offline.report_kind``); the simulator's
  ``runs.json``; a list of history rows; ``{"group", "name", "tags", "config",
  "history": [rows]}``; or ``{"runs": [such objects]}``. The gradient oracle's files
  (``oracle.json``, ``compare.json`` of ``rescue oracle``) are skipped with a note: no
  registered prediction reads them (P5 and P6 are judged on the runs' outcomes; the
  comparison of each arm's gradient with the oracle is ``rescue oracle compare``'s report);
- ``wandb/offline-run-*`` directories (or their ``run-*.wandb`` file): read with wandb's
  own reader of the transaction log: ``wandb leet inspect --json`` (wandb >= 0.31), or
  ``wandb.sdk.internal.datastore.DataStore`` where the installed wandb still has it
  (<= 0.28). The run's group, name, tags and config come from its run record, the rows
  from its history records. The folders of one run id beside each other are one run (Miles'
  driver, rollout manager and train actor each log to the run from their own process, each
  into a folder of its own): their rows are joined in the folders' time order, their
  config merged.

A run resumed from a checkpoint logged the steps it trained again twice: every run's rows
are read with each step once, from the last life that logged it (``rescue.judge.lives``),
and the notes say so.

Arm and seed come from ``runs.identify`` (tags, then group, then name, then config).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.judge.lives import each_step_once
from rescue.judge.offline import Report, report_kind
from rescue.judge.runs import Run, identify, parse_name

_RUN_COLUMNS = ("group", "run", "name", "run_name")


#: Format tags of the gradient oracle's files, which no prediction reads.
ORACLE_FORMATS = ("rescue-oracle/1", "rescue-oracle-compare/1")


class Skipped(Exception):
    """An input that is read but not judged; the message says why."""


@dataclass
class Inputs:
    """What was read: runs, replay reports, and what was skipped and why."""

    runs: list[Run] = field(default_factory=list)
    replays: list[Report] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def expand(paths: Sequence[str | os.PathLike]) -> tuple[list[tuple[str, Path]], list[str]]:
    """``(kind, path)`` of every input under ``paths`` (kind: jsonl, csv, json, wandb, runs.json)."""
    out: list[tuple[str, Path]] = []
    notes: list[str] = []
    for raw in paths:
        text = str(raw)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        if not matches:
            raise InputError(f"RUNS: {text!r} matches nothing")
        for m in matches:
            p = Path(m)
            if not p.exists():
                raise InputError(f"RUNS: {text!r} does not exist")
            out.extend(_expand_one(p, notes))
    return out, notes


def _expand_one(p: Path, notes: list[str]) -> Iterable[tuple[str, Path]]:
    if p.is_file():
        if p.suffix == ".wandb":
            return [("wandb", p.parent)]
        kind = {".jsonl": "jsonl", ".csv": "csv", ".json": "json"}.get(p.suffix)
        if kind is None:
            notes.append(f"{p}: not .jsonl, .csv, .json or .wandb; skipped")
            return []
        if p.name == "timing.json":
            notes.append(f"{p}: the simulator's seconds per run, not a run; skipped")
            return []
        return [("runs.json" if p.name == "runs.json" else kind, p)]
    if _is_wandb_run(p):
        return [("wandb", p)]
    census = p / "census"
    if census.is_dir() and any(census.glob("*.jsonl")):
        found = [("jsonl", f) for f in sorted(census.glob("*.jsonl"))]
        if (p / "runs.json").exists():
            found.append(("runs.json", p / "runs.json"))
        if (p / "wandb").is_dir():
            notes.append(f"{p / 'wandb'}: the same runs as {census}; not read again")
        return found
    found = []
    for root, dirs, files in os.walk(p):
        r = Path(root)
        dirs[:] = sorted(d for d in dirs if not (r / d).is_symlink())  # wandb's latest-run
        for d in dirs:
            if _is_wandb_run(r / d):
                found.append(("wandb", r / d))
        dirs[:] = [d for d in dirs if not _is_wandb_run(r / d)]
        for f in sorted(files):
            found.extend(
                _expand_one(r / f, notes) if Path(f).suffix in (".jsonl", ".csv", ".json") else []
            )
    return found


def _is_wandb_run(p: Path) -> bool:
    return p.is_dir() and any(p.glob("run-*.wandb"))


def read_inputs(paths: Sequence[str | os.PathLike], *, progress: bool = True) -> Inputs:
    """Read every input under ``paths`` (see the module docstring)."""
    from rescue.progress import progress_bar

    found, notes = expand(paths)
    result = Inputs(notes=notes)
    if not found:
        raise InputError(f"RUNS: nothing to read under {', '.join(map(str, paths))}")
    bar = progress_bar(
        len(found), unit="inputs", desc="reading runs", enabled=progress and len(found) > 1
    )
    offline_figures: list[tuple[Path, list[dict]]] = []
    wandb_dirs = [p for kind, p in found if kind == "wandb"]
    for kind, path in found:
        if kind == "wandb":
            continue
        result.sources.append(str(path))
        if kind == "jsonl":
            result.runs.append(read_jsonl(path))
        elif kind == "csv":
            result.runs.extend(read_csv(path))
        elif kind == "runs.json":
            figures = json.loads(path.read_text())
            if not isinstance(figures, list):
                raise InputError(f"{path}: the simulator's runs.json is a list of runs")
            offline_figures.append((path.parent, figures))
        else:
            try:
                runs, reports = read_json(path)
            except Skipped as e:
                result.notes.append(f"{path}: {e}; skipped")
                runs, reports = [], []
            result.runs.extend(runs)
            result.replays.extend(reports)
        bar.update(1)
    if wandb_dirs:
        by_id: dict[tuple[Path, str], list[Path]] = {}
        for d in wandb_dirs:  # the run id: the transaction log's name, run-<id>.wandb
            run_id = min(d.glob("run-*.wandb")).stem.removeprefix("run-")
            by_id.setdefault((d.parent, run_id), []).append(d)
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            for run in pool.map(read_wandb_run, [sorted(v) for v in by_id.values()]):
                result.runs.append(run)
                result.sources.append(run.source)
                bar.update(1)
        bar.update(len(wandb_dirs) - len(by_id))
    bar.close()
    _attach_offline(result.runs, offline_figures, result.notes)
    result.notes.extend(f"{run.source}: {note}" for run in result.runs for note in run.notes)
    return result


def _attach_offline(
    runs: list[Run], figures: list[tuple[Path, list[dict]]], notes: list[str]
) -> None:
    """The simulator's per-run P7 variances (``runs.json``) onto the runs they belong to:
    those read from the ``census/`` beside it, by arm and seed."""
    by_key = {(Path(r.source).parent.parent, r.condition.family, r.label, r.seed): r for r in runs}
    for where, entries in figures:
        for f in entries:
            parsed = parse_name(str(f.get("arm", "")))
            if parsed is None or "seed" not in f:
                notes.append(f"{where / 'runs.json'}: entry {f.get('arm')!r} names no arm; skipped")
                continue
            run = by_key.get((where, "sim", parsed[0].label, int(f["seed"])))
            if run is not None and f.get("p7"):
                run.offline["p7"] = f["p7"]


# ---------------------------------------------------------------- JSONL, CSV, JSON


def read_jsonl(path: Path) -> Run:
    """One run from a JSONL history (the simulator's census files)."""
    loads = json.loads
    with open(path, encoding="utf-8") as f:
        try:
            rows = [loads(line) for line in f if line.strip()]
        except json.JSONDecodeError as e:
            raise InputError(
                f"{path}: not JSON lines ({e}); allowed: one JSON object per line"
            ) from None
    return _run_from_rows(rows, path)


def _run_from_rows(rows: list[dict[str, Any]], path: Path, **meta: Any) -> Run:
    first = rows[0] if rows else {}
    config = dict(meta.pop("config", None) or {})
    if isinstance(first.get("config"), dict):
        config = {**first["config"], **config}
    for k in ("arm", "seed", "scenario"):
        if k in first and k not in config:
            config[k] = first[k]
    cond, seed = identify(
        tags=meta.get("tags") or first.get("tags") or (),
        group=meta.get("group") or first.get("group"),
        name=meta.get("name") or first.get("name") or path.stem,
        config=config,
        where=str(path),
    )
    rows, note = each_step_once(rows)
    return Run(cond, seed, rows, source=str(path), config=config, notes=[note] if note else [])


def read_csv(path: Path) -> list[Run]:
    """Runs from a CSV history export (see the module docstring)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        split = next((c for c in _RUN_COLUMNS if c in fields), None)
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in reader:
            cells = {k: _cell(v) for k, v in row.items() if k is not None and v not in ("", None)}
            groups.setdefault(str(row.get(split, "")) if split else "", []).append(cells)
    if not groups:
        raise InputError(f"{path}: a CSV export with no rows")
    runs = []
    for key, rows in groups.items():
        meta = {"group": key} if split in ("group",) else {"name": key} if split else {}
        runs.append(_run_from_rows(rows, path, **meta))
    return runs


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def read_json(path: Path) -> tuple[list[Run], list[Report]]:
    """Runs or replay reports from one JSON file (see the module docstring)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    kind = report_kind(data)
    if kind is not None:
        return [], [Report(kind, data, str(path))]
    if isinstance(data, dict) and data.get("format") in ORACLE_FORMATS:
        raise Skipped(
            "a gradient-oracle file (rescue oracle); no registered prediction reads it: P5 and "
            "P6 are judged on the runs' outcomes, and `rescue oracle compare` reports each "
            "arm's gradient against the oracle"
        )
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return [_run_from_rows(data, path)], []
    if isinstance(data, dict) and "history" in data:
        return [_run_from_record(data, path)], []
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return [_run_from_record(r, path) for r in data["runs"]], []
    raise InputError(
        f"{path}: not a run history or a `rescue replay --json` report; allowed: a list of rows, "
        '{"history": [rows], "group": ..., "tags": ...}, {"runs": [...]}, or a replay report'
    )


def _run_from_record(record: dict[str, Any], path: Path) -> Run:
    rows = record.get("history")
    if not isinstance(rows, list):
        raise InputError(f"{path}: field history must be a list of rows")
    return _run_from_rows(
        rows,
        path,
        group=record.get("group"),
        name=record.get("name") or record.get("display_name"),
        tags=record.get("tags"),
        config=record.get("config"),
    )


# ---------------------------------------------------------------- wandb offline runs


def read_wandb(run_dir: Path) -> Run:
    """One wandb offline run, read with wandb's own reader of its transaction log."""
    return read_wandb_run([Path(run_dir)])


def read_wandb_run(run_dirs: Sequence[Path]) -> Run:
    """One run from the offline folders of one run id, in time order (module docstring)."""
    meta: dict[str, Any] = {"config": {}}
    rows: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        files = sorted(Path(run_dir).glob("run-*.wandb"))
        if not files:
            raise InputError(f"{run_dir}: no run-*.wandb transaction log")
        part, part_rows = _scan(files[0])
        for key in ("name", "group", "tags"):
            if part.get(key) and not meta.get(key):
                meta[key] = part[key]
        meta["config"].update(part.get("config") or {})
        rows.extend(part_rows)
    where = str(run_dirs[0]) if len(run_dirs) == 1 else f"{run_dirs[-1]} (+{len(run_dirs) - 1})"
    cond, seed = identify(
        tags=meta.get("tags") or (),
        group=meta.get("group"),
        name=meta.get("name") or "",
        config=meta.get("config"),
        where=where,
    )
    rows, note = each_step_once(rows)
    return Run(
        cond, seed, rows, source=str(run_dirs[-1]), config=dict(meta["config"]),
        notes=[note] if note else [],
    )  # fmt: skip


def _scan(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        from wandb.sdk.internal.datastore import DataStore  # wandb <= 0.28
    except ImportError:
        return _scan_leet(path)
    return _scan_datastore(path, DataStore)


def _scan_leet(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Records of a transaction log through ``wandb leet inspect --json`` (wandb >= 0.31)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path.parent)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except FileNotFoundError as e:  # pragma: no cover - sys.executable always exists
        raise InputError(f"{path}: cannot run {cmd[0]}: {e}") from None
    if done.returncode != 0:
        raise InputError(
            f"{path}: `wandb leet inspect --json` failed ({done.stderr.strip()[-300:]}); reading "
            "wandb offline runs needs wandb >= 0.31 or <= 0.28 (pip install 'rescue[sim]'), or "
            "export the history to CSV/JSON"
        )
    meta: dict[str, Any] = {"config": {}}
    rows = []
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "history":
            rows.append(rec["history"].get("item", {}))
        elif kind == "run":
            run = rec["run"]
            meta["group"] = run.get("run_group")
            meta["name"] = run.get("display_name")
            meta["tags"] = run.get("tags") or []
            meta["config"].update((run.get("config") or {}).get("update") or {})
        elif kind == "config":
            meta["config"].update((rec["config"] or {}).get("update") or {})
    return meta, rows


def _scan_datastore(path: Path, store_cls: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Records of a transaction log through wandb's ``DataStore`` (wandb <= 0.28)."""
    from wandb.proto import wandb_internal_pb2

    def item_key(item: Any) -> str:
        return item.key or ".".join(item.nested_key)

    store = store_cls()
    store.open_for_scan(str(path))
    meta: dict[str, Any] = {"config": {}}
    rows = []
    while (data := store.scan_data()) is not None:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({item_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            meta["group"] = rec.run.run_group
            meta["name"] = rec.run.display_name
            meta["tags"] = list(rec.run.tags)
            meta["config"].update(
                {item_key(i): json.loads(i.value_json) for i in rec.run.config.update}
            )
        elif kind == "config":
            meta["config"].update(
                {item_key(i): json.loads(i.value_json) for i in rec.config.update}
            )
    return meta, rows
