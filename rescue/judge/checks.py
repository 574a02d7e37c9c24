"""One check: a quantity compared between two arms (or against a threshold), and its verdict.

Specification
-------------
``compare`` pairs the runs of two arms by seed, computes each seed's pair of values with a
window rule (``windows``), and judges the per-seed differences with ``stats.decide``.
A run that did not log a needed key makes the check ``inconclusive`` with the key named;
a seed whose value cannot be computed (no success in the window) is left out and said
why; a seed in which the condition of the comparison did not occur (``NotJudgeable``: the
arms share no b above P3's threshold) is left out too, and when no seed is left the check
is ``not judgeable``, which claims nothing. Nothing here raises on a missing key. Each
check notes which view its quantities were read from (every generated rollout, or the
trained groups only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rescue.judge import quantities as qs
from rescue.judge.quantities import MissingKey
from rescue.judge.runs import Run
from rescue.judge.stats import (
    INCONCLUSIVE,
    MIN_SEEDS,
    NAN,
    NOT_JUDGEABLE,
    Estimate,
    claim_p,
    decide,
    paired,
    seed_sd,
    t_interval,
)


class NotJudgeable(Exception):
    """The condition a comparison is about did not occur in a seed (the message says how)."""


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
        supports, falsifies: the thresholds of ``at least`` / ``at most`` / ``cosine``.
        alone: the verdict at ``LEVEL`` before the report's family-wise rule (``family``)
            looked at it; ``verdict`` is the one after it.
        p: the p-value of the claim ``alone`` makes (``stats.claim_p``; NaN: no claim).
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
    supports: float = NAN
    falsifies: float = NAN
    alone: str | None = None
    p: float = NAN
    #: How ``compare`` took the margin (its ``margin`` argument), for ``rejudge``.
    margin_rule: Any = field(default="not a comparison", repr=False, compare=False)

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
            "verdict_alone": self.alone,
            "p": self.p,
            "reason": self.reason,
            "values": {k: {str(s): v for s, v in d.items()} for k, d in self.values.items()},
            "notes": list(self.notes),
            "unit": self.unit,
        }


#: The label of a ``per_seed`` check's values (one number per seed, no arms).
PER_SEED = "per seed"
#: ``Check.margin_rule`` of a check ``compare`` did not make (``rejudge`` refuses it).
MISSING_RULE = "not a comparison"

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
    check.supports, check.falsifies = supports, falsifies
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
    check.alone = check.verdict
    check.p = claim_p(
        est, check.expects, check.verdict, margin=margin, supports=supports, falsifies=falsifies
    )
    return check


#: Margin from the reference arm's per-seed values: ``(values) -> margin``.
MarginRule = Callable[[Mapping[Any, float]], float]


def half_reference_trend(values: Mapping[Any, float]) -> float:
    """Half the reference arm's mean value in magnitude (the two-outcome control's margin)."""
    x = np.array([v for v in values.values() if np.isfinite(v)], dtype=float)
    return 0.5 * abs(float(x.mean())) if x.size else NAN


def compare(
    arm: Mapping[int, Run],
    ref: Mapping[int, Run],
    *,
    name: str,
    expects: str | None,
    window: str,
    value: PairValue,
    margin: str | float | MarginRule | None = "ref",
    margin_text: str = "",
    decides: bool = True,
    unit: str = "",
    reads: tuple[str, tuple[str, ...] | None] | None = None,
) -> Check:
    """Per-seed values of two arms, paired by seed, judged by what ``expects``.

    Args:
        arm, ref: seed -> run of the two arms (the difference is arm − ref).
        value: the window rule giving both values of one seed; it raises ``NotJudgeable``
            for a seed in which the comparison's condition did not occur.
        margin: ``"ref"`` (the reference arm's seed SD of the same value), a number, a
            rule on the reference arm's per-seed values (``MarginRule``), or None (no
            margin); ``margin_text`` says where it comes from.
        reads: ``(quantity, sources)`` the value reads, to note the view it came from.
    """
    decides = decides and expects is not None  # a reported comparison decides nothing
    check = Check(name=name, expects=expects, window=window, decides=decides, unit=unit)
    a_label = next(iter(arm.values())).label if arm else "arm"
    r_label = next(iter(ref.values())).label if ref else "reference"
    va: dict[int, float] = {}
    vr: dict[int, float] = {}
    seeds = sorted(set(arm) & set(ref))
    unpaired = sorted(set(arm) ^ set(ref))
    if unpaired:
        check.notes.append(f"seeds without a partner, left out: {', '.join(map(str, unpaired))}")
    unjudged: dict[int, str] = {}
    for s in seeds:
        try:
            va[s], vr[s] = value(arm[s], ref[s])
        except MissingKey as e:
            check.values = {a_label: va, r_label: vr}
            check.verdict, check.reason = INCONCLUSIVE, str(e)
            if reads is not None and reads[1] == qs.GENERATED:
                check.reason += (
                    ": this check reads every generated rollout; a run that logged only the "
                    "trained groups' census would compare one arm's survivors with another "
                    "arm's everything, so it is not judged on them"
                )
            return check
        except NotJudgeable as e:
            unjudged[s] = str(e)
            va[s] = vr[s] = NAN
    check.values = {a_label: va, r_label: vr}
    if reads is not None:
        check.notes.extend(_read_from(reads[0], reads[1], [arm[s] for s in seeds]))
    if unjudged:
        check.notes.extend(f"seed {s}: {why}" for s, why in unjudged.items())
    if seeds and len(unjudged) == len(seeds):
        first = next(iter(unjudged.values()))
        check.verdict, check.reason = NOT_JUDGEABLE, f"not judgeable: {first}"
        check.alone = NOT_JUDGEABLE
        return check
    lost = [
        s for s in seeds if s not in unjudged and not (np.isfinite(va[s]) and np.isfinite(vr[s]))
    ]
    if lost:
        check.notes.append(
            f"seeds without a value in the window, left out: {', '.join(map(str, lost))}"
        )
        why = getattr(value, "why", None)  # the window rule says why a run has no value
        reasons = {w for s in lost for run in (arm[s], ref[s]) if why and (w := why(run))}
        check.notes.extend(sorted(reasons))
    check.margin_text = margin_text or (f"seed SD of {r_label}" if margin == "ref" else "")
    check.margin_rule = margin
    return judge_pairs(check, va, vr)


def judge_pairs(check: Check, va: Mapping[Any, float], vr: Mapping[Any, float]) -> Check:
    """The statistics of ``compare`` on per-seed values: pair ``va`` (the arm) with ``vr``
    (the reference) by seed, take the margin by ``check.margin_rule`` from the reference's
    values, and judge the differences' t interval (``judge_values``). ``compare`` ends
    here; ``rejudge`` re-runs it on other values."""
    _, diffs = paired(va, vr)
    m = NAN
    margin = check.margin_rule
    if isinstance(margin, str) and margin == "ref":
        m = seed_sd(vr)
    elif callable(margin):
        m = margin({s: v for s, v in vr.items() if s in va and np.isfinite(va[s])})
    elif isinstance(margin, (int, float)):
        m = float(margin)
    return judge_values(check, t_interval(diffs), margin=m)


def rejudge(check: Check, values: Mapping[str, Mapping[Any, float]]) -> Check:
    """A copy of ``check`` judged again, by its own rule, on other per-seed values
    (``{label: {seed: value}}``, the shape of ``Check.values``): a comparison of two arms
    by ``judge_pairs``, a one-number-per-seed check (``per_seed``) by its t interval
    against its thresholds. ``rescue power`` judges its replicates through it."""
    new = replace(check, values={k: dict(v) for k, v in values.items()}, notes=list(check.notes))
    new.alone, new.p = None, NAN
    if list(values) == [PER_SEED]:
        return judge_values(
            new, t_interval(list(values[PER_SEED].values())),
            supports=check.supports, falsifies=check.falsifies,
        )  # fmt: skip
    if check.margin_rule is MISSING_RULE or len(values) != 2:
        raise ValueError(f"check {check.name!r} is not a comparison rejudge can re-run")
    va, vr = values.values()
    return judge_pairs(new, va, vr)


def _read_from(quantity: str, sources: tuple[str, ...] | None, runs: list[Run]) -> list[str]:
    """One note per view the quantity was read from in ``runs``."""
    used: dict[str, int] = {}
    for run in runs:
        try:
            used[qs.QUANTITIES[quantity].source(run, sources)] = (
                used.get(qs.QUANTITIES[quantity].source(run, sources), 0) + 1
            )
        except MissingKey:
            continue
    out = []
    for prefix, n in used.items():
        what = (
            "every generated rollout" if prefix in qs.GENERATED else "the trained groups only"
            if prefix == qs.CENSUS else "the run's own keys"
        )  # fmt: skip
        out.append(f"{qs.QUANTITIES[quantity].title} read from `{prefix}` ({what}; {n} seed(s))")
    return out


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
    supports: float = NAN,
    falsifies: float = NAN,
) -> Check:
    """One number per seed from the two arms' runs of that seed (a slope, a ratio), judged
    as a one-sample t interval against 0 (no margin), or against ``supports`` /
    ``falsifies`` (``at least`` / ``at most``)."""
    check = Check(name=name, expects=expects, window=window, decides=decides, unit=unit)
    values: dict[int, float] = {}
    check.values = {PER_SEED: values}
    for s in sorted(set(arm) & set(ref)):
        try:
            values[s] = value(arm[s], ref[s])
        except MissingKey as e:
            check.verdict, check.reason = INCONCLUSIVE, str(e)
            return check
    if np.isfinite(supports):
        check.margin_text = f"thresholds {supports:g} / {falsifies:g}"
    return judge_values(
        check, t_interval(list(values.values())), supports=supports, falsifies=falsifies
    )
