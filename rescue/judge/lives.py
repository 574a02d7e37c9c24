"""A resumed run's rows: each step read once, from the last life that logged it.

A run killed and resumed from its checkpoint of step N (``RESUME=1``) trains the steps after
N again, and Miles logs them again: the steps between the checkpoint and the kill appear
twice in the run's history, once per life. The launchers keep one wandb run id across the
lives (``WANDB_RUN_ID``; offline, one folder per process and life, which
``rescue.judge.inputs`` joins), and rescue's census says which life logged each of its rows
(``rescue.restart.LIFE_KEY``, ``rollout/census/life``: 1, 2, ...).

Specification
-------------
``each_step_once(rows) -> (rows, note)``:

- a row's life: walking the rows in time order (``_timestamp``, which wandb adds to every
  row; the logged order where a row lacks it), the life of the latest census row at or
  before it (a census row's own; rows before the first census row, the first's). A life
  starts after the earlier one died, so its processes' rows come after every row of the
  earlier life;
- for each later life and each step key (``STEP_KEYS``), the rows of earlier lives at or
  after the later life's first step of that key are left out: the later life trained those
  steps again, and its rows are the run's. Rows without a step key stay;
- ``note`` says so: the lives, where each began, and how many rows were left out (None for
  a run with one life, whose rows come back unchanged, in their order).

The rows kept keep their logged order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rescue.restart import LIFE_KEY

#: The step keys of Miles' rows: rollout-side, optimizer steps, evaluations.
STEP_KEYS = ("rollout/step", "train/step", "eval/step")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def each_step_once(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """The rows with each step read once, from its last life, and a note (module docstring)."""
    lives = [_number(r.get(LIFE_KEY)) for r in rows]
    if max((v for v in lives if v is not None), default=1.0) <= 1:
        return list(rows), None
    stamps = [_number(r.get("_timestamp")) for r in rows]
    order = list(range(len(rows)))
    if all(s is not None for s in stamps):
        order.sort(key=lambda i: (stamps[i], i))
    first = next(v for v in (lives[i] for i in order) if v is not None)
    life_of: dict[int, int] = {}
    current = first
    for i in order:
        if lives[i] is not None:
            current = lives[i]
        life_of[i] = int(current)
    starts: dict[int, dict[str, float]] = {}
    for i, row in enumerate(rows):
        for key in STEP_KEYS:
            step = _number(row.get(key))
            if step is not None:
                own = starts.setdefault(life_of[i], {})
                own[key] = min(own.get(key, step), step)
    dropped = 0
    kept = []
    for i, row in enumerate(rows):
        later = [starts[life] for life in starts if life > life_of[i]]
        superseded = any(
            (step := _number(row.get(key))) is not None and key in s and step >= s[key]
            for s in later
            for key in STEP_KEYS
        )
        if superseded:
            dropped += 1
        else:
            kept.append(row)
    began = ", ".join(
        f"life {life} from step {int(s['rollout/step'])}" if "rollout/step" in s else f"life {life}"
        for life, s in sorted(starts.items())
    )
    note = (
        f"resumed ({len(starts)} lives: {began}): each step read once, from the last life that "
        f"logged it ({dropped} rows of steps an earlier life logged and a later one trained "
        "again left out)"
    )
    return kept, note
