"""Intervals and verdicts: paired by seed, t on n − 1 degrees of freedom.

Specification
-------------
A comparison of two arms is paired by seed (the same seed starts both arms on the same
tasks): ``d_s = x_arm(s) − x_ref(s)`` over the seeds both arms have a finite value for.
Its estimate is the mean of ``d`` with the two-sided t interval at ``LEVEL`` on ``n − 1``
degrees of freedom (``scipy.stats.t``). Fewer than ``MIN_SEEDS`` pairs decide nothing.

Every check ends in one of ``VERDICTS``, by what it expects of the interval ``[lo, hi]``
and the margin ``m`` (an equivalence margin stated per prediction):

=================  =====================  =====================  ==================
expects            as predicted           opposite               no difference
=================  =====================  =====================  ==================
``higher``         lo > 0                 hi < 0                 −m <= lo, hi <= m
``lower``          hi < 0                 lo > 0                 −m <= lo, hi <= m
``same``           −m <= lo, hi <= m      lo > m or hi < −m      —
``not lower``      lo > −m                hi < −m                —
``lower by m``     hi < −m                lo > −m                —
``at least``       lo >= supports         hi < falsifies         —
``cosine``         lo > supports          hi < 0                 −m <= lo, hi <= m
=================  =====================  =====================  ==================

Anything else is ``inconclusive``, with the reason. A margin that cannot be computed
(NaN: the reference arm has one seed) never gives ``as predicted`` for ``same`` /
``not lower`` / ``lower by m``, nor ``no difference``.

At ``LEVEL`` = 0.95 a ``higher`` / ``lower`` check on two arms that do not differ
declares a difference (either way) in 5% of comparisons; ``no difference`` inside ±m is
an equivalence test at least as strict as two one-sided tests at 2.5%.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rescue.errors import InputError

#: Two-sided level of every interval.
LEVEL = 0.95
#: Fewest paired seeds (replicates) a comparison needs before it can decide anything.
MIN_SEEDS = 3

AS_PREDICTED = "as predicted"
OPPOSITE = "opposite"
NO_DIFFERENCE = "no difference"
INCONCLUSIVE = "inconclusive"
VERDICTS: tuple[str, ...] = (AS_PREDICTED, OPPOSITE, NO_DIFFERENCE, INCONCLUSIVE)

#: What a check expects of its interval (see the module docstring).
EXPECTS: tuple[str, ...] = (
    "higher",
    "lower",
    "same",
    "not lower",
    "lower by m",
    "at least",
    "cosine",
)


@dataclass(frozen=True)
class Estimate:
    """A mean (or slope) with its interval.

    Attributes:
        value: the estimate (NaN without data).
        lo, hi: the two-sided ``level`` interval (NaN when it cannot be computed).
        n: replicates (paired seeds, subsets or steps) it rests on.
        dof: degrees of freedom of the t quantile.
        sd: standard deviation of the replicates (NaN below 2).
        level: the interval's level.
    """

    value: float
    lo: float
    hi: float
    n: int
    dof: int
    sd: float = float("nan")
    level: float = LEVEL

    @property
    def finite(self) -> bool:
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi))

    def as_dict(self) -> dict[str, float | int]:
        return {
            "value": self.value,
            "lo": self.lo,
            "hi": self.hi,
            "n": self.n,
            "dof": self.dof,
            "sd": self.sd,
            "level": self.level,
        }


NAN = float("nan")


def t_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> Estimate:
    """Mean of the finite ``values`` with the t interval on n − 1 dof."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0, 0, level=level)
    mean = float(x.mean())
    if n < 2:
        return Estimate(mean, NAN, NAN, 1, 0, level=level)
    sd = float(x.std(ddof=1))
    half = t_quantile(level, n - 1) * sd / np.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, n - 1, sd, level)


def t_quantile(level: float, dof: int) -> float:
    """The two-sided ``level`` quantile of Student's t (``scipy.stats``, imported on first use,
    so importing the judge loads no scipy)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, dof))


def paired(arm: Mapping[int, float], ref: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """Seeds both arms have a finite value for, and ``arm − ref`` per seed."""
    seeds = sorted(s for s in arm if s in ref and np.isfinite(arm[s]) and np.isfinite(ref[s]))
    return seeds, np.array([arm[s] - ref[s] for s in seeds], dtype=float)


def seed_sd(values: Mapping[int, float]) -> float:
    """Seed-to-seed standard deviation of an arm's per-seed values (NaN below 2 seeds)."""
    x = np.array([v for v in values.values() if np.isfinite(v)], dtype=float)
    return float(x.std(ddof=1)) if x.size >= 2 else NAN


def slope(x: Sequence[float], y: Sequence[float], level: float = LEVEL) -> Estimate:
    """OLS slope of ``y`` on ``x`` with its t interval on n − 2 dof (``scipy.stats.linregress``)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    n = int(xa.size)
    if n < 2 or np.ptp(xa) == 0:
        return Estimate(NAN, NAN, NAN, n, max(n - 2, 0), level=level)
    from scipy import stats

    fit = stats.linregress(xa, ya)
    if n < 3:
        return Estimate(float(fit.slope), NAN, NAN, n, 0, level=level)
    half = t_quantile(level, n - 2) * float(fit.stderr)
    return Estimate(float(fit.slope), fit.slope - half, fit.slope + half, n, n - 2, NAN, level)


def variance_ratio(x: Sequence[float], y: Sequence[float], level: float = LEVEL) -> Estimate:
    """``Var(x) / Var(y)`` of two independent samples with its F interval."""
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    xa, ya = xa[np.isfinite(xa)], ya[np.isfinite(ya)]
    if xa.size < 2 or ya.size < 2:
        return Estimate(NAN, NAN, NAN, int(min(xa.size, ya.size)), 0, level=level)
    vy = float(ya.var(ddof=1))
    if vy == 0:
        return Estimate(NAN, NAN, NAN, int(min(xa.size, ya.size)), 0, level=level)
    from scipy import stats

    r = float(xa.var(ddof=1)) / vy
    d1, d2 = xa.size - 1, ya.size - 1
    tail = (1 - level) / 2
    lo = r / float(stats.f.ppf(1 - tail, d1, d2))
    hi = r / float(stats.f.ppf(tail, d1, d2))
    return Estimate(r, lo, hi, int(min(xa.size, ya.size)), int(min(d1, d2)), level=level)


def decide(
    est: Estimate,
    expects: str,
    *,
    margin: float = NAN,
    supports: float = NAN,
    falsifies: float = NAN,
    min_n: int = MIN_SEEDS,
) -> tuple[str, str]:
    """``(verdict, reason)`` of an interval under what the check ``expects``.

    Args:
        est: the estimate and its interval.
        expects: one of ``EXPECTS``.
        margin: equivalence margin ``m`` (>= 0; NaN when it cannot be computed).
        supports, falsifies: thresholds of ``at least`` (and ``supports`` of ``cosine``).
        min_n: fewest replicates that can decide (default ``MIN_SEEDS``).
    """
    if expects not in EXPECTS:
        raise InputError(f"expects={expects!r}; allowed: {', '.join(EXPECTS)}")
    if est.n < min_n:
        return INCONCLUSIVE, f"{est.n} replicate(s); a verdict needs at least {min_n}"
    if not est.finite:
        return INCONCLUSIVE, "no interval (the replicates do not vary or are missing)"
    lo, hi, m = est.lo, est.hi, abs(margin)
    has_m = bool(np.isfinite(margin))
    inside = has_m and -m <= lo and hi <= m
    if expects in ("higher", "lower"):
        sign = 1 if expects == "higher" else -1
        if lo > 0:
            return (AS_PREDICTED if sign > 0 else OPPOSITE), "the interval lies above 0"
        if hi < 0:
            return (AS_PREDICTED if sign < 0 else OPPOSITE), "the interval lies below 0"
        if inside:
            return NO_DIFFERENCE, f"the interval lies inside ±{m:.4g}"
        return INCONCLUSIVE, _wide(has_m, m)
    if expects == "same":
        if inside:
            return AS_PREDICTED, f"the interval lies inside ±{m:.4g}"
        if has_m and (lo > m or hi < -m):
            return OPPOSITE, f"the interval lies outside ±{m:.4g}"
        return INCONCLUSIVE, _wide(has_m, m)
    if expects == "not lower":
        if has_m and lo > -m:
            return AS_PREDICTED, f"the interval lies above −{m:.4g}"
        if has_m and hi < -m:
            return OPPOSITE, f"the interval lies below −{m:.4g}"
        return INCONCLUSIVE, _wide(has_m, m)
    if expects == "lower by m":
        if has_m and hi < -m:
            return AS_PREDICTED, f"the interval lies below −{m:.4g}"
        if has_m and lo > -m:
            return OPPOSITE, f"the interval lies above −{m:.4g}"
        return INCONCLUSIVE, _wide(has_m, m)
    if expects == "at least":
        if lo >= supports:
            return AS_PREDICTED, f"the interval lies at or above {supports:.4g}"
        if hi < falsifies:
            return OPPOSITE, f"the interval lies below {falsifies:.4g}"
        return INCONCLUSIVE, f"the interval reaches between {falsifies:.4g} and {supports:.4g}"
    # cosine
    if lo > supports:
        return AS_PREDICTED, f"the interval lies above {supports:.4g}"
    if hi < 0:
        return OPPOSITE, "the interval lies below 0"
    if inside:
        return NO_DIFFERENCE, f"the interval lies inside ±{m:.4g} (isotropic)"
    return INCONCLUSIVE, f"the interval is neither above {supports:.4g} nor inside ±{m:.4g}"


def _wide(has_m: bool, m: float) -> str:
    if not has_m:
        return "the interval does not decide, and no margin could be computed"
    return f"the interval is too wide to decide against the margin ±{m:.4g}"


def threshold_verdict(value: float, *, supports: float, falsifies: float) -> str:
    """The ``at least`` rule on one number (an interval of width 0)."""
    if not np.isfinite(value):
        return INCONCLUSIVE
    point = Estimate(value, value, value, MIN_SEEDS, 0)
    return decide(point, "at least", supports=supports, falsifies=falsifies)[0]


def combine(verdicts: Sequence[str], mode: str = "any") -> str:
    """One verdict from the verdicts of the checks that decide a prediction.

    ``any``: each check is a falsifier on its own (``opposite`` if any is, else ``no
    difference`` if any is, ``as predicted`` if all are). ``all``: the prediction fails
    only jointly (``opposite`` if any is, ``no difference`` if all are, ``as predicted``
    if all are). Otherwise, and with no check, ``inconclusive``.
    """
    if mode not in ("any", "all"):
        raise InputError(f"mode={mode!r}; allowed: any, all")
    v = list(verdicts)
    if not v:
        return INCONCLUSIVE
    if OPPOSITE in v:
        return OPPOSITE
    if mode == "any" and NO_DIFFERENCE in v:
        return NO_DIFFERENCE
    if all(x == NO_DIFFERENCE for x in v):
        return NO_DIFFERENCE
    if all(x == AS_PREDICTED for x in v):
        return AS_PREDICTED
    return INCONCLUSIVE
