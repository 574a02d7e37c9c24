"""One (arm, seed) run of the simulator: what it produced, and its offline wandb run.

Specification
-------------
``run_one`` simulates one arm with one seed (``engine.Simulation``, deterministic in the
seed) and returns a ``RunResult``; it is the function every way of running the grid calls,
in this process, in a worker process (``runner``) or as a Ray task (``cluster``), so the
three give the same results byte for byte. It lives below both ``runner`` and
``cluster``, which import it from here and never each other's module for it.

After every trainer step ``run_one`` calls the step hook that ``set_step_hook`` installed
in this process (none by default): the runner counts steps with it for its progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.engine import Simulation


@dataclass
class RunResult:
    """What one (arm, seed) run produced."""

    arm: str
    seed: int
    steps: list[dict[str, float]]
    totals: dict[str, int]
    p7: dict[str, float]
    seconds: float


_step_hook: Callable[[], None] | None = None  # called after every trainer step


def set_step_hook(hook: Callable[[], None] | None) -> None:
    """Call ``hook()`` after every trainer step of the runs in this process (None: nothing)."""
    global _step_hook
    _step_hook = hook


def _tick(step: int) -> None:
    if _step_hook is not None:
        _step_hook()


def run_one(
    cfg: SimConfig,
    arm: ArmSpec,
    seed: int,
    *,
    wandb_dir: Path | None = None,
    labels: Sequence[str] = (),
    keep: Sequence[str] | None = None,
) -> RunResult:
    """Simulate one arm with one seed; with ``wandb_dir``, log it as an offline wandb run
    under each of ``labels`` (default: the arm's label); with ``keep``, each step's metrics
    are cut to the keys that start with one of ``keep`` (a map of many long runs keeps what
    it reads, not every metric, in memory)."""
    t0 = time.perf_counter()
    sim = Simulation(cfg, arm, seed)
    steps = sim.run(on_step=_tick)
    seconds = time.perf_counter() - t0
    if keep is not None:
        prefixes = tuple(keep)
        steps = [{k: v for k, v in m.items() if k.startswith(prefixes)} for m in steps]
    if wandb_dir is not None:
        for label in labels or (arm.label,):
            log_wandb_run(steps, label, seed, cfg, wandb_dir)
    return RunResult(arm.label, seed, steps, sim.census.totals(), sim.p7_variances(), seconds)


def wandb_available() -> bool:
    """Whether wandb can be imported (the ``sim`` extra)."""
    import importlib.util

    return importlib.util.find_spec("wandb") is not None


def log_wandb_run(
    steps: Sequence[dict], label: str, seed: int, cfg: SimConfig, out_dir: Path
) -> None:
    """Log one run's step dicts as an offline wandb run under ``out_dir/wandb``.

    Project ``rescue-sim``, group = arm, name ``<arm>-seed<s>``, tags ``arm:<arm>,seed:<s>``
    (and ``a:<a>`` for protect, as the launchers tag real runs), step key ``rollout/step``
    (the cluster's; every key declared against it, ``rescue.tracking.metrics``), config =
    the ``SimConfig`` plus arm and seed.
    """
    import wandb

    from rescue.tracking.metrics import STEP, declare

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        mode="offline",
        dir=str(out_dir),
        project="rescue-sim",
        group=label,
        name=f"{label}-seed{seed}",
        config={"arm": label, "seed": seed, **asdict(cfg)},
        tags=_tags(label, seed),
        reinit="create_new",
        settings=wandb.Settings(silent=True, console="off"),
    )
    declare(run.define_metric, train_step=STEP)  # the census' axes, as Miles and slime declare
    run.define_metric("*", step_metric=STEP)  # every key of a step (it trains once per step)
    for n, m in enumerate(steps):
        run.log({"rollout/step": n, **m})
    run.finish()


def _tags(label: str, seed: int) -> list[str]:
    """``arm:<arm>``, ``seed:<seed>``, for protect ``a:<a>``, for a variant ``variant:<v>``."""
    from rescue.judge.runs import parse_name

    parsed = parse_name(label)
    if parsed is None:
        return [f"arm:{label}", f"seed:{seed}"]
    c = parsed[0]
    extra = [f"a:{c.a:g}"] if c.a is not None else []
    extra += [f"variant:{c.variant}"] if c.variant else []
    return [f"arm:{c.arm}", f"seed:{seed}", *extra]
