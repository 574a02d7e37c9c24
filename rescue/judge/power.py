"""What a seed budget can decide: each prediction's verdicts on simulated replicates, by the judge.

Specification
-------------
For the arms of one report (a question's, or any), n seeds per arm and a true effect of e
seed SDs, ``power`` gives the share of replicates in which each prediction the report
judges gets a decisive verdict, and the share in which it makes a false claim, under the
report's family-wise rule and alone.

A replicate is one report's runs: every arm with ``MAX_SEEDS`` seeds of ``STEPS`` steps
whose rows carry the keys the judge reads (``null_runs``: the census' generated view, b
rising past P3's threshold, the clock), each quantity a level plus independent normal
noise per step, the same for every arm: no arm differs (the null). The judge
(``report.judge``, what ``rescue report`` runs) reads them: cohorts, the predictions'
roles, windows, per-seed values and checks. The replicate with n seeds is its first n;
an effect is planted in the per-seed values of one prediction's deciding checks at a
time (``PLANTS``), every deciding check is judged again from its per-seed values by its
own rule (``checks.rejudge``: the pairing, margin, t interval, verdict and p-value of
``compare``), each prediction's verdict is recombined (``evaluation.verdict_of``) and the
report's family-wise rule (``family.holm``) is applied over all its deciding checks, the
other predictions null. No verdict is computed here, only values moved.

The effect is in units of σ, the SD of the deciding check's per-seed differences between
its two arms over the null replicates (what a paired t interval on n seeds sees), and is
planted as ``bench/judge_calibration.py`` plants it, where each prediction's deciding
quantity lives (P3: the mask arm's cap-hit trend against b at matched b, + e·σ of the
first check, which moves both deciding checks; P4: the survivor arm's drift; P5: the drop
arm's turns of successes − e·σ and of failures + e·σ over the run; P6 and P7 online,
equivalences: the protect / turn arm's final success − (m + e·σ), m the replicate's
margin, a shortfall of e σ beyond the margin).

The verdict the truth makes (``truth``): with an effect, ``as predicted`` for a predicted
difference (P3, P4, P5) and ``opposite`` for an equivalence (P6, P7 online); with none,
``no difference`` (the difference's falsifying claim, made rightly) or ``as predicted``.
A false claim: with no effect, ``as predicted`` or ``opposite`` for a difference,
``opposite`` for an equivalence; with an effect, ``opposite`` for a difference and ``as
predicted`` for an equivalence (a ``no difference`` under a small true effect can be true:
not counted).

The per-seed values are normal by construction; the judge's verdicts depend on them only
through the differences in units of σ and, for an equivalence or ``no difference``, the
margin in those units (the reference arm's seed SD: σ/√2 for arms whose seeds are
independent, as in the calibration's relabelled blocks; pairing by seed on the cluster
lowers σ, not the chance at a given number of σ).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rescue.judge.checks import Check, rejudge
from rescue.judge.evaluation import Result, verdict_of
from rescue.judge.family import holm
from rescue.judge.predictions import PREDICTIONS, Prediction
from rescue.judge.runs import Run, parse_name
from rescue.judge.stats import AS_PREDICTED, MIN_SEEDS, NO_DIFFERENCE, OPPOSITE

#: Seeds per arm in a replicate (the most ``power`` is asked about).
MAX_SEEDS = 10
#: Seed counts and effects (seed SDs) of the table.
SEED_COUNTS: tuple[int, ...] = tuple(range(2, MAX_SEEDS + 1))
EFFECTS: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)
#: The effect the one-line summary quotes (the calibration's planted effect).
LINE_EFFECT = 1.5
#: Steps per run and rollouts per step of a replicate.
STEPS, ROLLOUTS = 20, 128.0
#: Replicates by default, and of the one-line summary the launchers print (about ±0.05).
REPLICATES = 300
LINE_REPLICATES = 100
G = "rollout/census/generated/"
C = "rollout/census/"


@dataclass(frozen=True)
class Plant:
    """Where a prediction's effect is planted: the role whose per-seed values move, the sign
    per deciding check (in order), whether each check has its own σ (else the first's),
    whether the shortfall is measured beyond the margin, and the verdict it makes true."""

    role: str
    signs: tuple[float, ...]
    own_sigma: bool = False
    beyond_margin: bool = False
    truth: str = AS_PREDICTED


PLANTS: dict[str, Plant] = {
    "P3": Plant("mask", (1.0, 1.0)),
    "P4": Plant("survivor", (1.0,)),
    "P5": Plant("drop", (-1.0, 1.0), own_sigma=True),
    "P6": Plant("protect-0.5", (-1.0,), beyond_margin=True, truth=OPPOSITE),
    "P7 online": Plant("turn", (-1.0,), beyond_margin=True, truth=OPPOSITE),
}
#: The predictions a replicate's report judges (those that read runs; P7 offline reads
#: replay reports or the simulator's own variances, P1 and P2 replay reports).
JUDGED: tuple[Prediction, ...] = tuple(p for p in PREDICTIONS if p.reads == "runs")


def truth(pid: str, effect: float) -> str:
    """The verdict the truth makes for ``pid`` with an effect of ``effect`` σ."""
    plant = PLANTS[pid]
    if effect > 0:
        return plant.truth
    return NO_DIFFERENCE if plant.truth == AS_PREDICTED else AS_PREDICTED


def is_false(pid: str, effect: float, verdict: str | None) -> bool:
    """Whether ``verdict`` is a claim the truth contradicts (module docstring)."""
    difference = PLANTS[pid].truth == AS_PREDICTED
    if effect > 0:
        return verdict == (OPPOSITE if difference else AS_PREDICTED)
    return verdict in ((AS_PREDICTED, OPPOSITE) if difference else (OPPOSITE,))


def arm_label(arm: str) -> str:
    """A run label of the judge's for an arm as the launchers name it (``protect:0.5``);
    ``InputError`` for a name the judge does not know."""
    from rescue.errors import InputError
    from rescue.judge.runs import ARM_NAMES

    name, _, a = arm.strip().partition(":")
    try:
        label = f"{name}-a{float(a):g}" if a else name
    except ValueError:
        label = ""
    if not label or parse_name(label) is None:
        raise InputError(
            f"arm {arm!r} is not an arm; allowed: {', '.join(ARM_NAMES)} (protect:A with a number A)"
        )
    return label


def null_runs(labels: Sequence[str], rng: np.random.Generator, seeds: int = MAX_SEEDS) -> list[Run]:
    """One replicate's runs: every arm, ``seeds`` seeds, no arm different from another."""
    t = np.arange(STEPS, dtype=float)
    b = 0.35 + 0.3 * t / (STEPS - 1)
    runs = []
    for label in labels:
        cond = parse_name(label)[0]
        for seed in range(seeds):
            z = rng.normal(size=(6, STEPS))
            success = 0.5 + 0.03 * z[0]
            cap = 0.2 + 0.03 * z[1]
            rows = []
            for i in range(STEPS):
                solved, capped = success[i] * ROLLOUTS, cap[i] * ROLLOUTS
                row = {"rollout/step": float(i), "sim/time": 10.0 * (i + 1),
                       C + "rollouts": ROLLOUTS, C + "b_all": float(b[i]),
                       G + "rollouts": ROLLOUTS, G + "outcome/solved": solved,
                       G + "outcome/budget_failure": capped,
                       G + "outcome/submitted_failure": ROLLOUTS - solved - capped,
                       G + "outcome/infra_no_result": 0.0, G + "cap_hit_rate": cap[i],
                       G + "turns_mean/solved": 6.0 + 0.5 * z[2, i],
                       G + "turns_mean/submitted_failure": 10.0 + 0.5 * z[3, i],
                       G + "turns_mean/budget_failure": 12.0 + 0.5 * z[4, i],
                       G + "ran_tests_rate/solved": 0.8 + 0.03 * z[5, i]}  # fmt: skip
                rows.append(row)
            runs.append(Run(cond, seed, rows, source=f"replicate {label} seed {seed}"))
    return runs


def judged_results(runs: Sequence[Run]) -> list[Result]:
    """The judge's results on one replicate (``report.judge``, as ``rescue report``)."""
    from rescue.judge.report import judge

    j = judge(runs, predictions=JUDGED)
    return [r for c in j.cohorts for r in c.results if r.prediction.prediction and r.checks]


def _deciding(r: Result) -> list[Check]:
    return [c for c in r.checks if c.decides]


def differences(check: Check) -> list[float]:
    """A comparison's per-seed differences (arm − reference)."""
    (_, a), (_, ref) = list(check.values.items())[:2]
    return [a[s] - ref[s] for s in a if s in ref and np.isfinite(a[s]) and np.isfinite(ref[s])]


def verdicts(
    results: Sequence[Result], n: int, pid: str | None = None, shift: Callable | None = None
) -> dict[str, tuple[str | None, str | None]]:
    """``{prediction: (verdict under the rule, alone)}`` of the replicate's first ``n``
    seeds, with ``shift(result, k, check) -> amount`` added to the planted role's values of
    prediction ``pid``'s k-th deciding check (None: the null)."""
    fresh = []
    for r in results:
        checks = []
        for k, c in enumerate(_deciding(r)):
            values = {lab: {s: v for s, v in d.items() if s < n} for lab, d in c.values.items()}
            if r.prediction.id == pid and shift is not None:
                label = r.binding[PLANTS[pid].role]
                amount = shift(r, k, c)
                values[label] = {s: v + amount for s, v in values[label].items()}
            checks.append(rejudge(c, values))
        fresh.append(Result(r.prediction, r.binding, checks, verdict_of(r.prediction, checks)))
    holm(fresh)
    out: dict[str, tuple[str | None, str | None]] = {}
    for r in fresh:
        out.setdefault(r.prediction.id, (r.verdict, r.alone))
    return out


@dataclass
class Power:
    """Shares over the replicates: ``decisive[pid][n][e]`` and ``false[pid][n][e]`` as
    ``(under the rule, alone)``; ``e = 0`` is no effect."""

    labels: tuple[str, ...]
    replicates: int
    seeds: tuple[int, ...]
    effects: tuple[float, ...]
    sigma: dict[str, list[float]] = field(default_factory=dict)
    decisive: dict[str, dict[int, dict[float, tuple[float, float]]]] = field(default_factory=dict)
    false: dict[str, dict[int, dict[float, tuple[float, float]]]] = field(default_factory=dict)

    @property
    def predictions(self) -> list[str]:
        return list(self.decisive)


def power(
    arms: Sequence[str],
    *,
    seeds: Sequence[int] = SEED_COUNTS,
    effects: Sequence[float] = EFFECTS,
    replicates: int = REPLICATES,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Power:
    """The table of the module docstring for a report of ``arms`` (launcher names:
    ``zero``, ``protect:0.5``); ``progress(replicates done)`` after each replicate."""
    labels = tuple(arm_label(a) for a in arms)
    rng = np.random.default_rng(seed)
    reps = []
    for i in range(replicates):
        reps.append(judged_results(null_runs(labels, rng, max(max(seeds), MIN_SEEDS))))
        if progress is not None:
            progress(i + 1)
    pids = [r.prediction.id for r in reps[0] if r.prediction.id in PLANTS] if reps else []
    pids = list(dict.fromkeys(pids))
    sigma = {}
    for pid in pids:
        per_check: list[list[float]] = []
        for rep in reps:
            r = next(x for x in rep if x.prediction.id == pid)
            for k, c in enumerate(_deciding(r)):
                while len(per_check) <= k:
                    per_check.append([])
                per_check[k] += differences(c)
        sigma[pid] = [float(np.std(d, ddof=1)) if len(d) > 1 else float("nan") for d in per_check]
    out = Power(labels, replicates, tuple(seeds), (0.0, *effects), sigma)
    tally = {pid: {n: {e: np.zeros(4) for e in out.effects} for n in seeds} for pid in pids}
    for rep in reps:
        for n in seeds:
            null = verdicts(rep, n)
            for pid in pids:
                _count(tally[pid][n][0.0], pid, 0.0, null[pid])
            for pid in pids:
                plant, sig = PLANTS[pid], sigma[pid]
                for e in effects:

                    def shift(r, k, c, e=e, plant=plant, sig=sig, n=n):
                        s = sig[k] if plant.own_sigma else sig[0]
                        amount = plant.signs[k] * e * s
                        if plant.beyond_margin:
                            margin = rejudge(c, _first(c, n)).margin
                            amount += plant.signs[k] * (margin if np.isfinite(margin) else 0.0)
                        return amount

                    _count(tally[pid][n][e], pid, e, verdicts(rep, n, pid, shift)[pid])
    for pid in pids:
        out.decisive[pid] = {n: {e: (t[0] / replicates, t[1] / replicates)
                                 for e, t in by_e.items()} for n, by_e in tally[pid].items()}  # fmt: skip
        out.false[pid] = {n: {e: (t[2] / replicates, t[3] / replicates)
                              for e, t in by_e.items()} for n, by_e in tally[pid].items()}  # fmt: skip
    return out


def _first(c: Check, n: int) -> dict:
    return {lab: {s: v for s, v in d.items() if s < n} for lab, d in c.values.items()}


def _count(
    acc: np.ndarray, pid: str, effect: float, verdict: tuple[str | None, str | None]
) -> None:
    rule, alone = verdict
    want = truth(pid, effect)
    acc += (rule == want, alone == want, is_false(pid, effect, rule), is_false(pid, effect, alone))


# ---------------------------------------------------------------- what a run may not skip


def compared(arms: Sequence[str]) -> list[str]:
    """The predictions whose required arms are all among ``arms`` (launcher names)."""
    labels = [arm_label(a) for a in arms]
    runs = [Run(parse_name(lab)[0], 0, []) for lab in labels if parse_name(lab) is not None]
    out = []
    for p in PREDICTIONS:
        required = [role for role in p.roles.values() if not role.optional]
        if (
            p.prediction
            and required
            and all(any(role.matches(r) for r in runs) for role in required)
        ):
            out.append(p.id)
    return out


def refusal(arms: Sequence[str], seeds: int) -> str | None:
    """Why ``seeds`` per arm can decide nothing for these arms (None: it can decide)."""
    if seeds >= MIN_SEEDS:
        return None
    which = compared(arms)
    if not which:
        return None
    return (
        f"SEEDS={seeds}: {', '.join(which)} compare{'s' if len(which) == 1 else ''} these arms, "
        f"and the judge decides nothing on fewer than {MIN_SEEDS} paired seeds per arm"
    )


# ---------------------------------------------------------------- what it prints


def _pair(x: tuple[float, float]) -> str:
    return f"{x[0]:.2f} / {x[1]:.2f}"


def line(p: Power, n: int, effect: float = LINE_EFFECT, arms: Sequence[str] = ()) -> str:
    """One line: at ``n`` seeds per arm, each prediction's chance of the verdict a true
    effect of ``effect`` σ makes (under the report's rule / alone), and the largest share of
    false claims with no effect. Below the judge's minimum, the predictions ``arms`` compare
    (``compared``; else the table's) decide nothing, and no replicate is needed to say so."""
    if n < MIN_SEEDS:
        which = compared(arms) if arms else p.predictions
        if not which:
            return f"SEEDS={n} per arm: no prediction compares these arms"
        return (
            f"SEEDS={n} per arm: the judge decides nothing on fewer than {MIN_SEEDS} paired "
            f"seeds: {', '.join(which)} stay inconclusive"
        )
    if not p.predictions:
        return f"SEEDS={n} per arm: no prediction compares these arms"
    found = ", ".join(f"{pid} {_pair(p.decisive[pid][n][effect])}" for pid in p.predictions)
    worst = max(max(p.false[pid][n][0.0]) for pid in p.predictions)
    return (
        f"SEEDS={n} per arm: a true effect of {effect:g} seed SDs is decided (the report's "
        f"family-wise rule / alone) {found}; with no effect, false claims at most {worst:.2f} "
        f"(rescue power, {p.replicates} replicates)"
    )


def markdown(p: Power, name: str, seconds: float) -> list[str]:
    """The table per prediction: decisive shares by seeds and effect, and false claims."""
    lines = [
        f"## {name}: the report of {', '.join(p.labels)}",
        "",
        f"{p.replicates} replicates of {MAX_SEEDS} seeds × {STEPS} steps per arm, judged by "
        f"`rescue.judge` ({seconds:.0f} s). Each cell: the share of replicates, under the "
        "report's family-wise rule / alone. Decisive: the verdict the truth makes (with an "
        "effect `as predicted` for P3, P4, P5 and `opposite` for the equivalences P6 and P7 "
        "online, planted beyond their margin; with none `no difference`, or `as predicted` "
        "for an equivalence). False claims: with no effect `as predicted` or `opposite` (P3, "
        "P4, P5), `opposite` (P6, P7 online).",
        "",
    ]
    effects = [e for e in p.effects if e > 0]
    for pid in p.predictions:
        lines += [
            f"**{pid}** (σ: the SD of the deciding check's per-seed differences)",
            "",
            "| seeds | no effect: decisive | no effect: false claims | "
            + " | ".join(f"{e:g} σ" for e in effects)
            + " |",
            "|---|---|---|" + "---|" * len(effects),
        ]
        for n in p.seeds:
            d, f = p.decisive[pid][n], p.false[pid][n]
            lines.append(
                f"| {n} | {_pair(d[0.0])} | {_pair(f[0.0])} | "
                + " | ".join(_pair(d[e]) for e in effects)
                + " |"
            )
        wrong = max((max(p.false[pid][n][e]) for n in p.seeds for e in effects), default=0.0)
        lines += ["", f"With an effect, the wrong way (a false claim): at most {wrong:.2f}.", ""]
    return lines


def as_json(p: Power) -> dict:
    def keyed(d):
        return {str(n): {f"{e:g}": list(v) for e, v in by_e.items()} for n, by_e in d.items()}

    return {
        "arms": list(p.labels),
        "replicates": p.replicates,
        "sigma": p.sigma,
        "decisive": {pid: keyed(d) for pid, d in p.decisive.items()},
        "false": {pid: keyed(d) for pid, d in p.false.items()},
        "cells": "(under the report's family-wise rule, alone)",
    }
