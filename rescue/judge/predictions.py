"""The pre-registered predictions P1-P7, each once: quantity, arms, rule, window, margin.

Specification
-------------
Each ``Prediction`` states, in this project's words, the rule of the research plan's
prediction it cites, what falsifies it, its window and its margin (fixed in
``quantities`` / ``checks`` before any run is read), and what it depends on. The checks
that carry the falsification rule decide the verdict (``evaluation``); the other checks
are part of the prediction and are judged and reported beside it.

P1, P2 and the replay half of P7 read ``rescue replay`` reports (``offline``); the rest
read the runs of one cohort. The comparison of protect a = 0.5 with pace is reported, not
predicted: it has no verdict, only its intervals, and appears when both arms ran.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rescue.judge import checks as ck
from rescue.judge import offline
from rescue.judge import quantities as qs
from rescue.judge.checks import Check
from rescue.judge.evaluation import Context, Prediction, Role
from rescue.judge.runs import Run
from rescue.judge.stats import slope

B_WINDOW = (
    f"per run, from the first step at which its b (pooled over the trailing {qs.B_SMOOTH} "
    f"steps) exceeds {qs.B_THRESHOLD:g} to the last step both runs reached; the trend is the "
    "OLS slope of the per-step value on the per-step b there. b is the baseline paid to "
    "loss-masked rollouts (`rollout/census/b_paid/masked`) for arms that mask, the realized "
    "baseline (`rollout/census/b_realized`) for arms that mask nothing"
)
FINAL_WINDOW = (
    f"the last {qs.FINAL_FRACTION:.0%} of the steps both runs of a seed reached, counts pooled"
)
WHOLE_WINDOW = "every step both runs of a seed reached, counts pooled"
#: Miles' per-sample non-generation (tool / sandbox) seconds; P6 reports it when logged.
SANDBOX_KEY = "perf/non_generation_time/mean"


# ---------------------------------------------------------------- P3


def _p3(ctx: Context) -> list[Check]:
    mask, zero = ctx.arm("mask"), ctx.arm("zero")
    out = [
        ck.compare(
            mask,
            zero,
            name=f"cap-hit trend against b, {ctx.label('mask')} − {ctx.label('zero')}",
            expects="higher",
            window=B_WINDOW,
            value=ck.trend_after_b("cap_hit"),
            unit="cap-hit rate per unit b",
        )
    ]
    if ctx.arm("matched"):
        out.append(
            ck.compare(
                ctx.arm("matched"),
                mask,
                name=f"cap-hit trend against b, {ctx.label('matched')} − {ctx.label('mask')} "
                "(the matched control does not reproduce the drift)",
                expects="lower",
                window=B_WINDOW,
                value=ck.trend_after_b("cap_hit"),
                unit="cap-hit rate per unit b",
            )
        )
    out.append(
        ck.compare(
            mask,
            zero,
            name=f"submitted-failure trend against b, {ctx.label('mask')} − {ctx.label('zero')}",
            expects="lower",
            window=B_WINDOW,
            value=ck.trend_after_b("submitted_failure"),
            decides=False,
            unit="rate per unit b",
        )
    )
    return out


# ---------------------------------------------------------------- P4


def _gap_growth(s: Run, m: Run) -> float:
    """Slope of the cap-hit gap (survivor − mask) on the mask arm's cap-hit rate."""
    ss, sm = qs.series(s, "cap_hit"), qs.series(m, "cap_hit")
    stop = min(ss.last_step, sm.last_step)
    _, ys = ss.trailing(qs.B_SMOOTH, stop)
    _, ym = sm.trailing(qs.B_SMOOTH, stop)
    return slope(ym, ys - ym).value


def _p4(ctx: Context) -> list[Check]:
    surv, mask = ctx.arm("survivor"), ctx.arm("mask")
    return [
        ck.compare(
            surv,
            mask,
            name=f"cap-hit drift per 100 steps, {ctx.label('survivor')} − {ctx.label('mask')}",
            expects="higher",
            window="OLS slope of the per-step cap-hit rate on the step, " + WHOLE_WINDOW,
            value=ck.drift("cap_hit"),
            unit="per 100 steps",
        ),
        ck.per_seed(
            surv,
            mask,
            name=f"growth of the cap-hit gap ({ctx.label('survivor')} − {ctx.label('mask')}) "
            f"with {ctx.label('mask')}'s cap-hit rate",
            expects="higher",
            window=f"per seed, the gap of the cap-hit rates pooled over the trailing {qs.B_SMOOTH} "
            "steps, regressed on the mask arm's rate over every step",
            value=_gap_growth,
            decides=False,
            unit="gap per unit cap-hit rate",
        ),
    ]


# ---------------------------------------------------------------- P5


def _p5(ctx: Context) -> list[Check]:
    drop, nd = ctx.arm("drop"), ctx.arm("never-drop")
    rows = (
        ("turns_solved", "lower", True, "turns"),
        ("turns_failed", "higher", True, "turns"),
        ("ran_tests_solved", "lower", False, "rate"),
    )
    return [
        ck.compare(
            drop,
            nd,
            name=f"{qs.QUANTITIES[q].title}, {ctx.label('drop')} − {ctx.label('never-drop')}",
            expects=expects,
            window=WHOLE_WINDOW,
            value=ck.whole(q),
            decides=decides,
            unit=unit,
        )
        for q, expects, decides, unit in rows
    ]


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
                    v[s] = ck.final("success")(run, nd[s])[0]
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


def _p6(ctx: Context) -> list[Check]:
    a05, nd = ctx.arm("protect-0.5"), ctx.arm("never-drop")
    out = [
        ck.compare(
            a05,
            nd,
            name=f"final success, {ctx.label('protect-0.5')} − {ctx.label('never-drop')}",
            expects="not lower",
            window=FINAL_WINDOW,
            value=ck.final("success"),
            unit="success rate",
        ),
        ck.compare(
            a05,
            nd,
            name=f"wall-clock to the last common step, {ctx.label('protect-0.5')} − {ctx.label('never-drop')}",
            expects="lower",
            window="the clock (`sim/time`, else wandb's `_runtime`) at the last step both runs reached",
            value=ck.clock,
            unit="clock units",
        ),
    ]
    if any(r.has(SANDBOX_KEY) for r in (*a05.values(), *nd.values())):
        out.append(
            ck.compare(
                a05,
                nd,
                name=f"sandbox seconds per trained sample, {ctx.label('protect-0.5')} − "
                f"{ctx.label('never-drop')}",
                expects="lower",
                window=WHOLE_WINDOW + f" (`{SANDBOX_KEY}`, logged by Miles)",
                value=ck.whole("sandbox_s"),
                decides=False,
                unit="s",
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
                value=ck.final("success"),
                decides=False,
                unit="success rate",
            )
        )
        out.append(_variance_check(a01, a05, nd, ctx))
    return out


# ---------------------------------------------------------------- P7


def _p7_online(ctx: Context) -> list[Check]:
    turn, mask, zero = ctx.arm("turn"), ctx.arm("mask"), ctx.arm("zero")
    out = [
        ck.compare(
            turn,
            mask,
            name=f"final success, {ctx.label('turn')} − {ctx.label('mask')}",
            expects="not lower",
            window=FINAL_WINDOW + " (the same number of steps: matched compute)",
            value=ck.final("success"),
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
                    value=ck.final(q),
                    decides=False,
                )
            )
    return out


def _p7_offline(ctx: Context) -> list[Check]:
    if ctx.replays or not ctx.binding:  # judged on the replay reports, not on a cohort
        return offline.p7_replay(ctx.replays)
    runs = ctx.arm("zero") or ctx.arm("never-drop")
    return offline.p7_sim(runs, label=ctx.binding.get("zero") or ctx.binding.get("never-drop"))


# ---------------------------------------------------------------- the reported comparison


def _pace(ctx: Context) -> list[Check]:
    pace, a05 = ctx.arm("pace"), ctx.arm("protect-0.5")
    return [
        ck.compare(
            pace,
            a05,
            name=f"final success, {ctx.label('pace')} − {ctx.label('protect-0.5')}",
            expects=None,
            window=FINAL_WINDOW,
            value=ck.final("success"),
            margin=None,
            unit="success rate",
        ),
        ck.compare(
            pace,
            a05,
            name=f"wall-clock to the last common step, {ctx.label('pace')} − {ctx.label('protect-0.5')}",
            expects=None,
            window="the clock at the last step both runs reached",
            value=ck.clock,
            margin=None,
            unit="clock units",
        ),
    ]


DEPENDS_P3 = (
    "the level b reaches (task difficulty; simulator: `difficulty`), how cheap the cap is to "
    "reach (turn cap; `max_turns`, the give-up logits, `informed_edit` / `blind_edit`), the "
    "step size (`lr`) and the run length (`steps`)"
)

PREDICTIONS: tuple[Prediction, ...] = (
    Prediction(
        id="P1",
        title="algebra check on two-outcome data",
        rule="P1: with every statistic frozen, on data with two outcomes (solved or capped), the "
        "masked gradient is (1 − J_x) times the reference per prompt and the survivor-baseline "
        "gradient is zero, to numerical precision.",
        falsified="any prompt off by more than the tolerance (a statistic is not frozen, or the "
        "code is not the model): fix before running anything else.",
        window="every prompt of every `rescue replay gradients` report (its `check`)",
        margin="the replay's relative tolerance `rtol` (1e-4 in float32, 1e-6 in float64)",
        depends="the dumps replayed, the model, the dtype; not on seeds (an identity, not an estimate)",
        roles={},
        evaluate=lambda ctx: offline.p1(ctx.replays),
        reads="replay",
    ),
    Prediction(
        id="P2",
        title="direction of the masking term",
        rule="P2: the difference between the masked and unmasked gradients has cosine above "
        f"{offline.P2_COSINE:g} with the estimated ∇P(cap), and its norm grows with b across "
        "task subsets.",
        falsified="the difference is isotropic relative to ∇P(cap) (cosine interval inside "
        f"±{offline.P2_ISOTROPY:g}), or its norm is flat in b.",
        window="one replicate per `rescue replay gradients` report (a task subset), bucket `all`: "
        "the cosine of (b) − (a) with ∇P(cap); the norm of (b) − (a) regressed on the report's "
        "`baseline_paid` (t interval on n − 2 dof)",
        margin=f"cosine: ±{offline.P2_ISOTROPY:g} around 0 is isotropic; norm: a slope within "
        f"±{offline.P2_FLAT:g} × mean norm / mean b is flat",
        depends="the checkpoint, the subsets' difficulty spread (the range of b), the number of "
        "rollouts per subset",
        roles={},
        evaluate=lambda ctx: offline.p2(ctx.replays),
        reads="replay",
    ),
    Prediction(
        id="P3",
        title="drift toward the cap under the mask",
        rule="P3: on three-outcome tasks, under the mask arm the cap-hit rate stops falling, or "
        f"rises, once the baseline paid to masked rollouts exceeds about {qs.B_THRESHOLD:g}, while "
        "under R = 0 (`zero`) and under the matched-update control (`matched`) it keeps falling; "
        "the submitted-failure rate falls faster under the mask than under R = 0.",
        falsified="mask and zero do not differ in how the cap-hit rate moves with b (across "
        "seeds), or the matched control drifts as the mask does.",
        window=B_WINDOW,
        margin="the reference arm's seed SD of the same trend",
        depends=DEPENDS_P3,
        roles={
            "mask": Role("mask"),
            "zero": Role("zero"),
            "matched": Role("matched", optional=True),
        },
        evaluate=_p3,
        curves=(("cap_hit", "mask", "zero"), ("submitted_failure", "mask", "zero")),
    ),
    Prediction(
        id="P4",
        title="survivor baselines amplify the drift",
        rule="P4: the survivor-baseline arm drifts toward the cap faster than the all-G mask arm, "
        "with a gap that grows with the cap-hit rate.",
        falsified="the two baselines give the same curves (the drift interval inside the margin).",
        window="OLS slope of the per-step cap-hit rate on the step, " + WHOLE_WINDOW,
        margin="the mask arm's seed SD of the same slope",
        depends=DEPENDS_P3 + "; the group size G (the survivors' mean is over fewer members)",
        roles={"survivor": Role("survivor"), "mask": Role("mask")},
        evaluate=_p4,
        curves=(("cap_hit", "survivor", "mask"),),
    ),
    Prediction(
        id="P5",
        title="signature of staleness drops",
        rule="P5: relative to never-drop, under drop successful trajectories get shorter and "
        "failed ones longer, and fewer successes ran the tests before submitting.",
        falsified="the outcome-conditioned turn counts do not separate (both no difference), or "
        "separate the other way.",
        window="the whole run's outcome-conditioned turns: " + WHOLE_WINDOW + ". Simulator: every "
        "generated rollout (`sim/generated/*`); cluster: the trained groups' census "
        "(`rollout/census/*`; dropped groups' turns are not logged)",
        margin="never-drop's seed SD of the same quantity",
        depends="the stale share (timing: `turn_time`, `context_growth`, `time_noise`, "
        "`concurrency`, `train_time`; K = `max_staleness`), the group size (a group waits for its "
        "slowest rollout), the fast/thorough length gap, `lr`, `steps`",
        roles={"drop": Role("drop"), "never-drop": Role("never-drop")},
        evaluate=_p5,
        curves=(
            ("turns_solved", "drop", "never-drop"),
            ("turns_failed", "drop", "never-drop"),
            ("ran_tests_solved", "drop", "never-drop"),
        ),
        combine="all",
    ),
    Prediction(
        id="P6",
        title="randomized protection rescues the stale groups",
        rule="P6: protect at a = 0.5 recovers never-drop's final success within seed noise at "
        "lower wall-clock than never-drop; at a = 0.1 it does not (the 1/a weights inflate the "
        "variance).",
        falsified="never-drop is cheaper, or protect a = 0.5 falls short of never-drop by more "
        "than seed noise (no a < 1 matches it).",
        window=FINAL_WINDOW + "; wall-clock at the last step both runs reached",
        margin="never-drop's seed SD (final success; wall-clock)",
        depends="the stale share (as P5), a, the number of seeds, `lr` (the 1/a weights scale the "
        "step), `steps`; on the cluster the sandbox and straggler time a protected group holds",
        roles={
            "protect-0.5": Role("protect", 0.5),
            "never-drop": Role("never-drop"),
            "protect-0.1": Role("protect", 0.1, optional=True),
        },
        evaluate=_p6,
        curves=(("success", "protect-0.5", "never-drop"), ("success", "protect-0.1", "never-drop")),
    ),
    Prediction(
        id="P7 online",
        title="the turn-reached baseline replaces the mask",
        rule="P7 (online): arm (vi), R = 0 with the turn-reached baseline (`turn`), matches or "
        "beats the mask arm on final success at matched compute, with a cap-hit rate and an "
        "episode length that track the R = 0 arm.",
        falsified="the mask arm beats the turn baseline on final success by more than seed noise.",
        window=FINAL_WINDOW,
        margin="success: the mask arm's seed SD; cap-hit and length: the zero arm's seed SD",
        depends="how much the turn reached tells about the reward (difficulty, `max_turns`, the "
        "give-up logits), the group size G, κ (`kappa`), `lr`, `steps`",
        roles={"turn": Role("turn"), "mask": Role("mask"), "zero": Role("zero", optional=True)},
        evaluate=_p7_online,
        curves=(
            ("success", "turn", "mask"),
            ("cap_hit", "turn", "zero"),
            ("turns", "turn", "zero"),
        ),
    ),
    Prediction(
        id="P7 offline",
        title="the turn-reached baseline cuts advantage variance",
        rule="P7 (offline): on three-outcome data the turn-reached baseline cuts the per-token "
        f"advantage variance by at least {offline.P7_SUPPORTS:.0%} relative to the group-mean "
        "baseline.",
        falsified=f"the reduction is below {offline.P7_FALSIFIES:.0%}: the fix has no lever.",
        window="simulator: each seed's trained batches of the R = 0 arm (`zero`, or `never-drop`, "
        "the same configuration), the whole run; replay: each dumped step of every "
        "`rescue replay advantages` report",
        margin=f"thresholds, not a margin: as predicted when the interval lies at or above "
        f"{offline.P7_SUPPORTS:.0%}, opposite when it lies below {offline.P7_FALSIFIES:.0%}; the "
        "leave-one-out comparison (same scale as the turn-reached baseline) is judged by the same rule",
        depends="how much the turn reached explains the reward (Var E[R | ℓ] / Var R), the group "
        "size G, κ",
        roles={
            "zero": Role("zero", optional=True),
            "never-drop": Role("never-drop", optional=True),
        },
        evaluate=_p7_offline,
        reads="both",
    ),
    Prediction(
        id="protect vs pace",
        title="protect a = 0.5 against pace (a reported comparison, not a prediction)",
        rule="No prediction was registered: the two ways of keeping stale groups are compared on "
        "final success and wall-clock, and the intervals are reported as they come.",
        falsified="nothing: a comparison, not a prediction.",
        window=FINAL_WINDOW + "; wall-clock at the last step both runs reached",
        margin="none",
        depends="as P6",
        roles={"pace": Role("pace"), "protect-0.5": Role("protect", 0.5)},
        evaluate=_pace,
        curves=(("success", "pace", "protect-0.5"),),
        prediction=False,
    ),
)

BY_ID: Mapping[str, Prediction] = {p.id: p for p in PREDICTIONS}
