"""The axes of rescue's keys in wandb: its ``define_metric`` declarations, in one place.

Specification
-------------
Every key rescue logs plots against the step it is logged at: the census and the rest of
the rollout side (``rollout/census/*``, ``rollout/rescue/*``) against ``rollout/step``,
the trainer's (``train/rescue/*``) against ``train/step`` (``DECLARATIONS``). Miles and
slime declare ``rollout/*`` and ``train/*`` the same way in the process that starts the
run; rescue declares its own keys where it logs them, so its axes do not depend on that
(Miles' tracking notes that a declaration made by a secondary process in wandb's shared
mode may not reach the server: the framework's own then holds). The simulator trains once
per rollout step: it logs every key at ``rollout/step`` and declares them there
(``train_step=STEP``).

The panels keyed by b (``B_AXIS``) take ``rollout/census/b_prior`` as their x axis: b
pooled over the steps *before* the step, so that it does not share the step's rollouts'
noise with the rates plotted against it (the cap-hit rate of the same rollouts would
correlate with their own b whatever the policy did). wandb plots y against a custom x only
in rows that hold both: ``b_prior`` is logged in the same row as the census' rates (one
``step_metrics`` dict), and declared like them.

``declare(define_metric)`` makes the declarations with any ``define_metric`` (a run's, or
``wandb.define_metric``); ``declare_in_process()`` makes them once per run on the wandb
run this process has, and does nothing without one (wandb off, or not installed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The rollout side's step key (Miles', slime's and the simulator's).
STEP = "rollout/step"
#: The trainer's step key (Miles' and slime's ``train/step``).
TRAIN_STEP = "train/step"
#: The x axis of the panels keyed by b (module docstring).
B_AXIS = "rollout/census/b_prior"
#: ``(glob, step key)``; ``None``: the trainer's step key of the caller.
DECLARATIONS: tuple[tuple[str, str | None], ...] = (
    ("rollout/census/*", STEP),
    ("rollout/rescue/*", STEP),
    ("train/rescue/*", None),
)

_declared: set[str] = set()


def declare(define_metric: Callable[..., Any], *, train_step: str = TRAIN_STEP) -> None:
    """Declare the step keys, then each of ``DECLARATIONS`` against its step."""
    for step in dict.fromkeys((STEP, train_step)):
        define_metric(step)
    for glob, step in DECLARATIONS:
        define_metric(glob, step_metric=step or train_step)


def declare_in_process(*, train_step: str = TRAIN_STEP) -> bool:
    """``declare`` on this process's wandb run, once per run id; False when there is none."""
    try:
        import wandb
    except ImportError:
        return False
    run = wandb.run
    if run is None:
        return False
    if run.id not in _declared:
        declare(run.define_metric, train_step=train_step)
        _declared.add(run.id)
    return True


def step_of(key: str, *, train_step: str = TRAIN_STEP) -> str | None:
    """The step key ``key`` is declared against, or None when no declaration covers it."""
    for glob, step in DECLARATIONS:
        if key.startswith(glob.removesuffix("*")):
            return step or train_step
    return None
