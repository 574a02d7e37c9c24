"""The offline predictions: P1 and P2 from replayed gradients, P7 from advantage variances.

Specification
-------------
Inputs are the JSON reports of ``rescue replay`` (``--json``), recognised by their keys:
``gradients`` (``rollouts``, ``parameters``, ``buckets``; optionally ``check``), a
``--check-only`` report (``prompts``, ``max_residual``, ``rtol``) and ``advantages``
(``steps``, ``total``, ``arms``). The simulator's own P7 figures are the per-run
``p7`` variances of its ``runs.json``.

- P1: every report's two-outcome check within its tolerance. ``rescue replay gradients``
  stops with ``IdentityCheckFailed`` when the check fails, so a failure reaches the judge
  only from a report written some other way.
- P2: one replicate per gradients report (a task subset): the cosine of (b) − (a) with
  ∇P(cap) in bucket ``all``; the norm of (b) − (a) against the report's ``baseline_paid``.
- P7: the reduction ``1 − Var(turn-reached) / Var(reference)``. Decided against the
  leave-one-out mean, the reference on the scale of the plan's ``Var(E[R | ℓ]) / Var(R)``
  (the group mean that includes the rollout's own reward scales that advantage by
  ``(G − 1)/G`` and its variance by the square, 0.766 at G = 8: against it the
  turn-reached baseline would have to cut 31% of the leave-one-out variance merely to
  avoid ``opposite``); the group-mean reduction is reported. Replicates:
  each dumped step (replay) or each seed (simulator). ``P7_SUPPORTS`` / ``P7_FALSIFIES`` are the
  prediction's thresholds, and ``p7_verdict`` their rule on one number; the replay's
  report calls it (one rule, here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rescue.judge.checks import Check, judge_values
from rescue.judge.runs import Run
from rescue.judge.stats import (
    AS_PREDICTED,
    INCONCLUSIVE,
    NAN,
    OPPOSITE,
    Estimate,
    slope,
    t_interval,
    threshold_verdict,
)

#: P7 offline: a reduction of at least this supports the prediction ...
P7_SUPPORTS = 0.20
#: ... and one below this falsifies it.
P7_FALSIFIES = 0.10
#: P2: the cosine the difference must exceed.
P2_COSINE = 0.5
#: P2: a cosine interval inside ±this is isotropic (no preferred direction).
P2_ISOTROPY = 0.1
#: P2: a norm slope within ±this × mean norm / mean b is flat in b.
P2_FLAT = 0.25

KINDS = ("gradients", "check", "advantages")


@dataclass
class Report:
    """One ``rescue replay ... --json`` report."""

    kind: str
    data: dict[str, Any]
    source: str = ""


def report_kind(data: Any) -> str | None:
    """Which replay report ``data`` is (``KINDS``), or None."""
    if not isinstance(data, Mapping):
        return None
    if {"rollouts", "parameters", "buckets"} <= data.keys():
        return "gradients"
    if {"prompts", "max_residual", "rtol"} <= data.keys():
        return "check"
    total = data.get("total")
    if {"steps", "arms"} <= data.keys() and isinstance(total, Mapping) and "var_e" in total:
        return "advantages"
    return None


def p7_verdict(reduction: float) -> str:
    """P7 offline on one number: ``as predicted`` at or above ``P7_SUPPORTS``, ``opposite``
    below ``P7_FALSIFIES``, else ``inconclusive``."""
    return threshold_verdict(reduction, supports=P7_SUPPORTS, falsifies=P7_FALSIFIES)


def _p7_check(name: str, values: dict[Any, float], *, decides: bool, window: str) -> Check:
    check = Check(
        name=name,
        expects="at least",
        window=window,
        decides=decides,
        margin_text=f"thresholds {P7_SUPPORTS:.0%} / {P7_FALSIFIES:.0%}",
        values={"reduction": values},
        unit="share of the variance",
    )
    return judge_values(
        check, t_interval(list(values.values())), supports=P7_SUPPORTS, falsifies=P7_FALSIFIES
    )


def p7_sim(runs: Mapping[int, Run], label: str | None = None) -> list[Check]:
    """P7 offline from the simulator's per-seed variances of the R = 0 arm."""
    window = f"each seed's trained batches of {label or 'the R = 0 arm'}, the whole run"
    figures = {s: r.offline.get("p7") for s, r in runs.items()}
    figures = {s: f for s, f in figures.items() if f}
    if not figures:
        check = Check(
            name="reduction vs the leave-one-out mean",
            expects="at least",
            window=window,
        )
        check.reason = (
            "no offline variances: the simulator's runs.json (p7) for the R = 0 arm, or "
            "`rescue replay advantages --json` reports of the dumps"
        )
        return [check]
    red = {
        s: 1 - f["turn_reached"] / f["group_mean"] for s, f in figures.items() if f["group_mean"]
    }
    loo = {
        s: 1 - f["turn_reached"] / f["leave_one_out"]
        for s, f in figures.items()
        if f["leave_one_out"]
    }
    return [
        _p7_check("reduction vs the leave-one-out mean", loo, decides=True, window=window),
        _p7_check("reduction vs the group mean", red, decides=False, window=window),
    ]


def p7_replay(reports: Sequence[Report]) -> list[Check]:
    """P7 offline from ``rescue replay advantages`` reports, one replicate per dumped step."""
    window = "each dumped step of every `rescue replay advantages` report"
    red: dict[str, float] = {}
    loo: dict[str, float] = {}
    for i, r in enumerate(x for x in reports if x.kind == "advantages"):
        for st in r.data["steps"]:
            key = f"{i}:{st.get('step')}"
            red[key] = float(st.get("reduction", NAN))
            loo[key] = float(st.get("reduction_vs_loo", NAN))
    if not red:
        check = Check(name="reduction vs the leave-one-out mean", expects="at least", window=window)
        check.reason = "no `rescue replay advantages --json` report given"
        return [check]
    return [
        _p7_check("reduction vs the leave-one-out mean", loo, decides=True, window=window),
        _p7_check("reduction vs the group mean", red, decides=False, window=window),
    ]


def p1(reports: Sequence[Report]) -> list[Check]:
    """P1: the two-outcome check of every gradients / check-only report."""
    check = Check(
        name="two-outcome identity, largest relative residual over prompts",
        expects="at most rtol",
        window="every prompt of every report",
        unit="relative residual",
    )
    found = []
    for r in reports:
        c = r.data.get("check") if r.kind == "gradients" else r.data if r.kind == "check" else None
        if c:
            found.append((r.source, float(c["max_residual"]), float(c["rtol"]), int(c["prompts"])))
    if not found:
        check.verdict = INCONCLUSIVE
        check.reason = "no two-outcome check: needs `rescue replay gradients --json` reports run with the check"
        return [check]
    check.values = {"max residual": {src: res for src, res, _, _ in found}}
    worst = max(found, key=lambda f: f[1] / f[2])
    check.estimate = Estimate(worst[1], NAN, NAN, len(found), 0)
    check.margin, check.margin_text = worst[2], "rtol of the report"
    bad = [f for f in found if not f[1] <= f[2]]
    if bad:
        check.verdict = OPPOSITE
        check.reason = f"{len(bad)} report(s) above their tolerance, e.g. {bad[0][0]}: {bad[0][1]:.3g} > {bad[0][2]:.1g}"
    else:
        check.verdict = AS_PREDICTED
        check.reason = (
            f"{sum(f[3] for f in found)} prompts in {len(found)} report(s) within tolerance"
        )
    return [check]


def _all_bucket(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((b for b in data.get("buckets", []) if b.get("bucket") == "all"), None)


def p2(reports: Sequence[Report]) -> list[Check]:
    """P2: cosine of the masking term with ∇P(cap), and its norm against b, across subsets."""
    cos, norm, b = {}, {}, {}
    for r in reports:
        if r.kind != "gradients":
            continue
        bucket = _all_bucket(r.data)
        if bucket is None:
            continue
        d = bucket["b_minus_a"]
        cos[r.source] = float(d.get("cos_cap", NAN))
        norm[r.source] = float(d.get("norm", NAN))
        b[r.source] = float(r.data.get("baseline_paid", NAN))
    window = "one replicate per `rescue replay gradients` report (a task subset), bucket `all`"
    c1 = Check(
        name="cosine of (b) − (a) with ∇P(cap)",
        expects="cosine",
        window=window,
        values={"cosine": cos},
        margin_text=f"±{P2_ISOTROPY:g}: isotropic",
    )
    c2 = Check(
        name="slope of |(b) − (a)| on the baseline paid b",
        expects="higher",
        window=window + ", OLS on n − 2 dof",
        values={"norm": norm, "b": b},
        unit="norm per unit b",
    )
    if not cos:
        for c in (c1, c2):
            c.reason = "no `rescue replay gradients --json` report given"
        return [c1, c2]
    judge_values(c1, t_interval(list(cos.values())), margin=P2_ISOTROPY, supports=P2_COSINE)
    keys = [k for k in norm if np.isfinite(norm[k]) and np.isfinite(b[k])]
    x = np.array([b[k] for k in keys])
    y = np.array([norm[k] for k in keys])
    est = slope(x, y)
    flat = P2_FLAT * float(y.mean() / x.mean()) if keys and x.mean() > 0 else NAN
    c2.margin_text = f"±{P2_FLAT:g} × mean norm / mean b: flat"
    # A regression on n points has n − 2 dof: it needs one point more than a mean.
    judge_values(c2, est, margin=flat, min_n=3)
    return [c1, c2]
