"""Where a Miles run resumes from: its checkpoint's step and the data source's counter.

``resume_point(args) -> (checkpoint, drawn)`` as Miles decides it at 31f1ca96: a run that
starts from nothing has ``--start-rollout-id`` 0 (``utils/arguments.py`` ~3034-3058 sets it
when ``--load`` holds no ``latest_checkpointed_iteration.txt``), so (None, None); a resumed
run has none in the rollout manager's arguments (the driver sets it only after the train
actors loaded the checkpoint, ``ray/placement_group.py`` ~177) and resumes from Megatron's
tracker in ``--load`` (or ``--ckpt-step``): step N, ``start_rollout_id`` N + 1
(``backends/megatron_utils/actor.py`` ~212). ``drawn`` is the data source's
``sample_group_index`` in ``rollout/global_dataset_state_dict_{N}.pt`` (``rollout/
data_source.py`` ~128-158): the groups drawn by the checkpoint; None when the file is
missing (Miles then starts the prompts from the first, and says so in its log).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Megatron's file naming the latest checkpoint's iteration (Miles' rollout id).
TRACKER = "latest_checkpointed_iteration.txt"
#: Miles' data-source state of a checkpoint.
DATA_STATE = "rollout/global_dataset_state_dict_{step}.pt"


def resume_point(args: Any) -> tuple[int | None, int | None]:
    """The checkpoint step Miles resumes from and the groups drawn by then (module
    docstring); ``(None, None)`` for a run that starts from nothing."""
    start = getattr(args, "start_rollout_id", None)
    load = getattr(args, "load", None)
    if start is not None:
        checkpoint = int(start) - 1 if int(start) > 0 else None
    else:
        checkpoint = tracked_step(load, getattr(args, "ckpt_step", None))
    if checkpoint is None or load is None:
        return checkpoint, None
    return checkpoint, drawn_by(load, checkpoint)


def tracked_step(load: str | None, ckpt_step: int | None = None) -> int | None:
    """The step Megatron loads from ``load``: ``ckpt_step`` when given, else its tracker's
    (None: no tracker, or a ``release`` checkpoint, which starts a run)."""
    if ckpt_step:
        return int(ckpt_step)
    if not load:
        return None
    tracker = Path(load) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


def drawn_by(load: str, step: int) -> int | None:
    """The data source's group counter at the checkpoint of ``step`` (None: no state)."""
    path = Path(load) / DATA_STATE.format(step=step)
    if not path.is_file():
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an unreadable state counts as none, said in the log
        logger.warning("restart: %s cannot be read (%s): groups drawn unknown", path, e)
        return None
    value = state.get("sample_group_index") if isinstance(state, dict) else None
    return int(value) if value is not None else None
