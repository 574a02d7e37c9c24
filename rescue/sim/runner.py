"""Runs arms × seeds of the simulator, side by side, and writes what they logged.

Specification
-------------
Every (arm, seed) run is independent and deterministic (``engine``), so running them in
worker processes, or as Ray tasks on a cluster (``rescue.sim.cluster``, ``--ray``),
changes nothing but the wall-clock: the same arms and seeds give the same files, byte for
byte, with any ``workers`` and on Ray. Arms with the same behaviour
(``ArmSpec.behaviour``, e.g. ``zero`` and ``never-drop``) are simulated once per seed and
written under each name.

Output under ``out_dir``:

- ``census/<arm>-seed<s>.jsonl``: one line per trainer step with ``arm``, ``seed``,
  ``rollout/step`` and the step's metrics: the census (``rollout/census/*``, the keys the
  cluster logs), the outcome metrics of every generated rollout (``sim/generated/*``),
  and ``sim/*`` (time, weight version, p_thorough);
- ``runs.json``: per run, the census totals and the P7 variances;
- ``timing.json``: per run, the seconds it took (the one output that depends on the machine);
- ``summary.md`` and the PNG plots (``run_scenario``);
- ``wandb/``: the same step dicts as offline wandb runs (project ``rescue-sim``, group =
  arm, step key ``rollout/step``), written by the worker that ran them, when asked.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rescue.errors import InputError
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.engine import Simulation
from rescue.stages import write_progress


@dataclass
class RunResult:
    """What one (arm, seed) run produced."""

    arm: str
    seed: int
    steps: list[dict[str, float]]
    totals: dict[str, int]
    p7: dict[str, float]
    seconds: float


_tick_hook = None  # called after every trainer step: counts progress


def _init_worker(counter) -> None:
    global _tick_hook

    def hook() -> None:
        with counter.get_lock():
            counter.value += 1

    _tick_hook = hook


def _tick(step: int) -> None:
    if _tick_hook is not None:
        _tick_hook()


def run_one(
    cfg: SimConfig,
    arm: ArmSpec,
    seed: int,
    *,
    wandb_dir: Path | None = None,
    labels: Sequence[str] = (),
) -> RunResult:
    """Simulate one arm with one seed; with ``wandb_dir``, log it as an offline wandb run
    under each of ``labels`` (default: the arm's label)."""
    t0 = time.perf_counter()
    sim = Simulation(cfg, arm, seed)
    steps = sim.run(on_step=_tick)
    seconds = time.perf_counter() - t0
    if wandb_dir is not None:
        for label in labels or (arm.label,):
            log_wandb_run(steps, label, seed, cfg, wandb_dir)
    return RunResult(arm.label, seed, steps, sim.census.totals(), sim.p7_variances(), seconds)


class ProgressBar:
    """A one-line progress bar on stderr (a line per 10% when stderr is not a terminal)."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream=None,
        width: int = 30,
        unit: str = "steps",
    ) -> None:
        self.total, self.enabled, self.width, self.unit = max(total, 1), enabled, width, unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self._last_decile = -1

    def show(self, done: int, note: str = "") -> None:
        write_progress(done, self.total, self.unit, note)  # for `rescue status`, when staged
        if not self.enabled:
            return
        frac = min(done / self.total, 1.0)
        if self.tty:
            bar = "#" * int(frac * self.width)
            self.stream.write(
                f"\r[{bar:<{self.width}}] {100 * frac:3.0f}% {done}/{self.total} {self.unit} "
                f"{time.perf_counter() - self.t0:5.1f}s {note}   "
            )
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            self.stream.write(f"{100 * frac:3.0f}% {done}/{self.total} {self.unit} {note}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run_arms(
    cfg: SimConfig,
    arms: Sequence[ArmSpec],
    seeds: Sequence[int],
    *,
    workers: int = 1,
    progress: bool = True,
    wandb_dir: Path | None = None,
    ray: str | None = None,
) -> dict[str, list[RunResult]]:
    """Run every arm with every seed; ``{arm label: [RunResult per seed]}`` in input order.

    Args:
        workers: processes (default 1: in this process). Results do not depend on it.
        progress: draw a progress bar on stderr (default True).
        wandb_dir: log each run to offline wandb there (default None: no wandb). Needs
            wandb installed (``wandb_available``).
        ray: a Ray cluster's address (or ``auto``) to run the grid on as Ray tasks
            (default None: here). Results do not depend on it.
    """
    return run_grid([(cfg, arms, wandb_dir)], seeds, workers=workers, progress=progress, ray=ray)[0]


def run_grid(
    plans: Sequence[tuple[SimConfig, Sequence[ArmSpec], Path | None]],
    seeds: Sequence[int],
    *,
    workers: int = 1,
    progress: bool = True,
    ray: str | None = None,
) -> list[dict[str, list[RunResult]]]:
    """``run_arms`` for several ``(config, arms, wandb dir)`` at once, sharing the workers
    (and the progress bar): one result dict per plan."""
    if workers < 1:
        raise InputError(f"--workers={workers}; allowed: an integer >= 1")
    jobs: list[tuple[SimConfig, ArmSpec, int]] = []
    kw: list[dict] = []
    plan_of: list[int] = []
    for p, (cfg, arms, wandb_dir) in enumerate(plans):
        unique: dict[tuple, ArmSpec] = {}
        labels: dict[tuple, list[str]] = {}
        for arm in arms:
            unique.setdefault(arm.behaviour, arm)
            labels.setdefault(arm.behaviour, []).append(arm.label)
        for arm in unique.values():
            for s in seeds:
                jobs.append((cfg, arm, s))
                kw.append({"wandb_dir": wandb_dir, "labels": labels[arm.behaviour]})
                plan_of.append(p)
    total = sum(cfg.steps for cfg, _, _ in jobs)
    steps_per_run = "/".join(sorted({str(cfg.steps) for cfg, _, _ in jobs}))
    bar = ProgressBar(total, enabled=progress)
    if ray is not None:
        from rescue.sim.cluster import run_on_ray

        done = run_on_ray(ray, jobs, bar=bar)
        for (cfg, _, s), r, k in zip(jobs, done, kw, strict=True):
            if k["wandb_dir"] is not None:  # logged here: the nodes need not see this disk
                for label in k["labels"]:
                    log_wandb_run(r.steps, label, s, cfg, k["wandb_dir"])
    elif workers == 1 or len(jobs) == 1:
        global _tick_hook
        count, finished = [0], [0]

        def hook() -> None:
            count[0] += 1
            if count[0] % 10 == 0:
                bar.show(
                    count[0],
                    f"{finished[0]}/{len(jobs)} runs (arm x seed) done, {steps_per_run} steps per run",
                )

        _tick_hook = hook
        try:
            done = []
            for job, k in zip(jobs, kw, strict=True):
                done.append(run_one(*job, **k))
                finished[0] += 1
        finally:
            _tick_hook = None
    else:
        # fork where the platform has it: no re-import of __main__, fast start. The longest
        # runs go first, so no worker is left with one long run at the end.
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        counter = ctx.Value("l", 0, lock=True)
        order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i][0]))
        with ProcessPoolExecutor(
            max_workers=min(workers, len(jobs)),
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(counter,),
        ) as pool:
            futures = {i: pool.submit(run_one, *jobs[i], **kw[i]) for i in order}
            while not all(f.done() for f in futures.values()):
                finished = sum(f.done() for f in futures.values())
                bar.show(
                    counter.value,
                    f"{finished}/{len(jobs)} runs (arm x seed) done, {steps_per_run} steps per run",
                )
                time.sleep(0.2)
            done = [futures[i].result() for i in range(len(jobs))]
    bar.show(
        total, f"{len(jobs)}/{len(jobs)} runs (arm x seed) done, {steps_per_run} steps per run"
    )
    bar.close()
    out = []
    for p, (_, arms, _) in enumerate(plans):
        by_key = {
            (a.behaviour, s): r
            for (_, a, s), r, q in zip(jobs, done, plan_of, strict=True)
            if q == p
        }
        out.append(
            {
                arm.label: [replace(by_key[(arm.behaviour, s)], arm=arm.label) for s in seeds]
                for arm in arms
            }
        )
    return out


def _cost(cfg: SimConfig) -> float:
    """A run's relative cost: rollouts times their turn cap (for the order of the jobs)."""
    return cfg.steps * cfg.groups_per_step * (cfg.group_size + 4) * cfg.max_turns


def write_jsonl(results: dict[str, list[RunResult]], out_dir: Path) -> list[Path]:
    """``census/<arm>-seed<s>.jsonl`` per run, ``runs.json`` and ``timing.json``; returns
    the JSONL paths."""
    census_dir = Path(out_dir) / "census"
    census_dir.mkdir(parents=True, exist_ok=True)
    paths, runs, timing = [], [], []
    for label, rs in results.items():
        for r in rs:
            path = census_dir / f"{label}-seed{r.seed}.jsonl"
            with path.open("w") as f:
                for n, m in enumerate(r.steps):
                    f.write(
                        json.dumps({"arm": label, "seed": r.seed, "rollout/step": n, **m}) + "\n"
                    )
            paths.append(path)
            run = asdict(r)
            del run["steps"]
            timing.append({"arm": label, "seed": r.seed, "seconds": run.pop("seconds")})
            runs.append(run)
    (Path(out_dir) / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    (Path(out_dir) / "timing.json").write_text(json.dumps(timing, indent=1) + "\n")
    return paths


def run_scenarios(
    plans: Sequence[tuple[object, SimConfig, Sequence[ArmSpec], Path]],
    seeds: Sequence[int],
    *,
    workers: int = 1,
    ray: str | None = None,
    progress: bool = True,
    wandb: bool = True,
    plots: bool = True,
) -> list[tuple[str, list, list[str]]]:
    """Run each ``(scenario, config, arms, out)``'s arms and seeds and write its outputs.

    The runs of every scenario share the workers; then each scenario's census, summary
    (``out/summary.md``) and judgement are written, then the plots, one scenario per
    worker. Returns per scenario the markdown summary, the judge's results for the
    predictions whose arms ran, and one line per thing written or skipped.
    """
    from rescue.sim.summary import judged, summary_markdown

    notes: list[list[str]] = []
    wandb_dirs = []
    for _, _, _, out in plans:
        Path(out).mkdir(parents=True, exist_ok=True)
        if wandb and wandb_available():
            wandb_dirs.append(Path(out))
            notes.append(
                [
                    f"wandb: offline runs in {out}/wandb (upload with: wandb sync {out}/wandb/offline-run-*)"
                ]
            )
        else:
            wandb_dirs.append(None)
            notes.append(
                ["wandb: not installed (pip install 'rescue[sim]'): skipped"] if wandb else []
            )
    grid = [(cfg, arms, w) for (_, cfg, arms, _), w in zip(plans, wandb_dirs, strict=True)]
    results = run_grid(grid, seeds, workers=workers, progress=progress, ray=ray)
    done = []
    for (scenario, cfg, _, out), res, note in zip(plans, results, notes, strict=True):
        out = Path(out)
        paths = write_jsonl(res, out)
        judgement = judged(res)
        summary = summary_markdown(res, cfg, seeds, scenario=scenario, judgement=judgement)
        (out / "summary.md").write_text(summary)
        note[:0] = [
            f"census: {len(paths)} JSONL files in {out / 'census'}",
            f"summary: {out / 'summary.md'}",
        ]
        done.append((summary, judgement, note))
    if plots:
        for (_, _, _, out), note, pngs in zip(
            plans, notes, _plots(plans, results, [d[1] for d in done], workers), strict=True
        ):
            note.append(
                f"plots: {', '.join(p.name for p in pngs)} in {out}"
                if pngs is not None
                else "plots: matplotlib not installed (pip install 'rescue[sim]'): skipped"
            )
    return [(summary, judgement[1], note) for summary, judgement, note in done]


_PLOT_JOBS: list = []  # what forked plot workers read (not pickled: the runs are large)


def _plot_one(i: int):
    from rescue.sim.plots import write_plots

    results, out, judgement = _PLOT_JOBS[i]
    try:
        return write_plots(results, out, judgement=judgement)
    except ImportError:
        return None


def _plots(plans, results, judgements, workers: int) -> list:
    """Each scenario's plots, one scenario per worker process where fork is available."""
    global _PLOT_JOBS
    _PLOT_JOBS = [
        (r, out, j) for (_, _, _, out), r, j in zip(plans, results, judgements, strict=True)
    ]
    try:
        if workers == 1 or len(plans) == 1 or "fork" not in mp.get_all_start_methods():
            return [_plot_one(i) for i in range(len(plans))]
        with ProcessPoolExecutor(
            max_workers=min(workers, len(plans)), mp_context=mp.get_context("fork")
        ) as pool:
            return list(pool.map(_plot_one, range(len(plans))))
    finally:
        _PLOT_JOBS = []


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
    (the cluster's), config = the ``SimConfig`` plus arm and seed.
    """
    import wandb

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
    run.define_metric("*", step_metric="rollout/step")
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
