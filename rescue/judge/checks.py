"""One check: a quantity compared between two arms (or against a threshold), and its verdict.

Specification
-------------
``compare`` pairs the runs of two arms by seed, computes each seed's pair of values with a
window rule (``final``, ``whole``, ``trend_after_b``, ``drift``, ``clock``), and judges the
per-seed differences with ``stats.decide``. A run that did not log a needed key makes the
check ``inconclusive`` with the key named; a seed whose value cannot be computed (b never
crossed the threshold, no success in the window) is left out and said why. Nothing here
raises on a missing key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge.quantities import MissingKey
from rescue.judge.runs import Run
from rescue.judge.stats import (
    INCONCLUSIVE,
    MIN_SEEDS,
    NAN,
    Estimate,
    decide,
    paired,
    seed_sd,
    slope,
    t_interval,
)


@dataclass
class Check:
    """One judged comparison.

    Attributes:
        name: what is compared, with the arms (``final success, protect-a0.5 − never-drop``).
        expects: what the prediction expects (``stats.EXPECTS``; None for a comparison
            that is reported without a prediction).
        window: the window rule, in words.
        decides: whether the prediction's falsification rule rests on it.
        estimate: mean of the per-seed differences (or the replicates) with its interval.
        margin: the equivalence margin (NaN when none applies or it cannot be computed).
        margin_text: where the margin comes from.
        verdict: one of ``stats.VERDICTS`` (None for a reported comparison).
        reason: why that verdict (the interval against 0 / the margin / the thresholds).
        values: per arm label, per seed (or replicate), the value judged.
        notes: seeds left out, keys missing, sources read.
    """

    name: str
    expects: str | None
    window: str
    decides: bool = True
    estimate: Estimate | None = None
    margin: float = NAN
    margin_text: str = ""
    verdict: str | None = INCONCLUSIVE
    reason: str = ""
    values: dict[str, dict[Any, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unit: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "expects": self.expects,
            "window": self.window,
            "decides": self.decides,
            "estimate": self.estimate.as_dict() if self.estimate else None,
            "margin": self.margin,
            "margin_text": self.margin_text,
            "verdict": self.verdict,
            "reason": self.reason,
            "values": {k: {str(s): v for s, v in d.items()} for k, d in self.values.items()},
            "notes": list(self.notes),
            "unit": self.unit,
        }


#: ``(arm run, reference run) -> (arm value, reference value)`` for one seed.
PairValue = Callable[[Run, Run], tuple[float, float]]


def judge_values(
    check: Check,
    est: Estimate,
    *,
    margin: float = NAN,
    supports: float = NAN,
    falsifies: float = NAN,
    min_n: int = MIN_SEEDS,
) -> Check:
    """Fill in the estimate and the verdict (a reported comparison gets no verdict)."""
    check.estimate, check.margin = est, margin
    if check.expects is None:
        check.verdict = None
        if est.n < min_n or not est.finite:
            check.reason = f"{est.n} replicate(s): no interval to read"
        elif est.lo > 0 or est.hi < 0:
            check.reason = "the interval excludes 0"
        else:
            check.reason = "the interval contains 0"
        return check
    check.verdict, check.reason = decide(
        est, check.expects, margin=margin, supports=supports, falsifies=falsifies, min_n=min_n
    )
    return check


def compare(
    arm: Mapping[int, Run],
    ref: Mapping[int, Run],
    *,
    name: str,
    expects: str | None,
    window: str,
    value: PairValue,
    margin: str | float | None = "ref",
    decides: bool = True,
    unit: str = "",
) -> Check:
    """Per-seed values of two arms, paired by seed, judged by what ``expects``.

    Args:
        arm, ref: seed -> run of the two arms (the difference is arm − ref).
        value: the window rule giving both values of one seed.
        margin: ``"ref"`` (the reference arm's seed SD of the same value), a number, or
            None (no margin).
    """
    check = Check(name=name, expects=expects, window=window, decides=decides, unit=unit)
    a_label = next(iter(arm.values())).label if arm else "arm"
    r_label = next(iter(ref.values())).label if ref else "reference"
    va: dict[int, float] = {}
    vr: dict[int, float] = {}
    seeds = sorted(set(arm) & set(ref))
    unpaired = sorted(set(arm) ^ set(ref))
    if unpaired:
        check.notes.append(f"seeds without a partner, left out: {', '.join(map(str, unpaired))}")
    for s in seeds:
        try:
            va[s], vr[s] = value(arm[s], ref[s])
        except MissingKey as e:
            check.values = {a_label: va, r_label: vr}
            check.verdict, check.reason = INCONCLUSIVE, str(e)
            return check
    check.values = {a_label: va, r_label: vr}
    lost = [s for s in seeds if not (np.isfinite(va[s]) and np.isfinite(vr[s]))]
    if lost:
        check.notes.append(
            f"seeds without a value in the window, left out: {', '.join(map(str, lost))}"
        )
        why = getattr(value, "why", None)  # the window rule says why a run has no value
        reasons = {w for s in lost for run in (arm[s], ref[s]) if why and (w := why(run))}
        check.notes.extend(sorted(reasons))
    _, diffs = paired(va, vr)
    m = NAN
    if margin == "ref":
        m = seed_sd(vr)
        check.margin_text = f"seed SD of {r_label}"
    elif isinstance(margin, (int, float)):
        m = float(margin)
    return judge_values(check, t_interval(diffs), margin=m)


def per_seed(
    arm: Mapping[int, Run],
    ref: Mapping[int, Run],
    *,
    name: str,
    expects: str,
    window: str,
    value: Callable[[Run, Run], float],
    decides: bool = True,
    unit: str = "",
) -> Check:
    """One number per seed from the two arms' runs of that seed (a slope, a ratio), judged
    as a one-sample t interval against 0 (no margin)."""
    check = Check(name=name, expects=expects, window=window, decides=decides, unit=unit)
    values: dict[int, float] = {}
    check.values = {"per seed": values}
    for s in sorted(set(arm) & set(ref)):
        try:
            values[s] = value(arm[s], ref[s])
        except MissingKey as e:
            check.verdict, check.reason = INCONCLUSIVE, str(e)
            return check
    return judge_values(check, t_interval(list(values.values())))


# ---------------------------------------------------------------- window rules


def _common_stop(*series: qs.Series) -> float:
    return min(s.last_step for s in series)


def final(quantity: str) -> PairValue:
    """The quantity pooled over the final window of the steps both runs reached."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity), qs.series(r, quantity)
        stop = _common_stop(sa, sr)
        if not np.isfinite(stop):  # a run without a single counted row
            return NAN, NAN
        start = qs.final_start(stop)
        return sa.pooled(start, stop), sr.pooled(start, stop)

    return value


def whole(quantity: str) -> PairValue:
    """The quantity pooled over every step both runs reached."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity), qs.series(r, quantity)
        stop = _common_stop(sa, sr)
        return sa.pooled(stop=stop), sr.pooled(stop=stop)

    return value


def trend_against_b(run: Run, quantity: str, stop: float) -> float:
    """OLS slope of the per-step quantity on the run's per-step b, from its b crossing to ``stop``."""
    if not np.isfinite(stop):
        return NAN
    q = qs.QUANTITIES[quantity]
    bq = qs.b_quantity(run)
    y = _per_row(run, q)
    x = _per_row(run, bq)
    t0 = qs.crossing(run)
    if not np.isfinite(t0):
        return NAN
    steps = run.steps()
    sel = (steps >= t0) & (steps <= stop) & np.isfinite(x) & np.isfinite(y)
    return slope(x[sel], y[sel]).value


def _per_row(run: Run, q: qs.Quantity) -> np.ndarray:
    num, den = q.rows(run, q.source(run))
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def trend_after_b(quantity: str) -> PairValue:
    """Each run's trend of the quantity against its b after b first exceeds the threshold."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        stop = _common_stop(qs.series(a, quantity), qs.series(r, quantity))
        return trend_against_b(a, quantity, stop), trend_against_b(r, quantity, stop)

    def why(run: Run) -> str | None:
        if np.isfinite(qs.crossing(run)):
            return None
        top = np.nanmax(qs.series(run, qs.b_quantity(run)).trailing(qs.B_SMOOTH)[1], initial=np.nan)
        return (
            f"{run.label} seed {run.seed}: its b ({qs.b_quantity(run).title}) never exceeded "
            f"{qs.B_THRESHOLD:g} (highest {top:.3g} over {qs.B_SMOOTH} steps): the prediction's "
            "condition did not occur"
        )

    value.why = why  # type: ignore[attr-defined]
    return value


def drift(quantity: str, per: float = 100.0) -> PairValue:
    """OLS slope of the per-step quantity on the step over the whole run, per ``per`` steps."""

    def value(a: Run, r: Run) -> tuple[float, float]:
        sa, sr = qs.series(a, quantity), qs.series(r, quantity)
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
