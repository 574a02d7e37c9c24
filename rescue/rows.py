"""Rows of a dataset: a local file or a Hugging Face dataset name, one reader for every prepare step.

``read_rows(source, split=, config=)`` yields ``(where, row)`` pairs; ``where`` locates the row
in error messages (``rows.jsonl line 3``, ``openai/gsm8k[train] row 3``). A ``source`` that
exists on disk, or ends in one of ``FILE_SUFFIXES``, is read as a file (``.jsonl``, ``.json``:
a list of rows, ``.parquet``); anything else is a dataset name loaded with ``datasets``
(``split``, default ``train``; ``config``, default none). A missing file, bad JSON or a
dataset that does not load is an ``InputError`` naming the source.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rescue.errors import InputError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_rows(
    source: str, *, split: str = "train", config: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` pairs from a local file or a Hugging Face dataset name (module docstring)."""
    path = Path(source)
    if path.exists() or path.suffix.lower() in FILE_SUFFIXES:
        yield from _read_file(path)
    else:
        yield from _read_hf(source, split, config)


def _read_file(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path} line {lineno}: not valid JSON ({e})") from None
                yield f"{path} line {lineno}", row
    elif suffix == ".json":
        try:
            rows = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(rows, list):
            raise InputError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
        for i, row in enumerate(rows, 1):
            yield f"{path} row {i}", row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        i = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                i += 1
                yield f"{path} row {i}", row
    else:
        raise InputError(
            f"input file {str(path)!r}: unsupported suffix {suffix!r}; allowed: "
            + ", ".join(FILE_SUFFIXES)
        )


def _read_hf(name: str, split: str, config: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"reading the Hugging Face dataset {name!r} needs the 'datasets' package "
            "(pip install datasets), or pass a local .jsonl/.json/.parquet file"
        ) from None
    label = name if config is None else f"{name}/{config}"
    try:
        if config is None:
            ds = datasets.load_dataset(name, split=split)
        else:
            ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:
        raise InputError(
            f"could not load Hugging Face dataset {label!r} (split {split!r}): "
            f"{type(e).__name__}: {e}"
        ) from None
    for i, row in enumerate(ds, 1):
        yield f"{label}[{split}] row {i}", dict(row)
