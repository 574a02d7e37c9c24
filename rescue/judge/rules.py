"""How each prediction is judged: the checks it makes on the arms bound to its roles.

Specification
-------------
One function per prediction (``p3``, ``control``, ``p4``, ``p5``, ``p6``, ``p7_online``,
``p7_offline``, ``pace``) returns its ``checks.Check``s, each a quantity compared between
two arms under a window rule (``windows``), with what it expects, whether it decides the
prediction, and its margin; the window texts the report prints live here beside them.
Which cohorts a prediction applies to is ``evaluation.three_outcome`` /
``evaluation.two_outcome``. The texts of the predictions (rule, falsifier, window,
margin) are ``predictions``.
"""

from __future__ import annotations

import numpy as np

from rescue.judge import checks as ck
from rescue.judge import offline
from rescue.judge import quantities as qs
from rescue.judge import windows as win
from rescue.judge.checks import Check
from rescue.judge.evaluation import Context
from rescue.judge.runs import Run
from rescue.judge.stats import NAN, slope

B_WINDOW = (
    "per seed, the steps at which each arm's prior b (b pooled over the "
    f"{qs.B_SMOOTH} steps before the step, which share no rollout with it) exceeds "
    f"{qs.B_THRESHOLD:g} and lies in the range of b both arms reached there (at least "
    f"{qs.MIN_MATCHED_STEPS} steps each, else the seed is left out; no seed left: not "
    "judgeable); the trend is the OLS slope of the per-step value on the prior b there. b is "
    "one functional for every arm: the realized all-members baseline, the mean reward of "
    "every trained rollout with budget failures scored 0 and masked ones included "
    "(`rollout/census/b_all`; its prior value is logged as `rollout/census/b_prior`)"
)
FINAL_WINDOW = (
    f"the last {qs.FINAL_FRACTION:.0%} of the steps both runs of a seed reached, counts pooled"
)
WHOLE_WINDOW = "every step both runs of a seed reached, counts pooled"
DRIFT_WINDOW = "OLS slope of the per-step value on the step over every step both runs reached"
#: Miles' per-sample non-generation (tool / sandbox) seconds; P6 reports it when logged.
SANDBOX_KEY = "perf/non_generation_time/mean"
#: The two-outcome control: the survivor arm's update norm over R = 0's is at or below
#: this (collapsed) ...
COLLAPSE_SUPPORTS = 0.1
#: ... and above this it kept its signal.
COLLAPSE_FALSIFIES = 0.5
CONTROL_MARGIN = (
    "half the R = 0 arm's mean trend in magnitude (P3's drift turns a falling cap-hit rate "
    "into a flat one: a difference the size of that trend; under half of it is not that drift)"
)


# ---------------------------------------------------------------- P3


#: How P3's control clause is read (``p3``; docs/judge.md, "P3's control clause"). The plan
#: defines the matched-update control (arm iii) as the mask's direction at R = 0's step
#: size, and writes its falsifier, the Phase-3 gate and "what would change our mind" as if
#: it were R = 0's direction at the mask's step size. A drift the mask's direction carries
#: (the subsidy) is reproduced by arm iii and not by the step-size control; one that comes
#: from step size, the other way round. So the clause "the control does not reproduce the
#: drift" is decided on the step-size control when it ran, and arm iii is reported beside
#: it as the direction check; without it, on arm iii as the plan's sentences are written.
STEP_CONTROL_NOTE = (
    "the control clause is read against the step-size control (`step-control`: R = 0's "
    "direction at the mask's update norm), which is what the plan's falsifier and gate "
    "describe; the matched control (arm iii: the mask's direction at R = 0's norm) is the "
    "direction check, reported: the subsidy predicts it reproduces the drift"
)
MATCHED_ONLY_NOTE = (
    "no step-size control (`step-control`) ran: the control clause is read against the "
    "matched control (arm iii), as the plan's sentences are written; arm iii keeps the mask's "
    "direction, so a drift the direction carries is reproduced by it and counted here against "
    "P3 (docs/judge.md, P3's control clause)"
)


def p3(ctx: Context) -> list[Check]:
    mask, zero = ctx.arm("mask"), ctx.arm("zero")
    out = [
        ck.compare(
            mask,
            zero,
            name=f"cap-hit trend against b at matched b, {ctx.label('mask')} − {ctx.label('zero')}",
            expects="higher",
            window=B_WINDOW,
            value=win.matched_b_trend("cap_hit"),
            unit="cap-hit rate per unit b",
            reads=("cap_hit", None),
        )
    ]
    # P3's control clause: the step-size control where the run has it, else arm iii as the
    # plan's sentences are written (docs/judge.md, "P3's control clause")
    ctl = next((a for a in ("step-control", "matched") if ctx.arm(a)), None)
    if ctl is not None:
        what = "the step-size control" if ctl == "step-control" else "the matched control"
        control = ck.compare(
            ctx.arm(ctl),
            mask,
            name=f"cap-hit trend against b at matched b, {ctx.label(ctl)} − "
            f"{ctx.label('mask')} ({what} does not reproduce the drift)",
            expects="lower",
            window=B_WINDOW,
            value=win.matched_b_trend("cap_hit"),
            unit="cap-hit rate per unit b",
        )
        control.notes.append(STEP_CONTROL_NOTE if ctl == "step-control" else MATCHED_ONLY_NOTE)
        out.append(control)
    if ctl == "step-control" and ctx.arm("matched"):
        out.append(
            ck.compare(
                ctx.arm("matched"),
                zero,
                name=f"cap-hit trend against b at matched b, {ctx.label('matched')} − "
                f"{ctx.label('zero')} (the direction check: the matched control keeps the "
                "mask's direction, and reproduces a drift the direction carries)",
                expects="higher",
                window=B_WINDOW,
                value=win.matched_b_trend("cap_hit"),
                decides=False,
                unit="cap-hit rate per unit b",
            )
        )
    out += [
        ck.compare(
            mask,
            zero,
            name=f"cap-hit rate at matched b, {ctx.label('mask')} − {ctx.label('zero')}",
            expects="higher",
            window=B_WINDOW.replace(
                "the trend is the OLS slope of the per-step value on the prior b there",
                f"the level is the per-step value averaged over {win.B_BIN:g}-wide bins of prior b "
                "both arms visit, each bin weighing the same",
            ),
            value=win.matched_b_level("cap_hit"),
            decides=False,
            unit="cap-hit rate",
        ),
        ck.compare(
            mask,
            zero,
            name="submitted-failure trend against b at matched b, "
            f"{ctx.label('mask')} − {ctx.label('zero')}",
            expects="lower",
            window=B_WINDOW,
            value=win.matched_b_trend("submitted_failure"),
            decides=False,
            unit="rate per unit b",
        ),
    ]
    return out


# ---------------------------------------------------------------- the two-outcome control


def _collapse(s: Run, z: Run) -> float:
    """The survivor run's mean update norm over the R = 0 run's (same seed)."""
    ns, nz = qs.series(s, "update_norm"), qs.series(z, "update_norm")
    stop = min(ns.last_step, nz.last_step)
    ref = nz.pooled(stop=stop)
    return ns.pooled(stop=stop) / ref if ref > 0 else NAN


def control(ctx: Context) -> list[Check]:
    mask, zero = ctx.arm("mask"), ctx.arm("zero")
    out = [
        ck.compare(
            mask,
            zero,
            name=f"cap-hit trend against b at matched b, {ctx.label('mask')} − {ctx.label('zero')} "
            "(no direction to drift in)",
            expects="same",
            window=B_WINDOW,
            value=win.matched_b_trend("cap_hit"),
            margin=ck.half_reference_trend,
            margin_text="half of |" + ctx.label("zero") + "'s mean trend|",
            unit="cap-hit rate per unit b",
        )
    ]
    if ctx.arm("survivor"):
        out.append(
            ck.per_seed(
                ctx.arm("survivor"),
                zero,
                name=f"update norm, {ctx.label('survivor')} / {ctx.label('zero')} (the "
                "survivors' signal collapses)",
                expects="at most",
                window="per seed, the mean update norm over every step both runs reached "
                "(`sim/update_norm`, or Miles' `train/rescue/update_norm`)",
                value=_collapse,
                supports=COLLAPSE_SUPPORTS,
                falsifies=COLLAPSE_FALSIFIES,
                unit="ratio of update norms",
            )
        )
    return out


# ---------------------------------------------------------------- P4


def _gap_growth(s: Run, m: Run) -> float:
    """Slope of the per-step cap-hit gap (survivor − mask) on the two arms' mean cap-hit
    rate pooled over the ``B_SMOOTH`` steps before (``quantities.prior``). The regressor
    shares no rollout with the gap it is compared with: with two arms that do not differ
    the slope is 0 in expectation, whatever each arm's noise (read off the same steps, the
    gap's noise and the mean's are correlated by the difference of the arms' variances)."""
    ss, sm = qs.series(s, "cap_hit"), qs.series(m, "cap_hit")
    stop = min(ss.last_step, sm.last_step)
    gap = ss.trailing(1, stop)[1] - sm.trailing(1, stop)[1]
    level = (qs.prior(ss, qs.B_SMOOTH, stop) + qs.prior(sm, qs.B_SMOOTH, stop)) / 2
    return slope(level, gap).value


def p4(ctx: Context) -> list[Check]:
    surv, mask = ctx.arm("survivor"), ctx.arm("mask")
    return [
        ck.compare(
            surv,
            mask,
            name=f"cap-hit drift per 100 steps, {ctx.label('survivor')} − {ctx.label('mask')}",
            expects="higher",
            window=DRIFT_WINDOW + ", per 100 steps",
            value=win.drift("cap_hit"),
            unit="per 100 steps",
            reads=("cap_hit", None),
        ),
        ck.per_seed(
            surv,
            mask,
            name=f"growth of the cap-hit gap ({ctx.label('survivor')} − {ctx.label('mask')}) "
            "with the two arms' mean cap-hit rate",
            expects="higher",
            window="per seed, the per-step gap of the cap-hit rates regressed on the mean of the "
            f"two arms' rates over the {qs.B_SMOOTH} steps before, over every step",
            value=_gap_growth,
            decides=False,
            unit="gap per unit cap-hit rate",
        ),
    ]


# ---------------------------------------------------------------- P5


#: What P5 is decided on: ``level`` (the outcome-conditioned turns of every generated
#: rollout over the whole run) or ``trend`` (their OLS slope on the step); the other is
#: reported. The level: at the same false-claim rate it finds a divergence that grows over
#: training more often than the trend does (bench/judge_calibration.py prints both), and
#: on every generated rollout it carries no selection: without learning (lr = 0) both read
#: no difference between drop and never-drop (tests/test_sim_judged.py).
P5_DECIDES = "level"


def p5(ctx: Context) -> list[Check]:
    drop, nd = ctx.arm("drop"), ctx.arm("never-drop")
    gen = qs.GENERATED
    vs = f"{ctx.label('drop')} − {ctx.label('never-drop')}"
    turns = (("turns_solved", "lower"), ("turns_failed", "higher"))
    level = [
        ck.compare(
            drop,
            nd,
            name=f"{qs.QUANTITIES[q].title} over the run, {vs}",
            expects=expects,
            window=WHOLE_WINDOW + "; every generated rollout",
            value=win.whole(q, sources=gen),
            decides=P5_DECIDES == "level",
            unit="turns",
            reads=(q, gen),
        )
        for q, expects in turns
    ]
    trend = [
        ck.compare(
            drop,
            nd,
            name=f"trend of the {qs.QUANTITIES[q].title} per 100 steps, {vs}",
            expects=expects,
            window=DRIFT_WINDOW + ", per 100 steps; every generated rollout",
            value=win.drift(q, sources=gen),
            decides=P5_DECIDES == "trend",
            unit="turns per 100 steps",
            reads=(q, gen),
        )
        for q, expects in turns
    ]
    out = level + trend if P5_DECIDES == "level" else trend + level
    out.append(
        ck.compare(
            drop,
            nd,
            name=f"trend of the test-run rate among successes per 100 steps, {vs}",
            expects="lower",
            window=DRIFT_WINDOW + ", per 100 steps; every generated rollout",
            value=win.drift("ran_tests_solved", sources=gen),
            decides=False,
            unit="rate per 100 steps",
        )
    )
    return out


# ---------------------------------------------------------------- P6


def _variance_check(
    a01: dict[int, Run], a05: dict[int, Run], nd: dict[int, Run], ctx: Context
) -> Check:
    from rescue.judge.stats import Estimate, variance_ratio

    check = Check(
        name=f"seed variance of final success, {ctx.label('protect-0.1')} / {ctx.label('protect-0.5')}",
        expects="higher",
        window=FINAL_WINDOW + " (each protect arm against its never-drop seed)",
        decides=False,
        unit="variance ratio",
    )
    vals = {}
    for label, arm in ((ctx.label("protect-0.1"), a01), (ctx.label("protect-0.5"), a05)):
        v = {}
        for s, run in arm.items():
            if s in nd:
                try:
                    v[s] = win.final("success")(run, nd[s])[0]
                except qs.MissingKey as e:
                    check.reason = str(e)
                    return check
        vals[label] = v
    check.values = vals
    x, y = (np.array(list(v.values())) for v in vals.values())
    ratio = variance_ratio(x, y)
    # Decide on the ratio − 1 (above 1: a = 0.1 noisier), report the ratio itself.
    shifted = Estimate(ratio.value - 1, ratio.lo - 1, ratio.hi - 1, ratio.n, ratio.dof)
    ck.judge_values(check, shifted)
    check.estimate = ratio
    check.notes.append("F interval on the two arms' seed variances (independent samples)")
    return check


def p6(ctx: Context) -> list[Check]:
    a05, nd = ctx.arm("protect-0.5"), ctx.arm("never-drop")
    vs = f"{ctx.label('protect-0.5')} − {ctx.label('never-drop')}"
    out = [
        ck.compare(
            a05,
            nd,
            name=f"final success, {vs} (within seed noise)",
            expects="same",
            window=FINAL_WINDOW + "; every generated rollout where logged",
            value=win.final("success"),
            margin_text=f"±1 seed SD of {ctx.label('never-drop')}",
            unit="success rate",
            reads=("success", None),
        ),
        ck.compare(
            a05,
            nd,
            name=f"wall-clock per unit of reward improvement, {vs}",
            expects=None,
            window=COST_WINDOW,
            value=win.cost_per_gain(win.clock_at),
            margin=None,
            decides=False,
            unit="clock units per unit of success",
        ),
    ]
    if any(r.has(SANDBOX_KEY) for r in (*a05.values(), *nd.values())):
        out.append(
            ck.compare(
                a05,
                nd,
                name=f"sandbox seconds per unit of reward improvement, {vs}",
                expects=None,
                window=COST_WINDOW + f"; sandbox seconds: `{SANDBOX_KEY}` (Miles' per-sample "
                "mean) times the rollouts of each step",
                value=win.cost_per_gain(win.sandbox_at),
                margin=None,
                decides=False,
                unit="s per unit of success",
            )
        )
    a01 = ctx.arm("protect-0.1")
    if a01:
        out.append(
            ck.compare(
                a01,
                nd,
                name=f"final success, {ctx.label('protect-0.1')} − {ctx.label('never-drop')}",
                expects="lower by m",
                window=FINAL_WINDOW,
                value=win.final("success"),
                decides=False,
                unit="success rate",
            )
        )
        out.append(_variance_check(a01, a05, nd, ctx))
    return out


COST_WINDOW = (
    "per seed, the clock at the last step both runs reached divided by the run's reward "
    "improvement (success over the last minus over the first "
    f"{qs.FINAL_FRACTION:.0%} of those steps); seeds without improvement left out"
)


# ---------------------------------------------------------------- P7


def p7_online(ctx: Context) -> list[Check]:
    turn, mask, zero = ctx.arm("turn"), ctx.arm("mask"), ctx.arm("zero")
    out = [
        ck.compare(
            turn,
            mask,
            name=f"final success, {ctx.label('turn')} − {ctx.label('mask')}",
            expects="not lower",
            window=FINAL_WINDOW + " (the same number of steps: matched compute)",
            value=win.final("success"),
            unit="success rate",
        )
    ]
    if zero:
        for q, title in (("cap_hit", "final cap-hit rate"), ("turns", "final episode length")):
            out.append(
                ck.compare(
                    turn,
                    zero,
                    name=f"{title}, {ctx.label('turn')} − {ctx.label('zero')} (tracks R = 0)",
                    expects="same",
                    window=FINAL_WINDOW,
                    value=win.final(q),
                    decides=False,
                )
            )
    return out


def p7_offline(ctx: Context) -> list[Check]:
    if ctx.replays or not ctx.binding:  # judged on the replay reports, not on a cohort
        return offline.p7_replay(ctx.replays)
    runs = ctx.arm("zero") or ctx.arm("never-drop")
    return offline.p7_sim(runs, label=ctx.binding.get("zero") or ctx.binding.get("never-drop"))


# ---------------------------------------------------------------- the reported comparison


def pace(ctx: Context) -> list[Check]:
    pace, a05 = ctx.arm("pace"), ctx.arm("protect-0.5")
    return [
        ck.compare(
            pace,
            a05,
            name=f"final success, {ctx.label('pace')} − {ctx.label('protect-0.5')}",
            expects=None,
            window=FINAL_WINDOW,
            value=win.final("success"),
            margin=None,
            unit="success rate",
        ),
        ck.compare(
            pace,
            a05,
            name=f"wall-clock to the last common step, {ctx.label('pace')} − {ctx.label('protect-0.5')}",
            expects=None,
            window="the clock at the last step both runs reached",
            value=win.clock,
            margin=None,
            unit="clock units",
        ),
    ]
