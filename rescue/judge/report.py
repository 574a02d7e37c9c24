"""The judgement of a set of runs, and its markdown and JSON forms.

Specification
-------------
``judge(runs, replays)`` groups the runs into cohorts (``runs.cohorts``: one family, cap,
setting, scenario and value of every compared setting), judges every prediction on each
cohort, then the replay-based ones (P1, P2, P7 offline) once on the replay reports when
some were read (without any, the report has no offline section); every prediction of a
cohort appears, ``not run`` with the arms it needs, named as that cohort's runs name them,
when they are missing.
Then the family-wise rule (``family``: Holm over the report's deciding checks) adjusts
the verdicts. ``markdown`` opens with the rule and what it did, and with every collision
(two runs of one arm and seed in one cohort; the first read is kept), then gives per
cohort a verdict table (the verdict under the rule, and each prediction's verdict alone)
and one section per prediction: the rule, what falsifies it, the window and margin, each
check's estimate with its interval, its verdict alone and under the rule, and what the
result depends on. ``as_json`` is the same content as data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rescue.judge.checks import Check
from rescue.judge.evaluation import Prediction, Result, evaluate, verdict_reason
from rescue.judge.family import Family, holm
from rescue.judge.offline import Report
from rescue.judge.predictions import PREDICTIONS
from rescue.judge.runs import Cohort, CohortKey, Run, cohorts
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
    #: The simulator scenario (None: none named).
    scenario: str | None = None
    #: The compared settings on which the runs read together differed, with this cohort's values.
    differs: tuple[tuple[str, str], ...] = ()

    @property
    def title(self) -> str:
        cap = f", cap {self.cap}" if self.cap is not None else ""
        setting = f", {self.setting}" if self.setting else ""
        scenario = f", scenario {self.scenario}" if self.scenario else ""
        differs = "".join(f", {k} = {v}" for k, v in self.differs)
        return f"{self.family} runs{scenario}{cap}{setting}{differs}"

    @property
    def stem(self) -> str:
        """The prefix of the cohort's files: ``<family>[-<scenario>][-cap<CAP>][-<setting>]``
        (and ``-<setting name><value>`` per differing compared setting)."""
        cap = f"-cap{self.cap}" if self.cap is not None else ""
        out = self.family + (f"-{self.scenario}" if self.scenario else "") + cap
        out += f"-{self.setting}" if self.setting else ""
        for k, v in self.differs:
            out += "-" + "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in f"{k}{v}")
        return out


@dataclass
class Judgement:
    """Every cohort's results, the replay-based results, notes on the inputs, the
    collisions (runs of one arm and seed read twice into a cohort) and the family-wise rule."""

    cohorts: list[CohortJudgement]
    offline: list[Result]
    notes: list[str] = field(default_factory=list)
    collisions: list[str] = field(default_factory=list)
    family: Family | None = None

    def results(self) -> list[Result]:
        return [r for c in self.cohorts for r in c.results] + list(self.offline)


def judge(
    runs: Sequence[Run],
    replays: Sequence[Report] = (),
    predictions: Sequence[Prediction] = PREDICTIONS,
    notes: Sequence[str] = (),
) -> Judgement:
    """Judge ``predictions`` on every cohort of ``runs`` and on the ``replays``, then apply
    the family-wise rule over all of them."""
    grouped, collisions = cohorts(runs)
    out = []
    for key, arms in sorted(grouped.items(), key=lambda kv: kv[0].sort_key()):
        out.append(_cohort(key, arms, evaluate(predictions, arms)))
    off = evaluate(predictions, None, replays) if replays else []
    j = Judgement(out, off, list(notes), collisions)
    j.family = holm(j.results())
    return j


def _cohort(key: CohortKey, arms: Cohort, results: list[Result]) -> CohortJudgement:
    return CohortJudgement(
        key.family, key.cap, arms, results, key.setting, key.scenario, key.differs
    )


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
    if e.exact:
        return f"{fmt(e.value)}, the same in every replicate (n={e.n})"
    return f"{fmt(e.value)} [{fmt(e.lo)}, {fmt(e.hi)}] (n={e.n})"


def _verdicts(c: Check) -> str:
    """A check's verdict, with the one it had alone when the family-wise rule changed it."""
    if c.verdict is None:
        return "—"
    if c.alone is not None and c.alone != c.verdict:
        return f"{c.verdict} (alone: {c.alone}, p = {fmt(c.p)})"
    return c.verdict + (f" (p = {fmt(c.p)})" if c.decides and math.isfinite(c.p) else "")


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
    if r.verdict and r.checks:
        lines += [f"Verdict: **{r.verdict}**, because {verdict_reason(r)}.", ""]
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
                f"| {_verdicts(c)} | {c.reason} |"
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
    """One row per result: the verdict under the family-wise rule, and alone."""
    lines = ["| prediction | arms | verdict | alone |", "|---|---|---|---|"]
    for r in results:
        arms = ", ".join(v for v in r.binding.values() if v) or "—"
        verdict = r.verdict or r.note or "reported"
        if not r.binding and r.note.startswith("not run"):
            verdict = r.note  # its arms are missing: say which, not "inconclusive"
        alone = r.alone if verdict == r.verdict else "—"
        lines.append(f"| {r.prediction.id} | {arms} | {verdict} | {alone} |")
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
    "judged and reported beside it, each alone (not adjusted for the others). Verdicts: as "
    "predicted, opposite, no difference (the interval inside the margin), inconclusive, not "
    "judgeable (the condition the prediction is about did not occur). A prediction that "
    "holds only for some cohorts says where it does not apply. The verdict column is the "
    "verdict under the family-wise rule below; `alone` is the prediction's verdict with "
    f"each of its checks at {LEVEL:.0%}."
)


def header(j: Judgement) -> list[str]:
    """The family-wise rule and the collisions, for the top of a report."""
    lines = [*(j.family.lines() if j.family else []), ""]
    if j.collisions:
        lines += [
            f"**Collisions: {len(j.collisions)} run(s) of an arm and seed already read into "
            "the same cohort were skipped** (the first read is judged); check that the inputs "
            "are not two copies of one run, or two runs that should be told apart by a tag "
            "(`scenario:`) or a setting:",
            "",
            *(f"- {n}" for n in j.collisions),
            "",
        ]
    return lines


def markdown(j: Judgement) -> str:
    """The whole report."""
    lines = ["# rescue report", "", PREAMBLE, "", *header(j)]
    for c in j.cohorts:
        arms = ", ".join(
            f"`{label}` ({len(seeds)} seeds)" for label, seeds in sorted(c.arms.items())
        )
        lines += [f"## {c.title}", "", f"Arms: {arms}.", "", *summary_table(c.results), ""]
        for r in c.results:
            lines += result_markdown(r)
    if j.offline:
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
            "family_wise": {
                "rule": "holm",
                "alpha": 1 - LEVEL,
                "size": j.family.size if j.family else 0,
                "claims": j.family.claims if j.family else 0,
                "kept": j.family.kept if j.family else 0,
                "withdrawn": list(j.family.withdrawn) if j.family else [],
            },
            "collisions": list(j.collisions),
            "cohorts": [
                {
                    "family": c.family,
                    "cap": c.cap,
                    "setting": c.setting,
                    "scenario": c.scenario,
                    "differs": dict(c.differs),
                    "arms": {label: sorted(seeds) for label, seeds in c.arms.items()},
                    "results": [r.as_dict() for r in c.results],
                }
                for c in j.cohorts
            ],
            "offline": [r.as_dict() for r in j.offline],
            "notes": list(j.notes),
        }
    )
