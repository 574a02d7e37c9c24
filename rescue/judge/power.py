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
    """Where an effect is planted: the prediction, the roles whose per-seed values move (each
    by the same amount), the sign per deciding check (in order), whether each check has its
    own σ (else the first's), whether the shortfall is measured beyond the margin, the
    verdict it makes true and whether the prediction is a difference (else an equivalence)."""

    pid: str
    roles: tuple[str, ...]
    signs: tuple[float, ...]
    own_sigma: bool = False
    beyond_margin: bool = False
    truth: str = AS_PREDICTED
    difference: bool = True
    title: str = ""
    #: The truth in a report without the step-size control (None: ``truth``).
    truth_without: str | None = None

    def verdict(self, step_control: bool) -> str:
        """The verdict an effect makes true, in a report with or without the step-size
        control."""
        return self.truth if step_control or self.truth_without is None else self.truth_without


#: The plants, by name. P3's effect is planted every way its controls can go: the mask
#: alone drifts; the mask's direction carries the drift (the matched control, the mask's
#: direction at R = 0's step size, reproduces it: what the subsidy predicts); step size
#: carries it (the step-size control, R = 0's direction at the mask's step size, reproduces
#: it). P3's control clause reads the step-size control when the report has it, else the
#: matched control (``rules.p3``), so the direction plant is a falsified P3 only in a report
#: without the step-size control (``Plant.truth_without``).
PLANTS: dict[str, Plant] = {
    "P3": Plant("P3", ("mask",), (1.0, 1.0), title="the mask drifts, neither control does"),
    "P3 direction": Plant(
        "P3",
        ("mask", "matched"),
        (1.0, 1.0),
        truth_without=NO_DIFFERENCE,
        title="the mask and the matched control drift (the mask's direction carries it)",
    ),
    "P3 step size": Plant(
        "P3",
        ("mask", "step-control"),
        (1.0, 1.0),
        truth=NO_DIFFERENCE,
        title="the mask and the step-size control drift (step size carries it)",
    ),
    "P4": Plant("P4", ("survivor",), (1.0,)),
    "P5": Plant("P5", ("drop",), (-1.0, 1.0), own_sigma=True),
    "P6": Plant(
        "P6", ("protect-0.5",), (-1.0,), beyond_margin=True, truth=OPPOSITE, difference=False
    ),
    "P7 online": Plant(
        "P7 online", ("turn",), (-1.0,), beyond_margin=True, truth=OPPOSITE, difference=False
    ),
}
#: The predictions a replicate's report judges (those that read runs; P7 offline reads
#: replay reports or the simulator's own variances, P1 and P2 replay reports).
JUDGED: tuple[Prediction, ...] = tuple(p for p in PREDICTIONS if p.reads == "runs")


def truth(name: str, effect: float, step_control: bool = True) -> str:
    """The verdict the truth makes for plant ``name`` with an effect of ``effect`` σ, in a
    report with (or without) the step-size control."""
    plant = PLANTS[name]
    if effect > 0:
        return plant.verdict(step_control)
    return NO_DIFFERENCE if plant.difference else AS_PREDICTED


def is_false(name: str, effect: float, verdict: str | None, step_control: bool = True) -> bool:
    """Whether ``verdict`` is a claim the truth of plant ``name`` contradicts (module
    docstring): with an effect, the opposite of what it makes true (for a plant whose
    truth is ``no difference``, a claimed difference either way); with none, a claimed
    difference, or a claimed failure of an equivalence."""
    plant = PLANTS[name]
    if effect > 0:
        true = plant.verdict(step_control)
        if true == NO_DIFFERENCE:
            return verdict in (AS_PREDICTED, OPPOSITE)
        return verdict == (OPPOSITE if true == AS_PREDICTED else AS_PREDICTED)
    return verdict in ((AS_PREDICTED, OPPOSITE) if plant.difference else (OPPOSITE,))


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
    results: Sequence[Result], n: int, plant: str | None = None, shift: Callable | None = None
) -> dict[str, tuple[str | None, str | None]]:
    """``{prediction: (verdict under the rule, alone)}`` of the replicate's first ``n``
    seeds, with ``shift(result, k, check) -> amount`` added to the values of every role
    ``plant`` moves in its prediction's k-th deciding check (None: the null)."""
    p = PLANTS[plant] if plant is not None else None
    fresh = []
    for r in results:
        checks = []
        for k, c in enumerate(_deciding(r)):
            values = {lab: {s: v for s, v in d.items() if s < n} for lab, d in c.values.items()}
            if p is not None and r.prediction.id == p.pid and shift is not None:
                amount = shift(r, k, c)
                for role in p.roles:
                    label = r.binding.get(role)
                    if label in values:
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
    """Shares over the replicates: ``decisive[plant][n][e]`` and ``false[plant][n][e]`` as
    ``(under the rule, alone)``; ``e = 0`` is no effect. ``noise``: where the replicates'
    noise came from."""

    labels: tuple[str, ...]
    replicates: int
    seeds: tuple[int, ...]
    effects: tuple[float, ...]
    sigma: dict[str, list[float]] = field(default_factory=dict)
    decisive: dict[str, dict[int, dict[float, tuple[float, float]]]] = field(default_factory=dict)
    false: dict[str, dict[int, dict[float, tuple[float, float]]]] = field(default_factory=dict)
    noise: str = "synthetic"

    @property
    def predictions(self) -> list[str]:
        """The plants judged (a prediction's name, or a prediction planted another way)."""
        return list(self.decisive)


#: ``null(labels, rng, seeds) -> runs``: one replicate's runs with no arm different.
Null = Callable[[Sequence[str], np.random.Generator, int], list[Run]]


def power(
    arms: Sequence[str],
    *,
    seeds: Sequence[int] = SEED_COUNTS,
    effects: Sequence[float] = EFFECTS,
    replicates: int = REPLICATES,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    null: Null | None = None,
    noise: str = "synthetic",
) -> Power:
    """The table of the module docstring for a report of ``arms`` (launcher names:
    ``zero``, ``protect:0.5``); ``progress(replicates done)`` after each replicate.
    ``null``: where a replicate's runs come from (default ``null_runs``; ``pool_null`` draws
    them from simulated runs), ``noise`` says which in the output."""
    labels = tuple(arm_label(a) for a in arms)
    rng = np.random.default_rng(seed)
    draw = null or null_runs
    reps = []
    for i in range(replicates):
        reps.append(judged_results(draw(labels, rng, max(max(seeds), MIN_SEEDS))))
        if progress is not None:
            progress(i + 1)
    judged = {r.prediction.id: r for r in reps[0]} if reps else {}
    names = [
        name
        for name, plant in PLANTS.items()
        if plant.pid in judged and all(judged[plant.pid].binding.get(role) for role in plant.roles)
    ]
    step_control = bool(judged.get("P3") and judged["P3"].binding.get("step-control"))
    sigma = {}
    for name in names:
        per_check: list[list[float]] = []
        for rep in reps:
            r = next(x for x in rep if x.prediction.id == PLANTS[name].pid)
            for k, c in enumerate(_deciding(r)):
                while len(per_check) <= k:
                    per_check.append([])
                per_check[k] += differences(c)
        sigma[name] = [float(np.std(d, ddof=1)) if len(d) > 1 else float("nan") for d in per_check]
    out = Power(labels, replicates, tuple(seeds), (0.0, *effects), sigma, noise=noise)
    tally = {name: {n: {e: np.zeros(4) for e in out.effects} for n in seeds} for name in names}
    for rep in reps:
        for n in seeds:
            null_verdicts = verdicts(rep, n)
            for name in names:
                _count(tally[name][n][0.0], name, 0.0, null_verdicts[PLANTS[name].pid],
                       step_control)  # fmt: skip
            for name in names:
                plant, sig = PLANTS[name], sigma[name]
                for e in effects:

                    def shift(r, k, c, e=e, plant=plant, sig=sig, n=n):
                        s = sig[k] if plant.own_sigma else sig[0]
                        amount = plant.signs[k] * e * s
                        if plant.beyond_margin:
                            margin = rejudge(c, _first(c, n)).margin
                            amount += plant.signs[k] * (margin if np.isfinite(margin) else 0.0)
                        return amount

                    said = verdicts(rep, n, name, shift)[plant.pid]
                    _count(tally[name][n][e], name, e, said, step_control)
    for name in names:
        out.decisive[name] = {n: {e: (t[0] / replicates, t[1] / replicates)
                                  for e, t in by_e.items()} for n, by_e in tally[name].items()}  # fmt: skip
        out.false[name] = {n: {e: (t[2] / replicates, t[3] / replicates)
                               for e, t in by_e.items()} for n, by_e in tally[name].items()}  # fmt: skip
    return out


def pool_null(pool: Sequence[Run]) -> Null:
    """A null whose replicates are drawn from ``pool``, runs of one arm's behaviour (the
    simulator's, with b noisy and the cap-hit rate and b read off the same rollouts, as a
    run's are): each (arm, seed) of a replicate is a different run of the pool, relabelled;
    so no arm differs from another but by the noise of real runs. ``InputError`` when the
    pool is smaller than one replicate."""
    from rescue.errors import InputError

    rows = [[{k: v for k, v in row.items() if k not in ("config", "scenario")} for row in r.rows]
            for r in pool]  # fmt: skip

    def draw(labels: Sequence[str], rng: np.random.Generator, seeds: int) -> list[Run]:
        need = len(labels) * seeds
        if need > len(rows):
            raise InputError(
                f"the pool of simulated runs holds {len(rows)} runs; a replicate of "
                f"{len(labels)} arms × {seeds} seeds needs {need}"
            )
        picks = iter(rng.permutation(len(rows))[:need])
        return [
            Run(parse_name(label)[0], s, rows[next(picks)], source=f"pool {label} seed {s}")
            for label in labels
            for s in range(seeds)
        ]

    return draw


def seeds_needed(p: Power, plant: str, effect: float, share: float = 0.8) -> int | None:
    """The fewest seeds of ``p.seeds`` at which plant ``plant`` is decided rightly in at
    least ``share`` of the replicates under the report's rule at ``effect`` σ (one of
    ``p.effects``); None when none of them reaches it."""
    by_n = p.decisive.get(plant, {})
    for n in sorted(by_n):
        if effect in by_n[n] and by_n[n][effect][0] >= share:
            return n
    return None


def _first(c: Check, n: int) -> dict:
    return {lab: {s: v for s, v in d.items() if s < n} for lab, d in c.values.items()}


def _count(
    acc: np.ndarray,
    name: str,
    effect: float,
    verdict: tuple[str | None, str | None],
    step_control: bool = True,
) -> None:
    rule, alone = verdict
    want = truth(name, effect, step_control)
    acc += (
        rule == want,
        alone == want,
        is_false(name, effect, rule, step_control),
        is_false(name, effect, alone, step_control),
    )


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
        f"{p.replicates} replicates of up to {max(p.seeds)} seeds per arm (noise: {p.noise}), "
        f"judged by `rescue.judge` ({seconds:.0f} s). Each cell: the share of replicates, under the "
        "report's family-wise rule / alone. Decisive: the verdict the truth makes (with an "
        "effect `as predicted` for P3, P4, P5 and `opposite` for the equivalences P6 and P7 "
        "online, planted beyond their margin; with none `no difference`, or `as predicted` "
        "for an equivalence). False claims: with no effect `as predicted` or `opposite` (P3, "
        "P4, P5), `opposite` (P6, P7 online).",
        "",
    ]
    effects = [e for e in p.effects if e > 0]
    for pid in p.predictions:
        plant = PLANTS[pid]
        step_control = any(lab.startswith("step-control") for lab in p.labels)
        how = (f": {plant.title}, true verdict `{plant.verdict(step_control)}`"
               if plant.title else "")  # fmt: skip
        lines += [
            f"**{pid}**{how} (σ: the SD of the deciding check's per-seed differences)",
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
