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
  cluster logs, among them ``rollout/census/generated/*``, the outcome metrics of every
  generated rollout) and ``sim/*`` (time, weight version, p_thorough); the first line
  also carries ``scenario`` (when named) and ``config`` (the run's ``SimConfig``), which
  ``rescue report`` groups runs by;
- ``runs.json``: per run, the census totals and the P7 variances;
- ``timing.json``: per run, the seconds it took (the one output that depends on the machine);
- ``summary.md`` and the PNG plots (``run_scenario``);
- ``wandb/``: the same step dicts as offline wandb runs (project ``rescue-sim``, group =
  arm, step key ``rollout/step``), written by the worker that ran them, when asked.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from rescue.errors import InputError
from rescue.interrupts import end_tree, worker_initializer
from rescue.progress import advance_to, progress_bar
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.engine import check_runnable
from rescue.sim.run import RunResult, log_wandb_run, run_one, set_step_hook, wandb_available
from rescue.stages import write_progress

#: What a run writes in its output folder (``clear_outputs`` removes them): the census,
#: the offline wandb runs, the run tables, the summary, the judge's figures (``plots/``);
#: and the simulator's plots, ``*.png``.
OUTPUTS = ("census", "wandb", "plots", "runs.json", "timing.json", "summary.md")

__all__ = ["RunResult", "log_wandb_run", "run_arms", "run_grid", "run_one", "wandb_available"]


def clear_outputs(out_dir: Path) -> None:
    """Remove what a run writes in ``out_dir`` (``OUTPUTS`` and ``*.png``); nothing else."""
    out_dir = Path(out_dir)
    for name in OUTPUTS:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for png in out_dir.glob("*.png"):
        png.unlink()


def _count_steps(counter) -> None:
    """Worker initializer: every trainer step of this worker adds 1 to the shared counter;
    the worker ignores SIGINT and dies with its parent (``rescue.interrupts``)."""
    worker_initializer()

    def hook() -> None:
        with counter.get_lock():
            counter.value += 1

    set_step_hook(hook)


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
        progress: draw a progress bar on stderr (default True; ``rescue.progress``).
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
    keep: Sequence[str] | None = None,
) -> list[dict[str, list[RunResult]]]:
    """``run_arms`` for several ``(config, arms, wandb dir)`` at once, sharing the workers
    (and the progress bar): one result dict per plan. ``keep``: cut each step's metrics to
    the keys starting with one of these (``run_one``; default None: every key)."""
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
                kw.append({"wandb_dir": wandb_dir, "labels": labels[arm.behaviour], "keep": keep})
                plan_of.append(p)
    for cfg, arm, _ in jobs:  # before the first step of any run: no run dies part-way
        check_runnable(cfg, arm)
    total = sum(cfg.steps for cfg, _, _ in jobs)
    steps_per_run = "/".join(sorted({str(cfg.steps) for cfg, _, _ in jobs}))

    def staged(steps: int, finished: int) -> None:  # for `rescue status`, when run as a stage
        write_progress(
            steps, total, "steps",
            f"{finished}/{len(jobs)} runs (arm x seed) done, {steps_per_run} steps per run",
        )  # fmt: skip

    # closed however the runs end (an interrupt's line then starts on a line of its own)
    with progress_bar(total, unit="steps", desc="simulating", enabled=progress) as bar:
        done = _execute(jobs, kw, workers=workers, ray=ray, bar=bar, staged=staged)
        advance_to(bar, total)
    staged(total, len(jobs))
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


def _execute(jobs, kw, *, workers: int, ray: str | None, bar, staged) -> list[RunResult]:
    """Every job's ``RunResult``, in order: here, in worker processes or on Ray."""
    if ray is not None:
        from rescue.sim.cluster import run_on_ray

        keep = kw[0]["keep"] if kw else None  # one setting for every job of a call
        done = run_on_ray(ray, jobs, on_progress=lambda n: advance_to(bar, n), keep=keep)
        for (cfg, _, s), r, k in zip(jobs, done, kw, strict=True):
            if k["wandb_dir"] is not None:  # logged here: the nodes need not see this disk
                for label in k["labels"]:
                    log_wandb_run(r.steps, label, s, cfg, k["wandb_dir"])
        return done
    if workers == 1 or len(jobs) == 1:
        done: list[RunResult] = []

        def step() -> None:
            bar.update(1)
            if bar.n % 10 == 0:
                staged(bar.n, len(done))

        set_step_hook(step)
        try:
            for job, k in zip(jobs, kw, strict=True):
                done.append(run_one(*job, **k))
        finally:
            set_step_hook(None)
        return done
    # fork where the platform has it: no re-import of __main__, fast start. The longest
    # runs go first, so no worker is left with one long run at the end.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    counter = ctx.Value("l", 0, lock=True)
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i][0]))
    with _pool(min(workers, len(jobs)), ctx, _count_steps, (counter,)) as pool:
        futures = {i: pool.submit(run_one, *jobs[i], **kw[i]) for i in order}
        while not all(f.done() for f in futures.values()):
            advance_to(bar, counter.value)
            staged(counter.value, sum(f.done() for f in futures.values()))
            time.sleep(0.2)
        return [futures[i].result() for i in range(len(jobs))]


@contextlib.contextmanager
def _pool(workers: int, ctx, initializer=worker_initializer, initargs=()):
    """A process pool whose workers end with the block: on an error or an interrupt they are
    killed at once (``ProcessPoolExecutor``'s own exit would wait for every queued run)."""
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=initializer, initargs=initargs
    )
    try:
        yield pool
    except BaseException:
        if hasattr(pool, "terminate_workers"):  # Python 3.14
            pool.terminate_workers()
        else:  # the executor's table of its worker processes, pid -> process
            end_tree(list(getattr(pool, "_processes", None) or {}), grace_s=2.0)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _cost(cfg: SimConfig) -> float:
    """A run's relative cost: rollouts times their turn cap (for the order of the jobs)."""
    return cfg.steps * cfg.groups_per_step * (cfg.group_size + 4) * cfg.max_turns


def write_jsonl(
    results: dict[str, list[RunResult]],
    out_dir: Path,
    cfg: SimConfig | None = None,
    scenario: str = "",
) -> list[Path]:
    """``census/<arm>-seed<s>.jsonl`` per run, ``runs.json`` and ``timing.json``; returns
    the JSONL paths. ``cfg`` and ``scenario`` go into each file's first line."""
    census_dir = Path(out_dir) / "census"
    census_dir.mkdir(parents=True, exist_ok=True)
    head: dict = {"scenario": scenario} if scenario else {}
    if cfg is not None:
        head["config"] = asdict(cfg)
    paths, runs, timing = [], [], []
    for label, rs in results.items():
        for r in rs:
            path = census_dir / f"{label}-seed{r.seed}.jsonl"
            with path.open("w") as f:
                for n, m in enumerate(r.steps):
                    row = {"arm": label, "seed": r.seed, "rollout/step": n, **m}
                    f.write(json.dumps({**head, **row} if n == 0 else row) + "\n")
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

    The runs of every scenario share the workers; then each scenario's census and
    judgement are computed, the family-wise rule (``rescue.judge.family``) is applied to
    the deciding checks of every scenario together (one report: the verdicts ``rescue
    report`` gives on the same outputs), and each summary (``out/summary.md``) is written,
    then the plots, one scenario per worker. Returns per scenario the markdown summary,
    the judge's results for the predictions whose arms ran, and one line per thing
    written or skipped; ``family`` holds the rule's account after the call.
    """
    from rescue.judge.family import holm
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
    judgements = [judged(res) for res in results]
    family.clear()
    family.append(holm([r for j in judgements for r in j[1]]))
    done = []
    for (scenario, cfg, _, out), res, note, judgement in zip(
        plans, results, notes, judgements, strict=True
    ):
        out = Path(out)
        paths = write_jsonl(res, out, cfg, getattr(scenario, "name", "") or "")
        summary = summary_markdown(
            res, cfg, seeds, scenario=scenario, judgement=judgement, family=family[0]
        )
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


#: The family-wise rule's account of the last ``run_scenarios`` call (one ``Family``).
family: list = []

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
        with _pool(min(workers, len(plans)), mp.get_context("fork")) as pool:
            return list(pool.map(_plot_one, range(len(plans))))
    finally:
        _PLOT_JOBS = []
