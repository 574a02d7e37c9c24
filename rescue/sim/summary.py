"""What the simulated arms showed: per-arm figures, and the predictions as the judge reads them.

Specification
-------------
The arms table pools each quantity over the final window of every run (counts summed,
then divided; ``rescue.judge.quantities``) and gives, per arm, the mean over seeds with
its t interval's half-width. The policy's behaviour is read from every generated rollout
(``rollout/census/generated/*``: trained, dropped or aborted alike), b (the realized
all-members baseline, the same functional for every arm) from the census of trained
rollouts.

The predictions are judged by ``rescue.judge`` (the same rules, windows and margins as
``rescue report`` on real runs): the runs go to the judge grouped by arm and seed
(``cohort``) with the list of predictions to evaluate (``PREDICTIONS``: every one that
reads runs, and ``COMPARISONS``, what the scenarios are built to show, reported with their
intervals and no verdict). A prediction whose arms a scenario does not run is named once,
not judged. An arm variant (``protect-a0.5-wnorm``: protect with its loss divided by the
sum of its weights; ``rescue.judge.runs.VARIANTS``) is judged in protect's roles beside the
plain arm.

A scenario's summary opens with what it isolates, then the arms table, the verdicts (under
the family-wise rule of ``rescue.judge.family``, applied by the runner to every scenario
of one run together, and alone), the wall-clock and generated rollouts each arm took to a
success target, and the sections. ``index_markdown`` puts several scenarios' verdicts on
one page (``make demo``), with the rule's account.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rescue.errors import InputError
from rescue.judge import checks as ck
from rescue.judge import quantities as qs
from rescue.judge import windows
from rescue.judge.evaluation import Context, Prediction, Result, Role, evaluate
from rescue.judge.predictions import PREDICTIONS as ALL_PREDICTIONS
from rescue.judge.report import PREAMBLE, fmt, interval, predictions_markdown, summary_table
from rescue.judge.rules import FINAL_WINDOW
from rescue.judge.runs import Cohort, Run, parse_name
from rescue.judge.stats import LEVEL, t_interval
from rescue.sim.config import SimConfig


def _strategy(ctx: Context) -> list[ck.Check]:
    return [
        ck.compare(
            ctx.arm("drop"),
            ctx.arm("never-drop"),
            name=f"final P(thorough), {ctx.label('drop')} − {ctx.label('never-drop')}",
            expects=None,
            window=FINAL_WINDOW,
            value=windows.final("p_thorough"),
            margin=None,
            unit="probability",
        )
    ]


#: What the scenarios are built to show, reported with intervals (no verdict: the plan
#: registered no prediction; the constructions are checked by the test suite).
COMPARISONS: tuple[Prediction, ...] = (
    Prediction(
        id="strategy share",
        title="the strategy the drop teaches (a reported comparison, not a prediction)",
        rule="The research plan's construction: when a staleness drop deletes Thorough's late "
        "successes, the trained data ask for fewer thorough attempts while the objective asks "
        "for more. Reported: the final share of Thorough under drop minus under never-drop.",
        falsified="nothing: a comparison, not a prediction.",
        window=FINAL_WINDOW,
        margin="none",
        depends="how late the thorough successes are against K updates (the timing), lr, steps",
        roles={"drop": Role("drop"), "never-drop": Role("never-drop")},
        evaluate=_strategy,
        curves=(("p_thorough", "drop", "never-drop"),),
        prediction=False,
    ),
)

#: The predictions the simulator's summary judges: those that read runs, and the comparisons.
PREDICTIONS: tuple[Prediction, ...] = (
    *(p for p in ALL_PREDICTIONS if p.reads != "replay"),
    *COMPARISONS,
)

#: Columns of the arms table: judge quantities, pooled over the final window.
TABLE: tuple[str, ...] = (
    "success",
    "cap_hit",
    "turns_solved",
    "turns_failed",
    "ran_tests_solved",
    "b",
    "dropped",
)


def to_run(result) -> Run:
    """A simulator ``RunResult`` as the judge's ``Run`` (its P7 variances as offline figures)."""
    parsed = parse_name(result.arm)
    if parsed is None:
        raise InputError(f"arm label {result.arm!r} is not an arm the judge knows")
    return Run(
        parsed[0], result.seed, result.steps, source=f"sim {result.arm}", offline={"p7": result.p7}
    )


def cohort(results: Mapping[str, Sequence]) -> Cohort:
    """``{arm label: {seed: Run}}`` of the simulator's results."""
    return {arm: {r.seed: to_run(r) for r in runs} for arm, runs in results.items()}


def final_values(runs: Mapping[int, Run], quantity: str) -> np.ndarray:
    """Each run's quantity pooled over its final window (NaN where it has no data)."""
    out = []
    for run in runs.values():
        try:
            s = qs.series(run, quantity)
        except qs.MissingKey:
            out.append(np.nan)
            continue
        stop = s.last_step
        out.append(s.pooled(qs.final_start(stop), stop) if np.isfinite(stop) else np.nan)
    return np.array(out, dtype=float)


def arm_table(arms: Cohort) -> list[str]:
    head = "| arm | " + " | ".join(qs.QUANTITIES[c].title for c in TABLE) + " |"
    lines = [head, "|" + "---|" * (len(TABLE) + 1)]
    for arm, runs in arms.items():
        cells = []
        for c in TABLE:
            est = t_interval(final_values(runs, c))
            half = (est.hi - est.lo) / 2 if est.finite else float("nan")
            cells.append(fmt(est.value) + ("" if not np.isfinite(half) else f" ± {fmt(half, 2)}"))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def target_table(arms: Cohort, target: float) -> list[str]:
    """Wall-clock and generated rollouts until each arm's success first reaches ``target``.

    Success is pooled over the trailing ``max(1, steps // 30)`` steps (as in the plots);
    per arm the mean over the seeds that reach it, with its t interval's half-width.
    """
    lines = [
        f"| arm | seeds reaching {target:.3f} | wall-clock | generated rollouts |",
        "|---|---|---|---|",
    ]
    for label, runs in arms.items():
        clock, gen = [], []
        for run in runs.values():
            s = qs.series(run, "success")
            stop = s.last_step
            window = max(1, int(stop + 1) // 30)
            steps, y = s.trailing(window, stop)
            hit = np.flatnonzero(np.nan_to_num(y, nan=-1.0) >= target)
            if hit.size:
                t = qs.wall_clock(run)
                rows = run.steps() <= steps[hit[0]]
                until = t.num[t.step <= steps[hit[0]]]
                if not until.size:  # no finite wall-clock up to there: not counted
                    continue
                clock.append(float(until[-1]))
                gen.append(float(np.nansum(run.column(qs.GEN + "rollouts")[rows])))
        cells = []
        for x in (clock, gen):
            e = t_interval(x)
            half = (e.hi - e.lo) / 2 if e.finite else float("nan")
            cells.append(fmt(e.value, 4) + ("" if not np.isfinite(half) else f" ± {fmt(half, 2)}"))
        lines.append(f"| {label} | {len(clock)} of {len(runs)} | {cells[0]} | {cells[1]} |")
    return lines


#: Share of the way from the start to the reference arm's final success the target lies at.
TARGET_SHARE = 0.9


def success_target(arms: Cohort) -> tuple[float, str]:
    """The success target and its reference arm: ``TARGET_SHARE`` of the way from the
    first window's success (mean over every run) to the final success of never-drop, or of
    the arm with the highest final success when never-drop did not run."""
    finals = {
        label: float(np.nanmean(final_values(runs, "success"))) for label, runs in arms.items()
    }
    finals = {k: v for k, v in finals.items() if np.isfinite(v)}
    if not finals:
        return float("nan"), ""
    ref = "never-drop" if "never-drop" in finals else max(finals, key=finals.get)
    starts = []
    for runs in arms.values():
        for run in runs.values():
            s = qs.series(run, "success")
            if s.step.size:
                starts.append(s.pooled(stop=s.step.min() + max(1, int(s.last_step + 1) // 30) - 1))
    start = float(np.nanmean(starts)) if starts else float("nan")
    return start + TARGET_SHARE * (finals[ref] - start), ref


def scenario_lines(scenario) -> list[str]:
    """What a scenario is for: its regime, the mechanism it isolates, what it should show."""
    if scenario is None or not scenario.name:
        return []
    regime = {"A": "A (budget failures, reward known)", "B": "B (outcomes never observed)"}
    out = [f"Scenario **{scenario.name}**: {scenario.title}."]
    if scenario.regime in regime:
        out.append(f"Regime {regime[scenario.regime]}.")
    if scenario.isolates:
        out.append(f"It isolates {scenario.isolates}.")
    if scenario.expect:
        out.append(f"The theory expects: {scenario.expect}.")
    return [" ".join(out), ""]


def judged(results: Mapping[str, Sequence], predictions: Sequence[Prediction] = PREDICTIONS):
    """``(cohort, results run here, ids of the predictions whose arms did not run)``."""
    arms = cohort(results)
    out = evaluate(predictions, arms)
    ran = [r for r in out if r.binding]
    missing = sorted(
        {r.prediction.id for r in out if not r.binding} - {r.prediction.id for r in ran}
    )
    return arms, ran, missing


def summary_markdown(
    results: Mapping[str, Sequence],
    cfg: SimConfig,
    seeds: Sequence[int],
    predictions: Sequence[Prediction] = PREDICTIONS,
    scenario=None,
    judgement: tuple[Cohort, list[Result], list[str]] | None = None,
    family=None,
) -> str:
    """The markdown summary: the scenario, the arms table, then the judge's verdicts.

    ``family``: the family-wise rule's account (``rescue.judge.family.Family``) when the
    caller applied it (``run_scenarios``); without one it is applied to this summary's
    results alone.
    """
    n = cfg.steps
    arms, ran, missing = judgement or judged(results, predictions)
    if family is None:
        from rescue.judge.family import holm

        family = holm(ran)
    try:
        target, ref = success_target(arms)
        targets = target_table(arms, target) if np.isfinite(target) else []
    except qs.MissingKey:  # runs without a clock or a success count: no such table
        targets = []
    lines = [
        "# rescue sim: summary" + (f" of {scenario.name}" if scenario and scenario.name else ""),
        "",
        *scenario_lines(scenario),
        f"{len(results)} arms × {len(seeds)} seeds ({', '.join(map(str, seeds))}), {n} steps of "
        f"{cfg.groups_per_step} groups × {cfg.group_size} rollouts, turn cap {cfg.max_turns}, "
        f"K = {cfg.max_staleness}, concurrency {cfg.concurrency} groups. Table: the final "
        f"{qs.FINAL_FRACTION:.0%} of the steps, mean over seeds ± the half-width of its "
        f"{LEVEL:.0%} t interval; behaviour from all generated rollouts, b (the realized "
        "all-members baseline) from the trained ones.",
        "",
        *arm_table(arms),
        "",
        "## Verdicts",
        "",
        *summary_table(ran),
        "",
        *family.lines(),
        "",
    ]
    if missing:
        lines += [f"Not run here (their arms are not in this run): {', '.join(missing)}.", ""]
    if targets:
        lines += [
            "## To a success target",
            "",
            f"Target: success {target:.3f}, {TARGET_SHARE:.0%} of the way from the first "
            f"window's success to {ref}'s final success. Clock and rollouts generated "
            "(trained, dropped or aborted) until an arm's trailing success first reached it, "
            "over the seeds that reached it:",
            "",
            *targets,
            "",
        ]
    lines += [
        "## Predictions",
        "",
        PREAMBLE,
        "",
        "The simulator's parameters were set before any prediction was looked at and are not "
        "tuned to make one hold.",
        "",
        predictions_markdown(ran),
    ]
    return "\n".join(lines) + "\n"


def index_markdown(entries, seeds: Sequence[int], family=None) -> str:
    """Several scenarios on one page: what each isolates and its verdicts.

    ``entries``: ``(scenario, summary path relative to the page, judged results)``;
    ``family``: the family-wise rule's account over all of them.
    """
    lines = [
        "# rescue sim: scenarios",
        "",
        f"Seeds {', '.join(map(str, seeds))}, fixed before any run was looked at. Every "
        "verdict is the judge's (`rescue.judge`); `alone` is a prediction's verdict with "
        f"each of its checks at {LEVEL:.0%}, `verdict` the one under the family-wise rule "
        "over every scenario of this page.",
        "",
        *([*family.lines(), ""] if family is not None else []),
    ]
    for scenario, where, ran in entries:
        lines += [f"## {scenario.name}", "", *scenario_lines(scenario), *summary_table(ran), ""]
        reported = [
            f"- {c.name}: {interval(c)}"
            for r in ran
            if not r.prediction.prediction
            for c in r.checks
        ]
        if reported:
            lines += ["Reported comparisons (no verdict), mean [95% t interval]:", *reported, ""]
        lines += [f"Summary, sections and plots: `{where}/`.", ""]
    return "\n".join(lines)
