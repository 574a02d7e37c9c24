"""The judgement of a set of runs, and its markdown and JSON forms.

Specification
-------------
``judge(runs, replays)`` groups the runs into cohorts (same family and cap), judges
every prediction on each cohort, then the replay-based ones (P1, P2, P7 offline) once on
the replay reports; every prediction appears, ``not run`` with the arms or reports it
needs when they are missing. ``markdown`` gives one section per prediction: the rule,
what falsifies it, the window and margin, each check's estimate with its interval and
verdict, and what the result depends on. ``as_json`` is the same content as data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rescue.judge.checks import Check
from rescue.judge.evaluation import Prediction, Result, evaluate
from rescue.judge.offline import Report
from rescue.judge.predictions import PREDICTIONS
from rescue.judge.runs import Cohort, Run, cohorts
from rescue.judge.stats import LEVEL, MIN_SEEDS


@dataclass
class CohortJudgement:
    """The predictions judged on one cohort of runs."""

    family: str
    cap: int | None
    arms: Cohort
    results: list[Result]
    #: ``est-turn``, ``drgrpo`` or both (``runs.Condition.setting``); None: the default.
    setting: str | None = None

    @property
    def title(self) -> str:
        cap = f", cap {self.cap}" if self.cap is not None else ""
        setting = f", {self.setting}" if self.setting else ""
        return f"{self.family} runs{cap}{setting}"

    @property
    def stem(self) -> str:
        """The prefix of the cohort's files: ``<family>[-cap<CAP>][-<setting>]``."""
        cap = f"-cap{self.cap}" if self.cap is not None else ""
        return self.family + cap + (f"-{self.setting}" if self.setting else "")


@dataclass
class Judgement:
    """Every cohort's results, the replay-based results, and notes on the inputs."""

    cohorts: list[CohortJudgement]
    offline: list[Result]
    notes: list[str] = field(default_factory=list)

    def results(self) -> list[Result]:
        return [r for c in self.cohorts for r in c.results] + list(self.offline)


def judge(
    runs: Sequence[Run],
    replays: Sequence[Report] = (),
    predictions: Sequence[Prediction] = PREDICTIONS,
    notes: Sequence[str] = (),
) -> Judgement:
    """Judge ``predictions`` on every cohort of ``runs`` and on the ``replays``."""
    grouped, dup_notes = cohorts(runs)
    out = []
    order = sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2] or ""))
    for (family, cap, setting), arms in order:
        out.append(CohortJudgement(family, cap, arms, evaluate(predictions, arms), setting))
    off = evaluate(predictions, None, replays)
    return Judgement(out, off, [*notes, *dup_notes])


# ---------------------------------------------------------------- formatting


def fmt(x: float | None, digits: int = 3) -> str:
    """A number with ``digits`` significant digits; ``n/a`` for NaN / None."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def interval(check: Check) -> str:
    e = check.estimate
    if e is None:
        return "n/a"
    if not e.finite:
        return f"{fmt(e.value)} (n={e.n})"
    return f"{fmt(e.value)} [{fmt(e.lo)}, {fmt(e.hi)}] (n={e.n})"


def _seeds(check: Check) -> str:
    parts = []
    for label, vals in check.values.items():
        if vals:
            parts.append(f"{label}: " + ", ".join(f"{s}={fmt(v)}" for s, v in vals.items()))
    return "; ".join(parts)


def result_markdown(r: Result, level: int = 3) -> list[str]:
    """One prediction's section."""
    p = r.prediction
    verdict = f" — **{r.verdict}**" if r.verdict else ""
    lines = ["#" * level + f" {p.id}: {p.title}{verdict}", ""]
    lines.append(("Rule: " if p.prediction else "What: ") + p.rule)
    lines.append("")
    if p.prediction:
        lines += [f"Falsified if: {p.falsified}", ""]
    lines += [f"Window: {p.window}.", "", f"Margin: {p.margin}.", ""]
    bound = {k: v for k, v in r.binding.items() if v}
    if bound:
        lines += ["Arms: " + ", ".join(f"{k} = `{v}`" for k, v in bound.items()) + ".", ""]
    if r.note:
        lines += [r.note[0].upper() + r.note[1:] + ".", ""]
    if r.checks:
        lines += [
            f"| check | decides | expects | estimate [{LEVEL:.0%} interval] | margin | verdict | why |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in r.checks:
            lines.append(
                f"| {c.name} | {'yes' if c.decides else 'no'} | {c.expects or '—'} | {interval(c)} "
                f"| {fmt(c.margin)}{' (' + c.margin_text + ')' if c.margin_text else ''} "
                f"| {c.verdict or '—'} | {c.reason} |"
            )
        lines.append("")
        for c in r.checks:
            extra = [_seeds(c), *c.notes]
            extra = [e for e in extra if e]
            if extra:
                lines.append(f"- {c.name}: " + "; ".join(extra) + ".")
        lines.append("")
    lines += [f"Depends on: {p.depends}.", ""]
    return lines


def summary_table(results: Sequence[Result]) -> list[str]:
    lines = ["| prediction | arms | verdict |", "|---|---|---|"]
    for r in results:
        arms = ", ".join(v for v in r.binding.values() if v) or "—"
        lines.append(f"| {r.prediction.id} | {arms} | {r.verdict or r.note or 'reported'} |")
    return lines


def predictions_markdown(results: Sequence[Result], level: int = 3) -> str:
    """The sections of a list of results (the simulator's summary uses this)."""
    lines: list[str] = []
    for r in results:
        lines += result_markdown(r, level)
    return "\n".join(lines)


PREAMBLE = (
    "Each prediction is judged by its pre-registered rule, whichever way the runs came out. "
    f"Comparisons are paired by seed; intervals are two-sided {LEVEL:.0%} t intervals on n − 1 "
    f"degrees of freedom; fewer than {MIN_SEEDS} paired seeds decide nothing (inconclusive). "
    "A check that `decides` carries the prediction's falsification rule; the others are "
    "judged and reported beside it. Verdicts: as predicted, opposite, no difference "
    "(the interval inside the margin), inconclusive."
)


def markdown(j: Judgement) -> str:
    """The whole report."""
    lines = ["# rescue report", "", PREAMBLE, ""]
    for c in j.cohorts:
        arms = ", ".join(
            f"`{label}` ({len(seeds)} seeds)" for label, seeds in sorted(c.arms.items())
        )
        lines += [f"## {c.title}", "", f"Arms: {arms}.", "", *summary_table(c.results), ""]
        for r in c.results:
            lines += result_markdown(r)
    lines += ["## offline replay", "", *summary_table(j.offline), ""]
    for r in j.offline:
        lines += result_markdown(r)
    if j.notes:
        lines += ["## inputs", "", *(f"- {n}" for n in j.notes), ""]
    return "\n".join(lines)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def as_json(j: Judgement) -> dict[str, Any]:
    """The report as JSON-ready data (NaN as null)."""
    return _clean(
        {
            "level": LEVEL,
            "min_seeds": MIN_SEEDS,
            "cohorts": [
                {
                    "family": c.family,
                    "cap": c.cap,
                    "setting": c.setting,
                    "arms": {label: sorted(seeds) for label, seeds in c.arms.items()},
                    "results": [r.as_dict() for r in c.results],
                }
                for c in j.cohorts
            ],
            "offline": [r.as_dict() for r in j.offline],
            "notes": list(j.notes),
        }
    )
