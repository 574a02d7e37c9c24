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
``at most``        hi <= supports         lo > falsifies         —
``cosine``         lo > supports          hi < 0                 −m <= lo, hi <= m
=================  =====================  =====================  ==================

Anything else is ``inconclusive``, with the reason. A margin that cannot be computed
(NaN: the reference arm has one seed) never gives ``as predicted`` for ``same`` /
``not lower`` / ``lower by m``, nor ``no difference``. A check whose condition never
occurred (P3's b never above its threshold in both arms) is ``not judgeable``, which is
no claim at all.

Replicates that do not vary (the same value in every seed, up to rounding: a quantity
that is identical by construction) give an interval of width 0 at their value, so the
check is decided by where that value lies (for ``higher`` / ``lower``, by its sign; a
difference of exactly 0 in every seed is ``no difference``), never by a margin or an
interval it does not have.

At ``LEVEL`` = 0.95 a ``higher`` / ``lower`` check on two arms that do not differ
declares a difference (either way) in 5% of comparisons; ``no difference`` inside ±m is
an equivalence test at least as strict as two one-sided tests at 2.5%. ``claim_p`` gives
the p-value of the claim a verdict makes (the largest 1 − level at which the interval
still makes it), which the report's family-wise rule (``family``) adjusts.
"""

from __future__ import annotations

import functools
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
NOT_JUDGEABLE = "not judgeable"
VERDICTS: tuple[str, ...] = (AS_PREDICTED, OPPOSITE, NO_DIFFERENCE, INCONCLUSIVE, NOT_JUDGEABLE)
#: The verdicts that claim something of the data (what the family-wise rule controls).
CLAIMS: tuple[str, ...] = (AS_PREDICTED, OPPOSITE, NO_DIFFERENCE)
#: A standard deviation below this share of the replicates' scale is rounding: 0.
EXACT_RTOL = 1e-9

#: What a check expects of its interval (see the module docstring).
EXPECTS: tuple[str, ...] = (
    "higher",
    "lower",
    "same",
    "not lower",
    "lower by m",
    "at least",
    "at most",
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
        se: the standard error the interval is ``value ± t_q(level, dof) · se`` with (NaN
            when the interval is not a t interval, e.g. the F interval of a variance
            ratio); 0 for replicates that do not vary.
    """

    value: float
    lo: float
    hi: float
    n: int
    dof: int
    sd: float = float("nan")
    level: float = LEVEL
    se: float = float("nan")

    @property
    def exact(self) -> bool:
        """Whether the replicates do not vary (an interval of width 0 at the value)."""
        return self.se == 0

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
            "se": self.se,
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
    if sd <= EXACT_RTOL * max(float(np.abs(x).max()), 1e-300) or np.ptp(x) == 0:
        sd, mean = 0.0, float(np.median(x))  # the same value in every replicate, up to rounding
        return Estimate(mean, mean, mean, n, n - 1, 0.0, level, 0.0)
    se = sd / np.sqrt(n)
    half = t_quantile(level, n - 1) * se
    return Estimate(mean, mean - half, mean + half, n, n - 1, sd, level, float(se))


@functools.lru_cache(maxsize=4096)
def t_quantile(level: float, dof: int) -> float:
    """The two-sided ``level`` quantile of Student's t (``scipy.stats``, imported on first use,
    so importing the judge loads no scipy); remembered per (level, dof)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, dof))


def paired(arm: Mapping[int, float], ref: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """Seeds both arms have a finite value for, and ``arm − ref`` per seed.

    A difference within rounding of both values (``EXACT_RTOL`` of the larger) is 0: two
    values that are the same by construction never differ by their rounding.
    """
    seeds = sorted(s for s in arm if s in ref and np.isfinite(arm[s]) and np.isfinite(ref[s]))
    a = np.array([arm[s] for s in seeds], dtype=float)
    r = np.array([ref[s] for s in seeds], dtype=float)
    d = a - r
    d[np.abs(d) <= EXACT_RTOL * np.maximum(np.abs(a), np.abs(r))] = 0.0
    return seeds, d


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
    b, se = _linregress(xa, ya)
    if n < 3:
        return Estimate(b, NAN, NAN, n, 0, level=level)
    half = t_quantile(level, n - 2) * se
    return Estimate(b, b - half, b + half, n, n - 2, NAN, level, se)


def _linregress(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Slope and its standard error, by the arithmetic of ``scipy.stats.linregress`` (the
    same numbers, without its per-call overhead: the judge fits thousands of slopes)."""
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=1).flat
    if ssxm == 0.0 or ssym == 0.0:
        r = np.nan if ssxym == 0 else 0.0
    else:
        r = min(max(ssxym / np.sqrt(ssxm * ssym), -1.0), 1.0)
    slope = ssxym / ssxm
    df = x.size - 2
    se = float(np.sqrt((1 - r**2) * ssym / ssxm / df)) if df > 0 else 0.0
    return float(slope), se


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
        supports, falsifies: thresholds of ``at least`` / ``at most`` (and ``supports`` of
            ``cosine``).
        min_n: fewest replicates that can decide (default ``MIN_SEEDS``).
    """
    if expects not in EXPECTS:
        raise InputError(f"expects={expects!r}; allowed: {', '.join(EXPECTS)}")
    if est.n < min_n:
        return INCONCLUSIVE, f"{est.n} replicate(s); a verdict needs at least {min_n}"
    if not est.finite:
        return INCONCLUSIVE, "no interval (the replicates are missing)"
    if est.exact and expects in ("same", "not lower", "lower by m"):
        return _exact(est.value, expects, margin)
    lo, hi, m = est.lo, est.hi, abs(margin)
    has_m = bool(np.isfinite(margin))
    inside = has_m and -m <= lo and hi <= m
    if expects in ("higher", "lower"):
        sign = 1 if expects == "higher" else -1
        what = "the value (the same in every replicate)" if est.exact else "the interval"
        if lo > 0:
            return (AS_PREDICTED if sign > 0 else OPPOSITE), f"{what} lies above 0"
        if hi < 0:
            return (AS_PREDICTED if sign < 0 else OPPOSITE), f"{what} lies below 0"
        if est.exact:
            return NO_DIFFERENCE, "the difference is 0 in every replicate"
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
    if expects == "at most":
        if hi <= supports:
            return AS_PREDICTED, f"the interval lies at or below {supports:.4g}"
        if lo > falsifies:
            return OPPOSITE, f"the interval lies above {falsifies:.4g}"
        return INCONCLUSIVE, f"the interval reaches between {supports:.4g} and {falsifies:.4g}"
    # cosine
    if lo > supports:
        return AS_PREDICTED, f"the interval lies above {supports:.4g}"
    if hi < 0:
        return OPPOSITE, "the interval lies below 0"
    if inside:
        return NO_DIFFERENCE, f"the interval lies inside ±{m:.4g} (isotropic)"
    return INCONCLUSIVE, f"the interval is neither above {supports:.4g} nor inside ±{m:.4g}"


def _exact(value: float, expects: str, margin: float) -> tuple[str, str]:
    """An equivalence-type check on a value that is the same in every replicate: where the
    value lies against the margin (a margin that could not be computed counts as 0)."""
    m = abs(margin) if np.isfinite(margin) else 0.0
    where = f"the value {value:.4g} (the same in every replicate)"
    if expects == "same":
        ok = -m <= value <= m
        return (
            AS_PREDICTED if ok else OPPOSITE
        ), f"{where} lies {'inside' if ok else 'outside'} ±{m:.4g}"
    if expects == "not lower":
        ok = value >= -m
        return (
            AS_PREDICTED if ok else OPPOSITE
        ), f"{where} lies {'at or above' if ok else 'below'} −{m:.4g}"
    ok = value < -m  # lower by m
    return (
        AS_PREDICTED if ok else OPPOSITE
    ), f"{where} lies {'below' if ok else 'at or above'} −{m:.4g}"


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

    A check that is ``not judgeable`` makes the prediction ``not judgeable`` (its condition
    did not occur). ``any``: each check is a falsifier on its own (``opposite`` if any is,
    else ``no difference`` if any is, ``as predicted`` if all are). ``all``: the
    prediction fails only jointly (``opposite`` if any is, ``no difference`` if all are,
    ``as predicted`` if all are). Otherwise, and with no check, ``inconclusive``.
    """
    if mode not in ("any", "all"):
        raise InputError(f"mode={mode!r}; allowed: any, all")
    v = list(verdicts)
    if not v:
        return INCONCLUSIVE
    if NOT_JUDGEABLE in v:
        return NOT_JUDGEABLE
    if OPPOSITE in v:
        return OPPOSITE
    if mode == "any" and NO_DIFFERENCE in v:
        return NO_DIFFERENCE
    if all(x == NO_DIFFERENCE for x in v):
        return NO_DIFFERENCE
    if all(x == AS_PREDICTED for x in v):
        return AS_PREDICTED
    return INCONCLUSIVE


def claim_p(
    est: Estimate,
    expects: str,
    verdict: str | None,
    *,
    margin: float = NAN,
    supports: float = NAN,
    falsifies: float = NAN,
) -> float:
    """The p-value of the claim ``verdict`` makes of ``est`` under ``expects``.

    The interval at level ``L`` is ``value ± t_q(L, dof) · se``; a claim is a condition on
    it (``lo > c``, ``hi < c``, or both ends inside ``±m``) that holds at every level
    below some ``L*``, and its p-value is ``1 − L*`` (so ``decide`` makes the claim at
    ``LEVEL`` exactly when ``p < 1 − LEVEL``). 0 for replicates that do not vary; NaN when
    ``verdict`` claims nothing or the interval is not a t interval.
    """
    if verdict not in CLAIMS:
        return NAN
    if est.exact:
        return 0.0
    if not (np.isfinite(est.se) and est.se > 0 and est.dof >= 1):
        return NAN
    from scipy.special import stdtr  # Student's t CDF, what scipy.stats.t.sf evaluates

    mu, se, m = est.value, est.se, abs(margin)

    def above(c: float) -> float:  # lo > c
        return min(1.0, 2.0 * float(stdtr(est.dof, -(mu - c) / se)))

    def below(c: float) -> float:  # hi < c
        return min(1.0, 2.0 * float(stdtr(est.dof, -(c - mu) / se)))

    inside = max(above(-m), below(m)) if np.isfinite(margin) else NAN
    if verdict == NO_DIFFERENCE:
        return inside
    good = verdict == AS_PREDICTED
    if expects in ("higher", "lower"):
        return above(0.0) if mu > 0 else below(0.0)
    if expects == "same":
        return inside if good else (above(m) if mu > m else below(-m))
    if expects == "not lower":
        return above(-m) if good else below(-m)
    if expects == "lower by m":
        return below(-m) if good else above(-m)
    if expects == "at least":
        return above(supports) if good else below(falsifies)
    if expects == "at most":
        return below(supports) if good else above(falsifies)
    if expects == "cosine":
        return above(supports) if good else below(0.0)
    raise InputError(f"expects={expects!r}; allowed: {', '.join(EXPECTS)}")
