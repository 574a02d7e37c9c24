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
- ``wandb/offline-run-*`` directories (or their ``run-*.wandb`` file): read with
  ``rescue.tracking.history``, the one reader of wandb's records (wandb's own reader of the
  transaction log; a nested key joined with ``.``). The run's group, name, tags and config
  come from its run record, the rows from its history records. The folders of one run id
  beside each other are one run (Miles' driver, rollout manager and train actor each log to
  the run from their own process, each into a folder of its own): their rows are joined in
  the folders' time order, their config merged;
- ``wandb:ENTITY/PROJECT[/GROUP]``: the runs of a wandb project (of one group) through
  ``wandb.Api`` (``rescue.tracking.online``: each history scanned once and cached on disk),
  turned into runs exactly as an offline folder's are (``run_from_log``).

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
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rescue.errors import InputError
from rescue.judge.lives import each_step_once
from rescue.judge.offline import Report, report_kind
from rescue.judge.runs import Run, identify, parse_name

if TYPE_CHECKING:
    from rescue.tracking.history import RunLog

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


def read_inputs(
    paths: Sequence[str | os.PathLike], *, progress: bool = True, cache: Path | None = None
) -> Inputs:
    """Read every input under ``paths`` (see the module docstring); ``cache``: where the
    histories of runs read from a wandb project are kept (``rescue.tracking.online``)."""
    from rescue.progress import progress_bar
    from rescue.tracking.online import PREFIX

    online = [str(p) for p in paths if str(p).startswith(PREFIX)]
    local = [p for p in paths if not str(p).startswith(PREFIX)]
    found, notes = expand(local) if local else ([], [])
    result = Inputs(notes=notes)
    if online:
        _read_online(online, result, cache=cache, progress=progress)
    if not found and not online:
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
        from rescue.tracking.history import run_id_of

        by_id: dict[tuple[Path, str], list[Path]] = {}
        for d in wandb_dirs:  # the run id: the transaction log's name, run-<id>.wandb
            run_id = run_id_of(d)
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


def _read_online(specs: list[str], result: Inputs, *, cache: Path | None, progress: bool) -> None:
    """The runs of each ``wandb:ENTITY/PROJECT[/GROUP]``, read as offline runs are."""
    from rescue.tracking.online import read_project

    for spec in specs:
        logs, notes = read_project(spec, cache=cache, progress=progress)
        result.notes.extend(notes)
        for log in logs:
            result.runs.append(run_from_log(log))
            result.sources.append(log.source)


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
    """One run from the offline folders of one run id, in time order (module docstring),
    through ``rescue.tracking.history``, the one reader of wandb's records."""
    from rescue.tracking.history import read_offline

    return run_from_log(read_offline([Path(d) for d in run_dirs]))


def run_from_log(log: RunLog) -> Run:
    """The judge's ``Run`` of what wandb holds of a run (offline or online): arm and seed
    from its tags, group, name or config (``runs.identify``)."""
    cond, seed = identify(
        tags=log.tags, group=log.group, name=log.name or "", config=log.config, where=log.source
    )
    rows, note = each_step_once(log.rows)
    return Run(
        cond, seed, rows, source=log.source, config=dict(log.config),
        notes=[note] if note else [],
    )  # fmt: skip
