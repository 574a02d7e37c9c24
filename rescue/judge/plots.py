"""The report's figures: arm differences with their interval bands, behaviour against b.

Specification
-------------
Per cohort (files prefixed ``<family>[-cap<CAP>][-<setting>]-``):

- ``<prediction>.png``: headed by the prediction's verdict and its reason
  (``evaluation.verdict_reason``), wrapped to the figure's width like every panel title;
  for each difference the prediction plots (``Prediction.curves``),
  the per-seed difference arm − reference of the quantity pooled over a trailing window
  of ``max(1, steps // 30)`` steps, its mean over seeds and the ``LEVEL`` t band (n − 1
  dof, where at least two seeds have a value), against the step (left) and against the
  arm's b binned by ``B_BIN`` (right; b is ``quantities``' ``b``, the same for every arm);
- ``behaviour_vs_b.png``: cap-hit rate and turns by outcome (successes solid, failures
  dashed) of every arm against its b, mean over seeds per b bin;
- ``strategy.png``: ``sim/p_thorough`` per arm against the step (mean and t band), where
  logged;
- ``time_to_target.png``: for each success target, the wall-clock at which an arm's
  success rate (pooled over the same trailing window) first reaches it, mean over the
  seeds that reach it.

matplotlib (the ``sim`` extra) is imported here only, with the Agg backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge.evaluation import Result, verdict_reason
from rescue.judge.report import CohortJudgement, Judgement
from rescue.judge.runs import Run
from rescue.judge.stats import LEVEL

#: Width of the b bins of the plots against b.
B_BIN = 0.05


def _band(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over rows (seeds) and the t band, per column; NaN where fewer than 2 values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        n = np.isfinite(y).sum(axis=0)
        mean = np.nanmean(y, axis=0)
        sd = np.nanstd(y, axis=0, ddof=1)
    from scipy import stats

    q = stats.t.ppf(0.5 + LEVEL / 2, np.maximum(n - 1, 1))
    half = np.where(n >= 2, q * sd / np.sqrt(np.maximum(n, 1)), np.nan)
    return mean, mean - half, mean + half


def _window(runs: Sequence[Run]) -> int:
    last = max((r.steps().max() for r in runs if len(r.rows)), default=0)
    return max(1, int(last + 1) // 30)


def _trailing(run: Run, q: str, window: int, stop: float) -> np.ndarray:
    return qs.series(run, q).trailing(window, stop)[1]


def difference_curves(
    arm: dict[int, Run], ref: dict[int, Run], quantity: str, window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, per-seed difference [seeds, steps], per-seed prior b of the arm [seeds,
    steps])``: the prior b (pooled over the ``B_SMOOTH`` steps before) shares no rollout
    with the step's value, as the judge's trends against b read it."""
    seeds = sorted(set(arm) & set(ref))
    if not seeds:
        return np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))
    stops = [
        min(qs.series(arm[s], quantity).last_step, qs.series(ref[s], quantity).last_step)
        for s in seeds
    ]
    if not np.isfinite(min(stops)):
        return np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))
    stop = int(min(stops))
    d = np.array(
        [
            _trailing(arm[s], quantity, window, stop) - _trailing(ref[s], quantity, window, stop)
            for s in seeds
        ]
    )
    try:  # the x axis of every curve against b: the prior b (``windows.prior_b``)
        b = np.array([qs.prior(qs.series(arm[s], "b"), qs.B_SMOOTH, stop) for s in seeds])
    except qs.MissingKey:
        b = np.full(d.shape, np.nan)
    return np.arange(stop + 1, dtype=float), d, b


def binned(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (seed), the mean of ``y`` in each ``B_BIN`` bin of ``x``: ``(centres, [seeds, bins])``."""
    edges = np.arange(0.0, 1.0 + B_BIN, B_BIN)
    out = np.full((y.shape[0], edges.size - 1), np.nan)
    for i in range(y.shape[0]):
        ok = np.isfinite(x[i]) & np.isfinite(y[i])
        idx = np.clip(np.digitize(x[i][ok], edges) - 1, 0, edges.size - 2)
        sums = np.bincount(idx, weights=y[i][ok], minlength=edges.size - 1)
        counts = np.bincount(idx, minlength=edges.size - 1)
        out[i] = np.divide(sums, counts, out=np.full(sums.shape, np.nan), where=counts > 0)
    return (edges[:-1] + edges[1:]) / 2, out


def _draw_band(ax, x, y, label: str, color=None, style: str = "-") -> None:
    mean, lo, hi = _band(y)
    line = ax.plot(x, mean, style, lw=1.4, label=label, color=color)[0]
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, lw=0)


def prediction_figure(result: Result, cohort: CohortJudgement, path: Path) -> Path | None:
    """The prediction's differences against steps and against b; None when nothing to draw."""
    import matplotlib.pyplot as plt

    curves = []
    for quantity, role, ref_role in result.prediction.curves:
        arm_label, ref_label = result.binding.get(role), result.binding.get(ref_role)
        if not arm_label or not ref_label:
            continue
        arm, ref = cohort.arms[arm_label], cohort.arms[ref_label]
        try:
            window = _window([*arm.values(), *ref.values()])
            steps, d, b = difference_curves(arm, ref, quantity, window)
        except qs.MissingKey:
            continue
        if steps.size:
            curves.append((quantity, arm_label, ref_label, window, steps, d, b))
    if not curves:
        return None
    width = 11.0
    fig, axes = plt.subplots(
        len(curves), 2, figsize=(width, 3.4 * len(curves) + 0.8), squeeze=False
    )
    for (quantity, a, r, window, steps, d, b), (ax_s, ax_b) in zip(curves, axes, strict=True):
        what = f"{qs.QUANTITIES[quantity].title}: {a} − {r}"
        _draw_band(ax_s, steps, d, f"mean of {d.shape[0]} seeds, {LEVEL:.0%} t band")
        ax_s.axhline(0, color="k", lw=0.6)
        ax_s.set_xlabel(f"trainer step (trailing {window} steps)")
        ax_s.set_title(fit(what, width / 2), fontsize=TITLE_SIZE)
        ax_s.legend(fontsize=7)
        centres, by_b = binned(b, d)
        if np.isfinite(by_b).any():
            _draw_band(ax_b, centres, by_b, "per-seed mean per b bin")
            ax_b.axvline(qs.B_THRESHOLD, color="grey", ls=":", lw=0.8)
        else:
            ax_b.text(0.5, 0.5, f"{a}: b not logged", ha="center", transform=ax_b.transAxes)
        ax_b.axhline(0, color="k", lw=0.6)
        ax_b.set_xlabel(f"b of {a} (bins of {B_BIN:g})")
        ax_b.set_title(fit(f"{what}, against b", width / 2), fontsize=TITLE_SIZE)
        for ax in (ax_s, ax_b):
            ax.grid(alpha=0.3)
    fig.suptitle(fit(headline(result), width, SUPTITLE_SIZE), fontsize=SUPTITLE_SIZE)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: Font sizes of the panels' titles and of the figure's headline (points).
TITLE_SIZE = 9.0
SUPTITLE_SIZE = 10.5


def headline(result: Result) -> str:
    """The figure's title: the prediction, its verdict and why (``verdict_reason``)."""
    p = result.prediction
    if result.verdict is None:
        return f"{p.id}: {p.title} — reported, no verdict"
    return f"{p.id}: {p.title} — {result.verdict}: {verdict_reason(result)}"


def fit(text: str, width_in: float, size: float = TITLE_SIZE) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``size`` points (a
    character of the default sans-serif font is about 0.6 of its size wide)."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.6 * size)) - 4)
    return textwrap.fill(text, chars)


def _by_b(run: Run, quantity: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    """One run's per-step quantity averaged per bin of its prior b (b pooled over the
    ``B_SMOOTH`` steps before: the axis the judge's trends against b read, which shares no
    rollout with the step). ``window`` is unused: each bin pools the steps it holds."""
    stop = run.steps().max()
    b = qs.prior(qs.series(run, "b"), qs.B_SMOOTH, stop)
    y = _trailing(run, quantity, 1, stop)
    centres, grid = binned(b[None], y[None])
    return centres, grid[0]


def behaviour_figure(cohort: CohortJudgement, path: Path) -> Path | None:
    """Cap-hit rate and turns by outcome against the prior b, every arm: the mean over
    seeds per b bin with its t band (the seeds' spread), the picture of P3."""
    import matplotlib.pyplot as plt

    fig, (ax_c, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    panels = (("cap_hit", ax_c, "-"), ("turns_solved", ax_t, "-"), ("turns_failed", ax_t, "--"))
    drawn = False
    for label, seeds in sorted(cohort.arms.items()):
        runs = list(seeds.values())
        window = _window(runs)
        try:
            curves = {q: [_by_b(r, q, window) for r in runs] for q, _, _ in panels}
        except qs.MissingKey:
            continue
        color = None
        for q, ax, style in panels:
            centres = curves[q][0][0]
            mean, lo, hi = _band(np.vstack([y for _, y in curves[q]]))
            line = ax.plot(centres, mean, style, color=color, label=label if style == "-" else None)
            color = line[0].get_color()
            if q == "cap_hit":
                ax.fill_between(centres, lo, hi, color=color, alpha=0.15, lw=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    xlabel = f"prior b (b over the {qs.B_SMOOTH} steps before; bins of {B_BIN:g})"
    ax_c.set(xlabel=xlabel, ylabel="cap-hit rate",
             title=f"cap-hit rate against b (mean over seeds, {LEVEL:.0%} t band)")  # fmt: skip
    ax_t.set(xlabel=xlabel, ylabel="turns", title="turns: successes (solid), failures (dashed)")
    for ax in (ax_c, ax_t):
        ax.grid(alpha=0.3)
        ax.axvline(qs.B_THRESHOLD, color="grey", ls=":", lw=0.8)
    ax_c.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def strategy_figure(cohort: CohortJudgement, path: Path) -> Path | None:
    """``sim/p_thorough`` per arm against the step, where logged."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    drawn = False
    for label, seeds in sorted(cohort.arms.items()):
        runs = [r for r in seeds.values() if r.has("sim/p_thorough")]
        if not runs:
            continue
        stop = int(min(r.steps().max() for r in runs))
        y = np.array([qs.series(r, "p_thorough").trailing(1, stop)[1] for r in runs])
        _draw_band(ax, np.arange(stop + 1), y, label)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(
        xlabel="trainer step",
        ylabel="P(thorough)",
        title=f"strategy share (mean, {LEVEL:.0%} t band)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def time_to_target(run: Run, targets: np.ndarray, window: int) -> np.ndarray:
    """Wall-clock at which the run's trailing success first reaches each target (NaN: never)."""
    steps, success = qs.series(run, "success").trailing(window)
    clock = qs.wall_clock(run)
    t = np.interp(steps, clock.step, clock.num, left=np.nan, right=np.nan)
    out = np.full(targets.shape, np.nan)
    s = np.nan_to_num(success, nan=-1.0)
    for i, target in enumerate(targets):
        hit = np.flatnonzero(s >= target)
        if hit.size:
            out[i] = t[hit[0]]
    return out


def target_figure(cohort: CohortJudgement, path: Path) -> Path | None:
    """Wall-clock to reach each success target, per arm."""
    import matplotlib.pyplot as plt

    targets = np.round(np.arange(0.05, 1.0, 0.025), 3)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    drawn = False
    for label, seeds in sorted(cohort.arms.items()):
        runs = list(seeds.values())
        try:
            window = _window(runs)
            y = np.array([time_to_target(r, targets, window) for r in runs])
        except qs.MissingKey:
            continue
        if np.isfinite(y).any():
            _draw_band(ax, targets, y, label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(
        xlabel="success-rate target",
        ylabel="wall-clock to reach it",
        title="wall-clock to a success target",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(j: Judgement, out_dir: Path) -> list[Path]:
    """Every figure of the report under ``out_dir``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for c in j.cohorts:
        stem = c.stem
        for r in c.results:
            if r.prediction.curves and r.binding:
                arms = "-".join(v for v in r.binding.values() if v)
                name = f"{stem}-{r.prediction.id.replace(' ', '_')}-{arms}.png"
                paths.append(prediction_figure(r, c, out_dir / name))
        paths.append(behaviour_figure(c, out_dir / f"{stem}-behaviour_vs_b.png"))
        paths.append(strategy_figure(c, out_dir / f"{stem}-strategy.png"))
        paths.append(target_figure(c, out_dir / f"{stem}-time_to_target.png"))
    return [p for p in paths if p is not None]
