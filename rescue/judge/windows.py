"""Window rules: the pair of values one seed of two arms gives a check (``checks.compare``).

Specification
-------------
A window rule is ``(arm run, reference run) -> (arm value, reference value)`` for one seed,
each value a quantity of ``quantities`` over a window fixed here:

- ``final`` / ``whole``: pooled over the final window / every step both runs reached;
- ``drift``: the OLS slope of the per-step value on the step, per ``per`` steps;
- ``matched_b_trend`` / ``matched_b_level``: at matched b (``matched_b``), the
  OLS slope of the per-step value on the prior b (``prior_b``), or the value averaged over
  ``B_BIN`` bins of the prior b both runs visit; ``checks.NotJudgeable`` when the runs share
  no b above ``quantities.B_THRESHOLD``;
- ``clock``: the wall-clock at the last step both runs reached;
- ``cost_per_gain``: a cost to that step (``clock_at``, ``sandbox_at``) divided by the
  run's reward improvement (``gain``).

A rule whose value is missing for a reason it can name carries ``why(run)``.

The x axis of a trend against b
-------------------------------
A step's b and its cap-hit rate are read off the same rollouts: a capped rollout adds to
the cap-hit rate and scores 0 in b, so the two numbers' sampling noise is negatively
correlated within a step (about −0.6 in the simulator's budget arms, detrended), and an OLS
slope of one on the other is pulled toward that noise's own slope rather than the policy's
trend (the first version of this rule read slopes of the wrong sign where the simulator's
exact P(cap) rose with J). Every rule here that reads a quantity against b therefore reads
the *prior* b: b pooled over the ``quantities.B_SMOOTH`` steps before the step whose value
it reads (``prior_b``; the census logs the same number as ``rollout/census/b_prior``). Those
steps share no rollout with it, so the step's sampling noise is independent of its x, and
the slope is the policy's trend up to two costs, measured against the simulator's exact
P(cap) and J (``rescue.judge.truth``, ``bench/judge_truth.py``):

- attenuation: the prior b still carries its own sampling noise (a tenth of one step's),
  which shrinks the slope toward 0 by Var(true b) / Var(prior b) over the steps read;
  ``reliability`` estimates that factor per run (one step's noise variance from the
  successive differences of its per-step b, over ``B_SMOOTH``, against the prior b's
  variance over the steps read), and a run whose prior b is mostly its own noise there
  (below ``MIN_RELIABILITY``: b barely moved) gives its seed no trend, with the reason;
- lag: the prior b is the policy's b about ``(B_SMOOTH + 1) / 2`` steps earlier, which
  shifts every x by about the same amount while b moves steadily (the slope is unchanged),
  and blurs a turn in the trend.

Measured on the map's two cells of issue #41 (6 seeds, 300 steps, arms zero, mask,
matched): the judged per-run slopes are 0.68–0.95 of the exact ones on average, every one of
the 36 of the same sign (the same-step b gave −0.15 against +0.43 exact, no run of the same
sign). Cross-fitting halves of a step's groups was the other candidate: its x would carry
twice one step's noise, against a tenth here; with the noise of b around the exact J
measured on those runs (SD 0.05 per step) the expected attenuation Var(J) / Var(x) is
0.25 and 0.42 on the two cells for the halves, 0.87 and 0.94 for the prior b.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge.checks import NotJudgeable, PairValue
from rescue.judge.runs import Run
from rescue.judge.stats import NAN, slope


def prior_b(run: Run, stop: float) -> np.ndarray:
    """The run's b per step 0..stop, pooled over the ``qs.B_SMOOTH`` steps before each
    (NaN at a step with no earlier counted step): ``qs.prior``."""
    return qs.prior(qs.series(run, "b"), qs.B_SMOOTH, stop)


@dataclass(frozen=True)
class Matched:
    """Two runs' steps at matched b (``matched_b``), or why there are none.

    ``steps_a`` / ``steps_r``: boolean masks over steps 0..``stop``; ``lo``, ``hi``: the
    shared range of b; ``why``: None when both have at least ``qs.MIN_MATCHED_STEPS`` steps.
    """

    stop: int
    lo: float
    hi: float
    steps_a: np.ndarray
    steps_r: np.ndarray
    why: str | None = None


def matched_b(a: Run, r: Run, stop: float) -> Matched:
    """The steps of ``a`` and ``r`` at which their prior b (``prior_b``) exceeds
    ``qs.B_THRESHOLD`` and lies in the range of such b both reached."""
    n = int(stop) + 1 if np.isfinite(stop) else 0
    none = np.zeros(n, dtype=bool)
    if n == 0:
        return Matched(-1, NAN, NAN, none, none, "no step both runs reached")
    ba, br = (np.nan_to_num(prior_b(x, stop), nan=-1.0) for x in (a, r))
    above_a, above_r = ba > qs.B_THRESHOLD, br > qs.B_THRESHOLD
    top = f"highest b {max(ba.max(), br.max()):.3g}"
    if not (above_a.any() and above_r.any()):
        who = " and ".join(x.label for x, up in ((a, above_a), (r, above_r)) if not up.any())
        return Matched(
            n - 1, NAN, NAN, none, none, f"{who} never exceeded b {qs.B_THRESHOLD:g} ({top})"
        )
    lo = max(ba[above_a].min(), br[above_r].min())
    hi = min(ba[above_a].max(), br[above_r].max())
    sa = above_a & (ba >= lo) & (ba <= hi)
    sr = above_r & (br >= lo) & (br <= hi)
    if hi < lo or min(sa.sum(), sr.sum()) < qs.MIN_MATCHED_STEPS:
        return Matched(
            n - 1,
            lo,
            hi,
            sa,
            sr,
            f"the runs share no range of b above {qs.B_THRESHOLD:g} with {qs.MIN_MATCHED_STEPS} steps "
            f"each ({a.label}: b in [{ba[above_a].min():.3g}, {ba[above_a].max():.3g}], "
            f"{r.label}: [{br[above_r].min():.3g}, {br[above_r].max():.3g}])",
        )
    return Matched(n - 1, float(lo), float(hi), sa, sr)


def _common_stop(*series: qs.Series) -> float:
    return min(s.last_step for s in series)


def final(quantity: str, sources: tuple[str, ...] | None = None) -> PairValue:
    """The quantity pooled over the final window of the steps both runs reached."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity, sources), qs.series(r, quantity, sources)
        stop = _common_stop(sa, sr)
        if not np.isfinite(stop):  # a run without a single counted row
            return NAN, NAN
        start = qs.final_start(stop)
        return sa.pooled(start, stop), sr.pooled(start, stop)

    return value


def whole(quantity: str, sources: tuple[str, ...] | None = None) -> PairValue:
    """The quantity pooled over every step both runs reached."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity, sources), qs.series(r, quantity, sources)
        stop = _common_stop(sa, sr)
        return sa.pooled(stop=stop), sr.pooled(stop=stop)

    return value


def _per_step(run: Run, quantity: str, stop: int) -> np.ndarray:
    """The quantity per step 0..stop (NaN where a step has no counted row)."""
    return qs.series(run, quantity).trailing(1, stop)[1]


def _matched(a: Run, r: Run, quantity: str) -> tuple[Matched, np.ndarray, np.ndarray]:
    stop = _common_stop(*(qs.series(x, q) for x in (a, r) for q in (quantity, "b")))
    m = matched_b(a, r, stop)
    if m.why is not None:
        raise NotJudgeable(m.why)
    return m, _per_step(a, quantity, m.stop), _per_step(r, quantity, m.stop)


#: Least reliability (``reliability``) of a run's prior b over the steps a trend reads: below
#: it b moved too little there, next to its own noise, to read a trend against it (the
#: slope would be shrunk to under half of the policy's).
MIN_RELIABILITY = 0.5


def step_noise(run: Run) -> float:
    """The variance of one step's b about the policy's, from its successive differences:
    half the mean squared difference of the per-step b (a slow trend adds little)."""
    s = qs.series(run, "b")
    b = s.trailing(1, s.last_step)[1]
    d = np.diff(b)
    d = d[np.isfinite(d)]
    return float(np.mean(d**2) / 2) if d.size else NAN


def reliability(run: Run, x: np.ndarray) -> float:
    """The share of the prior b's variance over the steps read (``x``) that is b's own
    movement rather than its sampling noise (one step's noise over ``B_SMOOTH`` steps): the
    factor an OLS slope on it is shrunk by. NaN with fewer than 3 steps."""
    x = x[np.isfinite(x)]
    if x.size < 3 or np.var(x) == 0:
        return NAN
    return float(1.0 - step_noise(run) / qs.B_SMOOTH / np.var(x))


@dataclass(frozen=True)
class TrendPoints:
    """The points a trend against b is fitted on, per run of a pair: the steps read, the
    prior b (x) and the per-step value (y) at each."""

    steps_a: np.ndarray
    x_a: np.ndarray
    y_a: np.ndarray
    steps_r: np.ndarray
    x_r: np.ndarray
    y_r: np.ndarray


def trend_points(a: Run, r: Run, quantity: str) -> TrendPoints:
    """The steps at matched b of both runs with the prior b and the per-step ``quantity``
    at each (steps without a value of the quantity left out); ``NotJudgeable`` when the
    runs share no b above the threshold."""
    m, ya, yr = _matched(a, r, quantity)
    xa, xr = prior_b(a, m.stop), prior_b(r, m.stop)
    ia = np.flatnonzero(m.steps_a & np.isfinite(ya))
    ir = np.flatnonzero(m.steps_r & np.isfinite(yr))
    return TrendPoints(ia, xa[ia], ya[ia], ir, xr[ir], yr[ir])


def matched_b_trend(quantity: str) -> PairValue:
    """Each run's OLS slope of the per-step quantity on its prior b (``prior_b``: b pooled
    over the ``qs.B_SMOOTH`` steps before), over its steps at matched b (``matched_b``);
    ``NotJudgeable`` when the runs share no b above the threshold."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        p = trend_points(a, r, quantity)
        for run, x in ((a, p.x_a), (r, p.x_r)):
            lam = reliability(run, x)
            if not lam >= MIN_RELIABILITY:
                raise NotJudgeable(
                    f"{run.label}'s b moved too little over its {x.size} steps at matched b to "
                    f"read a trend against it (reliability {lam:.2f}, the share of its prior "
                    f"b's variance that is not noise; at least {MIN_RELIABILITY:g} is read)"
                )
        return slope(p.x_a, p.y_a).value, slope(p.x_r, p.y_r).value

    return value


def matched_b_level(quantity: str) -> PairValue:
    """Each run's per-step quantity averaged over the bins (``B_BIN`` wide) of prior b
    (``prior_b``) in the shared range both runs visit (each bin weighs the same in both),
    over its steps at matched b."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        m, ya, yr = _matched(a, r, quantity)
        ba, br = prior_b(a, m.stop), prior_b(r, m.stop)
        edges = np.arange(m.lo, m.hi + B_BIN, B_BIN)
        ia = np.digitize(ba, edges)
        ir = np.digitize(br, edges)
        la, lr = [], []
        for k in range(1, len(edges) + 1):
            sa, sr = (
                m.steps_a & (ia == k) & np.isfinite(ya),
                m.steps_r & (ir == k) & np.isfinite(yr),
            )
            if sa.any() and sr.any():
                la.append(float(ya[sa].mean()))
                lr.append(float(yr[sr].mean()))
        if not la:
            raise NotJudgeable("no b bin both runs visit")
        return float(np.mean(la)), float(np.mean(lr))

    return value


#: Width of the b bins of ``matched_b_level``.
B_BIN = 0.05


def drift(quantity: str, per: float = 100.0, sources: tuple[str, ...] | None = None) -> PairValue:
    """OLS slope of the per-step quantity on the step over the whole run, per ``per`` steps."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity, sources), qs.series(r, quantity, sources)
        stop = _common_stop(sa, sr)

        def one(s: qs.Series) -> float:
            sel = s.step <= stop
            return per * slope(s.step[sel], s.values()[sel]).value

        return one(sa), one(sr)

    return value


def clock(a: Run, r: Run) -> tuple[float, float]:
    """Wall-clock each run took to reach the last step both reached."""
    ca, cr = qs.wall_clock(a), qs.wall_clock(r)
    stop = _common_stop(ca, cr)

    def at(c: qs.Series) -> float:
        sel = c.step <= stop
        return float(c.num[sel].max()) if sel.any() else NAN

    return at(ca), at(cr)


def gain(run: Run, stop: float, sources: tuple[str, ...] | None = None) -> float:
    """Success over the final window minus success over the first window of steps 0..stop
    (both ``FINAL_FRACTION`` of the steps): the run's reward improvement."""
    s = qs.series(run, "success", sources)
    start = qs.final_start(stop)
    width = int(stop) + 1 - int(start)
    return s.pooled(start, stop) - s.pooled(0, width - 1)


def cost_per_gain(cost: Callable[[Run, float], float]) -> PairValue:
    """Each run's ``cost(run, stop)`` to the last step both reached, divided by its reward
    improvement (``gain``); NaN for a run that did not improve."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        ca, cr = qs.wall_clock(a), qs.wall_clock(r)
        stop = min(_common_stop(ca, cr), qs.series(a, "success").last_step)
        stop = min(stop, qs.series(r, "success").last_step)
        if not np.isfinite(stop):
            return NAN, NAN
        out = []
        for run in (a, r):
            g = gain(run, stop)
            out.append(cost(run, stop) / g if g > 0 else NAN)
        return out[0], out[1]

    def why(run: Run) -> str | None:
        stop = qs.series(run, "success").last_step
        if np.isfinite(stop) and gain(run, stop) <= 0:
            return f"{run.label} seed {run.seed}: no reward improvement, so no cost per unit of it"
        return None

    value.why = why  # type: ignore[attr-defined]
    return value


def clock_at(run: Run, stop: float) -> float:
    """The run's clock at ``stop`` (``cost_per_gain``'s wall-clock)."""
    c = qs.wall_clock(run)
    sel = c.step <= stop
    return float(c.num[sel].max()) if sel.any() else NAN


def sandbox_at(run: Run, stop: float) -> float:
    """Sandbox seconds to ``stop``: Miles' per-sample mean (``perf/non_generation_time/mean``)
    times the rollouts generated in the step (the generated view, else the trained ones)."""
    t = qs.series(run, "sandbox_s")
    n = qs.series(run, "success")  # its den: the rollouts of the step, from the same view
    steps = np.intersect1d(t.step[t.step <= stop], n.step)
    per = dict(zip(t.step, t.values(), strict=True))
    cnt = dict(zip(n.step, n.den, strict=True))
    return float(sum(per[s] * cnt[s] for s in steps))
