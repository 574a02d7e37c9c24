"""PNG plots of the simulated arms: one line per arm (mean over seeds), a band for the seeds.

Specification
-------------
Each panel plots a quantity of ``rescue.judge.quantities`` (the judge's), pooled over a
trailing window of steps (``smoothing`` steps, default steps/30), against the trainer step. The line is the mean
over seeds, the band spans the seeds' minimum to maximum. Files written to ``out_dir``:
``success.png`` (by completion: every rollout that finished in the step), ``launched.png``
(success by the weight version that launched the rollouts, ``sim/launched/*``),
``cap_hit.png``, ``turns.png`` (successes solid, failures dashed), ``ran_tests.png``,
``b.png``, ``strategy.png`` (P(thorough)) and ``overview.png`` with all of them; runs that
logged the exact subsidy terms (``--subsidy``, ``rescue.sim.subsidy``) also get
``subsidy.png`` (the b·∇P(cap) term and the ∇J term along ∇P(cap), and their ratio), a
row of the overview too. Arms that
are one simulation (``zero`` and ``never-drop``) are drawn once, labelled
``never-drop = zero``.

With the judge's results (``judgement``), the judge's figures go to ``out_dir/plots``
(``rescue.judge.plots``): per prediction, each arm difference with its t band against
the step and against b; behaviour against b; the strategy shares; wall-clock to a success
target. matplotlib is imported here only (the ``sim`` extra), with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge.runs import Run
from rescue.sim.engine import GENERATED_PREFIX, LAUNCHED_PREFIX
from rescue.sim.summary import to_run

#: file stem -> metrics drawn in that panel (the first solid, the second dashed).
PANELS: dict[str, tuple[str, ...]] = {
    "success": ("success",),
    "launched": ("success",),
    "cap_hit": ("cap_hit",),
    "turns": ("turns_solved", "turns_failed"),
    "ran_tests": ("ran_tests_solved",),
    "b": ("b",),
    "strategy": ("p_thorough",),
}
_TITLES = {
    "success": "success rate (rollouts finished in the step)",
    "launched": "success rate by launching weight version",
    "cap_hit": "cap-hit rate",
    "turns": "turns: successes (solid), failures (dashed)",
    "ran_tests": "test-run rate among successes",
    "b": "b: realized all-members baseline (trained rollouts)",
    "strategy": "P(thorough)",
}


def _draw(ax, results, names: tuple[str, ...], window: int, launched: bool = False) -> None:
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, runs) in enumerate(_merged(results).items()):
        color = colors[i % len(colors)]
        for j, name in enumerate(names):
            y = np.array([_smoothed(r, name, window, launched) for r in runs])
            x = np.arange(1, y.shape[1] + 1)
            with np.errstate(all="ignore"), _quiet():
                mean = np.nanmean(y, axis=0)
                lo, hi = np.nanmin(y, axis=0), np.nanmax(y, axis=0)
            style = "-" if j == 0 else "--"
            ax.plot(x, mean, style, color=color, lw=1.4, label=arm if j == 0 else None)
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
    ax.set_xlabel("trainer step")
    ax.grid(alpha=0.3)


#: The subsidy panels: (key under ``sim/subsidy/``, title).
SUBSIDY_PANELS: tuple[tuple[str, str], ...] = (
    ("term", "b·∇P(cap) term along ∇P(cap) (exact; what the mask pays)"),
    ("task", "∇J term along ∇P(cap) (exact; R = 0's update there)"),
    ("ratio", "subsidy ratio: b·∇P(cap) term / |∇J term|"),
)


def _draw_key(ax, results, key: str, window: int) -> None:
    """A logged per-step value (``key``), its trailing mean over ``window`` steps, per arm."""
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, runs) in enumerate(_merged(results).items()):
        y = np.array([[m.get(key, np.nan) for m in r.steps] for r in runs], dtype=float)
        kernel = np.ones(window) / window
        y = np.array([np.convolve(row, kernel, mode="full")[: row.size] for row in y])
        y[:, : window - 1] = np.nan
        x = np.arange(1, y.shape[1] + 1)
        with np.errstate(all="ignore"), _quiet():
            mean, lo, hi = np.nanmean(y, 0), np.nanmin(y, 0), np.nanmax(y, 0)
        color = colors[i % len(colors)]
        ax.plot(x, mean, "-", color=color, lw=1.4, label=arm)
        if len(runs) > 1:
            ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
    if key.endswith("term") or key.endswith("task"):
        ax.axhline(0.0, color="k", lw=0.6)
    if key.endswith("ratio"):
        ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("trainer step")
    ax.grid(alpha=0.3)


def _has_subsidy(results) -> bool:
    from rescue.sim.subsidy import PREFIX

    return any(PREFIX + "term" in r.steps[0] for runs in results.values() for r in runs if r.steps)


def _smoothed(result, name: str, window: int, launched: bool = False) -> np.ndarray:
    """The quantity per step, pooled over a trailing window (NaN where a run has no data).

    ``launched``: the behaviour of the rollouts launched with each step's weight version.
    """
    stop = len(result.steps) - 1
    run = _RUNS.get(id(result.steps))
    if run is None:  # one Run per result while the plots are drawn: its columns are cached
        run = _RUNS[id(result.steps)] = to_run(result)
    if launched:
        rows = [
            {GENERATED_PREFIX + k[len(LAUNCHED_PREFIX) :]: v for k, v in m.items()
             if k.startswith(LAUNCHED_PREFIX)}
            for m in result.steps
        ]  # fmt: skip
        run = Run(run.condition, run.seed, rows, source=run.source)
    try:
        return qs.series(run, name).trailing(window, stop)[1]
    except qs.MissingKey:
        return np.full(stop + 1, np.nan)


#: The judge's ``Run`` of each result, by ``id`` of its steps, while ``write_plots`` runs.
_RUNS: dict[int, Run] = {}


def _merged(results) -> dict:
    """Arms that are one simulation (e.g. zero and never-drop) drawn once as ``a = b``."""
    out: dict[str, list] = {}
    seen: dict[int, str] = {}
    for arm, runs in results.items():
        key = id(runs[0].steps)
        if key in seen:
            first = seen[key]
            out[f"{first} = {arm}"] = out.pop(first)
            seen[key] = f"{first} = {arm}"
        else:
            out[arm] = runs
            seen[key] = arm
    return out


class _quiet:
    """Silence numpy's all-NaN slice warnings (a window with no successes yet)."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def write_plots(results, out_dir: Path, smoothing: int | None = None, judgement=None) -> list[Path]:
    """Write the PNGs; returns their paths (the judge's under ``out_dir/plots``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _RUNS.clear()
    try:
        return _write_plots(results, Path(out_dir), smoothing, judgement, plt)
    finally:
        _RUNS.clear()


def _write_plots(results, out_dir: Path, smoothing, judgement, plt) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(results.values()))[0].steps)
    window = smoothing or max(1, n // 30)
    paths = []
    for stem, names in PANELS.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        _draw(ax, results, names, window, launched=stem == "launched")
        ax.set_title(_TITLES[stem], fontsize=10)
        ax.set_ylabel(qs.QUANTITIES[names[0]].title)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths.append(out_dir / f"{stem}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    subsidy = _has_subsidy(results)
    if subsidy:
        from rescue.sim.subsidy import PREFIX

        fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
        for ax, (key, title) in zip(axes, SUBSIDY_PANELS, strict=True):
            _draw_key(ax, results, PREFIX + key, window)
            ax.set_title(title, fontsize=10)
        axes[0].legend(fontsize=7, ncol=2)
        fig.suptitle(f"the subsidy, exact from each step's parameters (mean of {window} steps)")
        fig.tight_layout()
        paths.append(out_dir / "subsidy.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    rows = 3 if subsidy else 2
    fig, axes = plt.subplots(rows, 4, figsize=(20, 4 * rows))
    for ax, (stem, names) in zip(axes.flat, PANELS.items(), strict=False):
        _draw(ax, results, names, window, launched=stem == "launched")
        ax.set_title(_TITLES[stem], fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    legend_ax = axes.flat[len(PANELS)]
    if subsidy:
        for ax, (key, title) in zip(axes.flat[len(PANELS) + 1 :], SUBSIDY_PANELS, strict=False):
            _draw_key(ax, results, PREFIX + key, window)
            ax.set_title(title, fontsize=9)
    for ax in axes.flat[len(PANELS) + 1 + (len(SUBSIDY_PANELS) if subsidy else 0) :]:
        ax.axis("off")
    legend_ax.axis("off")
    legend_ax.legend(handles, labels, loc="center", fontsize=10, title="arm (band: seeds min-max)")
    fig.suptitle(f"rescue sim: arms side by side (pooled over {window} steps)")
    fig.tight_layout()
    paths.append(out_dir / "overview.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    if judgement is not None:
        from rescue.judge import plots as judge_plots
        from rescue.judge.report import CohortJudgement, Judgement

        arms, ran, _ = judgement
        j = Judgement([CohortJudgement("sim", None, arms, ran)], [])
        paths += judge_plots.write_plots(j, out_dir / "plots")
    return paths
