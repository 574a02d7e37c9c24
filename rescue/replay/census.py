"""The outcome census of dumped rollouts, per step and in total, and its dominant regime.

Specification
-------------
Each step's rollouts (trajectories, ``rescue.replay.dumps``) go through
``rescue.census.outcome_metrics``, the same function the live census uses, once per step and
once over all steps. The non-solved mass (submitted failures, budget failures,
infrastructure no-results) is then split by regime, because the regime decides which
ground truth applies:

``budget``          budget failures outnumber infrastructure no-results: the reward is known
                    (0), so scoring R = 0 and keeping the rollout is exact;
``infrastructure``  infrastructure no-results outnumber budget failures: no reward exists,
                    so only never-drop or protect with 1/a weights is unbiased;
``tie`` / ``none``  equal counts / neither occurs.

The report's wording follows the shares, not the label alone: the larger of the two
*dominates* the non-solved mass only when it is more than half of it; otherwise the line
says it outnumbers the other and names the largest part (often submitted failures).

A debug dump holds only what reached training: aborted and stale-dropped groups are not
in it (the live census, ``rollout/census/*``, counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rescue.census import outcome_metrics
from rescue.outcomes import Outcome
from rescue.replay.dumps import Dump

PREFIX = ""


def dominant_regime(metrics: dict[str, float], prefix: str = PREFIX) -> dict[str, Any]:
    """Shares of the non-solved mass and which regime dominates it (module docstring)."""
    n = metrics.get(f"{prefix}rollouts", 0.0)
    count = {o: metrics.get(f"{prefix}outcome/{o.value}", 0.0) for o in Outcome}
    unsolved = n - count[Outcome.SOLVED]
    budget, infra = count[Outcome.BUDGET_FAILURE], count[Outcome.INFRA_NO_RESULT]
    if budget == infra:
        regime = "none" if budget == 0 else "tie"
    else:
        regime = "budget" if budget > infra else "infrastructure"

    def share(x: float) -> float:
        return x / unsolved if unsolved else float("nan")

    return {
        "unsolved": unsolved,
        "budget_share": share(budget),
        "infra_share": share(infra),
        "submitted_share": share(count[Outcome.SUBMITTED_FAILURE]),
        "regime": regime,
    }


_NAMES = {
    "budget": "budget failures",
    "infra": "infrastructure no-results",
    "submitted": "submitted failures",
}


def regime_line(r: dict[str, Any]) -> str:
    """The report's line on the regime, its verb derived from the shares (module docstring)."""
    if r["regime"] == "none":
        return "regime: none; no budget failure and no infrastructure no-result in these dumps"
    shares = {k: r[f"{k}_share"] for k in _NAMES}
    detail = ", ".join(f"{_NAMES[k]} {v:.1%}" for k, v in shares.items())
    mass = f"the non-solved mass ({int(r['unsolved'])} rollouts)"
    if r["regime"] == "tie":
        return f"regime: tie; budget failures and infrastructure no-results are equal in {mass}: {detail}"
    lead, other = ("budget", "infra") if r["regime"] == "budget" else ("infra", "budget")
    if shares[lead] > 0.5:
        return f"regime: {r['regime']}; {_NAMES[lead]} dominate {mass}: {detail}"
    largest = max(shares, key=lambda k: shares[k])
    return (
        f"regime: {r['regime']}; {_NAMES[lead]} outnumber {_NAMES[other]} but are "
        f"{shares[lead]:.1%} of {mass}, whose largest part is {_NAMES[largest]}: {detail}"
    )


def census_report(dumps: Sequence[Dump]) -> dict[str, Any]:
    """``{"steps": [{"step", "path", "metrics", "regime"}...], "total": {...}}``."""
    steps, everything = [], []
    for d in dumps:
        records = [t.record for t in d.trajectories]
        everything.extend(records)
        m = outcome_metrics(records, prefix=PREFIX)
        steps.append(
            {
                "step": d.step,
                "path": d.path,
                "samples": len(d.samples),
                "metrics": m,
                "regime": dominant_regime(m),
            }
        )
    total = outcome_metrics(everything, prefix=PREFIX)
    return {"steps": steps, "total": {"metrics": total, "regime": dominant_regime(total)}}


def _line(label: str, m: dict[str, float]) -> str:
    n = int(m.get("rollouts", 0))
    parts = [f"{label:>10} {n:6d}"]
    for o in Outcome:
        parts.append(
            f"{int(m.get(f'outcome/{o.value}', 0)):6d} ({m.get(f'outcome/{o.value}_rate', 0.0):5.1%})"
        )
    parts.append(f"{m.get('cap_hit_rate', 0.0):6.1%}")
    b = m.get("b_realized")
    parts.append(f"{b:8.3f}" if b is not None else f"{'-':>8}")
    return "  ".join(parts)


def format_report(report: dict[str, Any]) -> str:
    """The census as a text table, one line per step and a total, then the regime verdict."""
    head = "  ".join(
        [
            f"{'step':>10} {'n':>6}",
            *(f"{o.value[:14]:>14}" for o in Outcome),
            f"{'capped':>6}",
            f"{'b':>8}",
        ]
    )
    lines = [head]
    lines += [_line(str(s["step"]), s["metrics"]) for s in report["steps"]]
    total = report["total"]
    lines.append(_line("total", total["metrics"]))
    m = total["metrics"]
    lines.append("")
    lines.append("turns (mean / p50 / p90) by outcome:")
    for o in Outcome:
        if f"turns_mean/{o.value}" in m:
            lines.append(
                f"  {o.value:<18} {m[f'turns_mean/{o.value}']:7.1f} {m[f'turns_p50/{o.value}']:7.1f} "
                f"{m[f'turns_p90/{o.value}']:7.1f}"
            )
    lines.append("")
    lines.append(regime_line(total["regime"]))
    lines.append(
        "note: a dump holds only rollouts that reached training; aborted and stale-dropped "
        "groups are counted by the live census (rollout/census/*)"
    )
    return "\n".join(lines)
