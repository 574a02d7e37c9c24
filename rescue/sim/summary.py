"""What the simulated arms showed: per-arm figures, and the predictions as the judge reads them.

Specification
-------------
The arms table pools each quantity over the final window of every run (counts summed,
then divided; ``rescue.judge.quantities``) and gives, per arm, the mean over seeds with
its t interval's half-width. The policy's behaviour is read from every generated rollout
(``sim/generated/*``: trained, dropped or aborted alike), the realized baseline b from
the census of trained rollouts.

The predictions are judged by ``rescue.judge`` (the same rules, windows and margins as
``rescue report`` on real runs): the runs go to the judge grouped by arm and seed
(``cohort``) with the list of predictions to evaluate (``PREDICTIONS``: every one that
reads runs). A scenario of its own passes its own list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rescue.errors import InputError
from rescue.judge import quantities as qs
from rescue.judge.evaluation import Prediction, evaluate
from rescue.judge.predictions import PREDICTIONS as ALL_PREDICTIONS
from rescue.judge.report import PREAMBLE, fmt, predictions_markdown
from rescue.judge.runs import Cohort, Run, parse_name
from rescue.judge.stats import t_interval
from rescue.sim.config import SimConfig

#: The predictions the simulator's summary judges: those that read runs.
PREDICTIONS: tuple[Prediction, ...] = tuple(p for p in ALL_PREDICTIONS if p.reads != "replay")

#: Columns of the arms table: judge quantities, pooled over the final window.
TABLE: tuple[str, ...] = (
    "success",
    "cap_hit",
    "turns_solved",
    "turns_failed",
    "ran_tests_solved",
    "b_realized",
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


def summary_markdown(
    results: Mapping[str, Sequence],
    cfg: SimConfig,
    seeds: Sequence[int],
    predictions: Sequence[Prediction] = PREDICTIONS,
) -> str:
    """The markdown summary: the arms table, then each prediction as the judge reads it."""
    n = cfg.steps
    arms = cohort(results)
    lines = [
        "# rescue sim: summary",
        "",
        f"{len(results)} arms × {len(seeds)} seeds ({', '.join(map(str, seeds))}), {n} steps of "
        f"{cfg.groups_per_step} groups × {cfg.group_size} rollouts, turn cap {cfg.max_turns}, "
        f"K = {cfg.max_staleness}, concurrency {cfg.concurrency} groups. Table: the final "
        f"{qs.FINAL_FRACTION:.0%} of the steps, mean over seeds ± the half-width of its 95% t "
        "interval; behaviour from all generated rollouts, b from the trained ones.",
        "",
        *arm_table(arms),
        "",
        "## Predictions",
        "",
        PREAMBLE,
        "",
        "The simulator's parameters were set before any prediction was looked at and are not "
        "tuned to make one hold.",
        "",
        predictions_markdown(evaluate(predictions, arms)),
    ]
    return "\n".join(lines) + "\n"
