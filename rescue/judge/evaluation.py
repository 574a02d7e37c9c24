"""How a prediction is judged: arms bound to roles, checks combined into a verdict.

Specification
-------------
A ``Prediction`` names the arms it compares by *role* (``Role``: an arm name of the shared
vocabulary and, for protect, its a). When a role matches several arm labels of a cohort
(``drop-k1`` and ``drop-k2``), the prediction is judged once per combination whose k
agree; a missing required role makes it ``not run``, naming the arm. A prediction that
holds only for some cohorts (``applies``) is not judged on the others, and says why:
``three_outcome`` (P3, P4, P7 offline) does not apply where no rollout of the bound arms
ended as a submitted failure (two outcomes: solved or capped) or none as a budget failure
(solved or submitted), and P7 offline (``three_outcome_groups``) not to groups of one
rollout; ``two_outcome`` (the
control) applies only there; unknown (no outcome counts logged) counts as three. Its ``evaluate`` returns
``Check``s; the checks that carry the falsification rule (``decides``) give the verdict
through ``stats.combine`` (``any``: each falsifies on its own; ``all``: only jointly). A
reported comparison (``prediction=False``) gets no verdict. ``Result.alone`` is the
verdict before the report's family-wise rule (``family``) adjusts the checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rescue.judge import offline
from rescue.judge import quantities as qs
from rescue.judge.checks import Check
from rescue.judge.runs import Cohort, Run, config_value
from rescue.judge.stats import (
    AS_PREDICTED,
    CLAIMS,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    NOT_JUDGEABLE,
    OPPOSITE,
    combine,
)


@dataclass(frozen=True)
class Role:
    """An arm a prediction needs: a vocabulary name and, for protect, its a."""

    arm: str
    a: float | None = None
    optional: bool = False

    def matches(self, run: Run) -> bool:
        c = run.condition
        if c.base_arm != self.arm:
            return False
        return self.a is None or (c.a is not None and abs(c.a - self.a) < 1e-9)

    def describe(self) -> str:
        """The role as the runs name its arm, with its a."""
        return self.arm + (f" a={self.a:g}" if self.a is not None else "")


@dataclass
class Context:
    """What one evaluation sees: the cohort's arms bound to roles, or replay reports."""

    cohort: Cohort = field(default_factory=dict)
    binding: dict[str, str | None] = field(default_factory=dict)
    replays: Sequence[offline.Report] = ()

    def arm(self, role: str) -> dict[int, Run]:
        label = self.binding.get(role)
        return self.cohort.get(label, {}) if label else {}

    def label(self, role: str) -> str:
        return self.binding.get(role) or role


@dataclass(frozen=True)
class Prediction:
    """One pre-registered prediction (or a reported comparison, ``prediction=False``)."""

    id: str
    title: str
    rule: str
    falsified: str
    window: str
    margin: str
    depends: str
    roles: dict[str, Role]
    evaluate: Callable[[Context], list[Check]]
    combine: str = "any"
    reads: str = "runs"  # "runs" (a cohort), "replay" (rescue replay reports) or "both"
    prediction: bool = True
    #: (quantity, arm role, reference role): the differences the report plots.
    curves: tuple[tuple[str, str, str], ...] = ()
    #: Why the prediction does not apply to the bound cohort (None: it does).
    applies: Callable[[Context], str | None] | None = None


@dataclass
class Result:
    """A prediction judged once (for one binding of its roles)."""

    prediction: Prediction
    binding: dict[str, str | None]
    checks: list[Check]
    verdict: str | None
    note: str = ""
    #: The verdict before the family-wise rule (``family``); ``verdict`` is the one after.
    alone: str | None = None

    def __post_init__(self) -> None:
        if self.alone is None:
            self.alone = self.verdict

    def as_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "id": p.id,
            "title": p.title,
            "prediction": p.prediction,
            "rule": p.rule,
            "falsified": p.falsified,
            "window": p.window,
            "margin": p.margin,
            "depends": p.depends,
            "binding": dict(self.binding),
            "verdict": self.verdict,
            "verdict_alone": self.alone,
            "note": self.note,
            "checks": [c.as_dict() for c in self.checks],
        }


def bindings(p: Prediction, cohort: Cohort) -> tuple[list[dict[str, str | None]], str]:
    """The role -> arm label bindings to judge ``p`` on, or ``([], why not)``.

    One binding per combination of the required roles' labels whose k agree; an optional
    role takes each of its labels whose k agrees with the binding (None when none does).
    """
    found: dict[str, list[str]] = {}
    for role, spec in p.roles.items():
        found[role] = sorted(
            lbl
            for lbl, seeds in cohort.items()
            if seeds and spec.matches(next(iter(seeds.values())))
        )
        if not found[role] and not spec.optional:
            need = ", ".join(f"`{r.describe()}`" for r in p.roles.values() if not r.optional)
            return [], f"not run: needs the arms {need}; missing `{spec.describe()}`"

    def k_of(label: str) -> int | None:
        return next(iter(cohort[label].values())).condition.k

    def agree(labels) -> bool:
        return len({k_of(x) for x in labels if x is not None} - {None}) <= 1

    required = [r for r, spec in p.roles.items() if not spec.optional]
    out: list[dict[str, str | None]] = []
    for combo in itertools.product(*(found[r] for r in required)):
        if not agree(combo):
            continue
        partial: list[dict[str, str | None]] = [dict(zip(required, combo, strict=True))]
        for role, spec in p.roles.items():
            if not spec.optional:
                continue
            grown = []
            for b in partial:
                fits = [x for x in found[role] if agree([*b.values(), x])]
                grown += [{**b, role: x} for x in fits] or [{**b, role: None}]
            partial = grown
        out += [{r: b[r] for r in p.roles} for b in partial]
    return out, ""


def evaluate(
    predictions: Sequence[Prediction],
    cohort: Cohort | None = None,
    replays: Sequence[offline.Report] = (),
) -> list[Result]:
    """Judge each prediction on one cohort of runs (and/or the replay reports)."""
    results = []
    for p in predictions:
        if cohort is not None and p.reads in ("runs", "both"):
            found, why = bindings(p, cohort)
            if not found:
                results.append(Result(p, {}, [], None if not p.prediction else INCONCLUSIVE, why))
            for b in found:
                results.append(_judge(p, Context(cohort=cohort, binding=b)))
        if cohort is None and p.reads in ("replay", "both"):
            results.append(_judge(p, Context(replays=replays)))
    return results


def _judge(p: Prediction, ctx: Context) -> Result:
    if p.applies is not None and (why := p.applies(ctx)):
        return Result(p, ctx.binding, [], None, why)
    checks = p.evaluate(ctx)
    if not p.prediction:
        return Result(p, ctx.binding, checks, None)
    note = "" if checks else "nothing to judge"
    return Result(p, ctx.binding, checks, verdict_of(p, checks), note)


def short_name(check: Check) -> str:
    """A check's quantity, without its arms (``turns of successes over the run``)."""
    return check.name.split(", ")[0] if ", " in check.name else check.name


def verdict_reason(r: Result) -> str:
    """Why the result has its verdict, in a few words from its deciding checks (what a plot
    title and a report section say beside the verdict); the note when it has no checks.

    E.g. ``the turns of failures (submitted or capped) over the run check found no
    difference (P5 needs both deciding checks; the turns of successes over the run check
    found what was predicted)``, or ``the family-wise rule withdrew the final success
    check's claim (as predicted alone, p = 0.039)``.
    """
    if r.verdict is None:
        return r.note or "a reported comparison, no verdict"
    deciding = [c for c in r.checks if c.decides and c.verdict is not None]
    if not deciding:
        return r.note or "nothing to judge"
    withdrawn = [c for c in deciding if c.alone != c.verdict and c.alone in CLAIMS]
    if withdrawn and r.alone != r.verdict:
        c = withdrawn[0]
        p = f", p = {c.p:.2g}" if np.isfinite(c.p) else ""
        return (
            f"the family-wise rule withdrew the {short_name(c)} check's claim ({c.alone} alone{p})"
        )
    same = [c for c in deciding if c.verdict == r.verdict]
    if r.verdict != INCONCLUSIVE and len(same) == len(deciding) > 1:
        return f"every deciding check found {_found(r.verdict)}"
    shorts = [short_name(c) for c in deciding]
    names = {
        id(c): s if shorts.count(s) == 1 else c.name for c, s in zip(deciding, shorts, strict=True)
    }

    def said(c: Check) -> str:
        if c.verdict == INCONCLUSIVE:
            why = f": {c.reason}" if c.reason else ""
            return f"the {names[id(c)]} check is inconclusive{why}"
        return f"the {names[id(c)]} check found {_found(c.verdict or '')}"

    if r.verdict in (AS_PREDICTED, OPPOSITE, NO_DIFFERENCE, NOT_JUDGEABLE):
        return "; ".join(map(said, same))
    text = "; ".join(said(c) for c in deciding if c.verdict != AS_PREDICTED)
    agree = [c for c in deciding if c.verdict == AS_PREDICTED]
    if agree and r.prediction.combine == "all":
        text += f" ({r.prediction.id} needs every deciding check; " + "; ".join(map(said, agree))
        text += ")"
    return text


def _found(verdict: str) -> str:
    return {
        OPPOSITE: "the opposite",
        NO_DIFFERENCE: "no difference",
        NOT_JUDGEABLE: "that its condition did not occur",
        AS_PREDICTED: "what was predicted",
    }.get(verdict, verdict)


def verdict_of(p: Prediction, checks: Sequence[Check]) -> str:
    """The prediction's verdict from its deciding checks' verdicts (``stats.combine``)."""
    deciding = [c.verdict for c in checks if c.decides and c.verdict is not None]
    return combine(deciding, p.combine)


# ---------------------------------------------------------------- which cohorts


def submitted_failures(runs) -> float | None:
    """Rollouts of ``runs`` that ended as a submitted failure (the behaviour view), or None
    when no run logged the count."""
    return outcome_total(runs, "submitted_failure")


def outcome_total(runs, outcome: str) -> float | None:
    """Rollouts of ``runs`` that ended as ``outcome`` (the behaviour view), or None when no
    run logged the count."""
    total, seen = 0.0, False
    for run in runs:
        for prefix in qs.BEHAVIOUR:
            key = prefix + f"outcome/{outcome}"
            if run.has(key):
                total += float(np.nansum(run.column(key)))
                seen = True
                break
    return total if seen else None


def _bound_runs(ctx: Context) -> list[Run]:
    return [run for role in ctx.binding for run in ctx.arm(role).values()]


def three_outcome(ctx: Context) -> str | None:
    """Why a three-outcome prediction does not apply to this cohort (None: it does)."""
    runs = _bound_runs(ctx)
    if submitted_failures(runs) == 0:
        return "does not apply: two outcomes (no submitted failure in these arms)"
    if outcome_total(runs, "budget_failure") == 0:
        return "does not apply: two outcomes (no budget failure: nothing reached the cap in these arms)"
    return None


def group_size(run: Run) -> int | None:
    """The run's rollouts per group (the simulator's ``group_size``, Miles'
    ``n_samples_per_prompt``), or None when its config does not say."""
    for key in ("group_size", "n_samples_per_prompt"):
        try:
            return int(config_value(run, key))
        except (TypeError, ValueError):
            continue
    return None


def three_outcome_groups(ctx: Context) -> str | None:
    """``three_outcome``, and groups of more than one rollout: a baseline from the turn
    reached by the group's other members needs other members (P7 offline)."""
    if (why := three_outcome(ctx)) is not None:
        return why
    if any(group_size(run) == 1 for run in _bound_runs(ctx)):
        return (
            "does not apply: groups of one (no other member to take a turn-reached baseline from)"
        )
    return None


def two_outcome(ctx: Context) -> str | None:
    """Why the two-outcome control does not apply to this cohort (None: it does)."""
    n = submitted_failures(_bound_runs(ctx))
    if n is None:
        return "does not apply: the runs logged no outcome counts to tell two outcomes from three"
    if n > 0:
        return "does not apply: three outcomes (P3 and P4 judge these arms)"
    return None
