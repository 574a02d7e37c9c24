"""What the predictions measure, per logged row, and the windows they are pooled over.

Specification
-------------
A quantity gives each history row a numerator and a denominator; its value over a
window of steps is ``Σ num / Σ den`` (counts summed, then divided: a step with more
rollouts weighs more). Quantities of the policy's behaviour read the first source a run
logs: ``sim/generated/`` (every rollout the simulator generated, trained or not), else
``rollout/census/`` (the rollouts of the groups the cluster's buffer settled as trained).
A quantity whose keys a run never logged raises ``MissingKey`` naming the key.

The baseline paid to excluded rollouts, the x axis of P3 and P4, is an arm's
``rollout/census/b_paid/masked`` when the arm loss-masks (``mask``, ``survivor``,
``matched``, ``drgrpo-mask``) and its ``rollout/census/b_realized`` when it excludes
nothing (the baseline its capped rollouts are scored against): decided by the arm, never
by which key happens to be there.

Windows (fixed here, before any run is looked at):

- ``final``: the last ``FINAL_FRACTION`` of the steps both runs of a pair reached;
- ``whole``: every step;
- ``after b``: from the first step at which the arm's b, pooled over the trailing
  ``B_SMOOTH`` steps, exceeds ``B_THRESHOLD``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rescue.judge.runs import Run

GEN = "sim/generated/"
CENSUS = "rollout/census/"
BEHAVIOUR = (GEN, CENSUS)

#: Fraction of the common steps that makes the final window.
FINAL_FRACTION = 0.2
#: b above which P3 expects the mask arm's cap-hit rate to stop falling.
B_THRESHOLD = 0.3
#: Trailing steps over which b is pooled before it is compared with ``B_THRESHOLD``.
B_SMOOTH = 10
#: Arms that loss-mask capped rollouts (their b is the baseline paid to the masked ones).
MASKING_ARMS = frozenset({"mask", "survivor", "matched", "drgrpo-mask"})
B_PAID = CENSUS + "b_paid/masked"
B_PAID_N = CENSUS + "b_paid/masked_rollouts"
B_REALIZED = CENSUS + "b_realized"


class MissingKey(KeyError):
    """A run never logged a key a quantity needs."""

    def __init__(self, key: str, run: Run | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.run = run

    def __str__(self) -> str:
        who = f" ({self.run.label} seed {self.run.seed})" if self.run is not None else ""
        return f"missing key {self.key}{who}"


Rows = tuple[np.ndarray, np.ndarray]  # (num, den) per row; den 0 where the row does not count


@dataclass(frozen=True)
class Quantity:
    """One measured quantity.

    Attributes:
        name: short name (``cap_hit``).
        title: what it is, in words.
        sources: key prefixes, the first a run logs is used.
        required: keys (after the prefix) a run must have logged.
        rows: ``(run, prefix) -> (num, den)`` per row.
        any_of: keys of which a run must have logged at least one (turns of failures:
            submitted or capped ones).
    """

    name: str
    title: str
    sources: tuple[str, ...]
    required: tuple[str, ...]
    rows: Callable[[Run, str], Rows]
    any_of: tuple[str, ...] = ()

    def _missing(self, run: Run, prefix: str) -> str | None:
        for k in self.required:
            if not run.has(prefix + k):
                return prefix + k
        if self.any_of and not any(run.has(prefix + k) for k in self.any_of):
            return " or ".join(prefix + k for k in self.any_of)
        return None

    def source(self, run: Run) -> str:
        """The prefix this run's values come from; ``MissingKey`` when none is logged."""
        missing = [self._missing(run, p) for p in self.sources]
        for prefix, m in zip(self.sources, missing, strict=True):
            if m is None:
                return prefix
        # Name the key of the source the run logs something of (else the last source).
        keys = (*self.required, *self.any_of)
        i = next(
            (i for i, p in enumerate(self.sources) if any(run.has(p + k) for k in keys)),
            len(self.sources) - 1,
        )
        raise MissingKey(str(missing[i]), run)


def _z(run: Run, key: str) -> np.ndarray:
    """The column with NaN read as 0 (an outcome that did not occur has no turns key)."""
    return np.nan_to_num(run.column(key), nan=0.0)


def _rate(outcome: str) -> Callable[[Run, str], Rows]:
    return lambda r, p: (_z(r, p + f"outcome/{outcome}"), _z(r, p + "rollouts"))


def _turns(*outcomes: str) -> Callable[[Run, str], Rows]:
    def rows(r: Run, p: str) -> Rows:
        num = sum(_z(r, p + f"turns_mean/{o}") * _z(r, p + f"outcome/{o}") for o in outcomes)
        den = sum(
            _z(r, p + f"outcome/{o}") * np.isfinite(r.column(p + f"turns_mean/{o}"))
            for o in outcomes
        )
        return np.asarray(num, float), np.asarray(den, float)

    return rows


def _ran_tests(r: Run, p: str) -> Rows:
    rate = r.column(p + "ran_tests_rate/solved")
    n = _z(r, p + "outcome/solved") * np.isfinite(rate)
    return np.nan_to_num(rate) * n, n


def _b_realized(r: Run, p: str) -> Rows:
    b = r.column(p + "b_realized")
    n = _z(r, p + "rollouts") * (1.0 - _z(r, p + "masked_frac")) * np.isfinite(b)
    return np.nan_to_num(b) * n, n


def _b_paid(r: Run, p: str) -> Rows:
    b = r.column(p + "b_paid/masked")
    n = _z(r, p + "b_paid/masked_rollouts") * np.isfinite(b)
    return np.nan_to_num(b) * n, n


def _per_row(key: str) -> Callable[[Run, str], Rows]:
    def rows(r: Run, p: str) -> Rows:
        v = r.column(p + key)
        return np.nan_to_num(v), np.isfinite(v).astype(float)

    return rows


def _dropped(r: Run, p: str) -> Rows:
    d = _z(r, p + "groups/dropped_stale")
    trained = sum(
        _z(r, p + f"groups/{b}") for b in ("trained_fresh", "trained_stale", "trained_protected")
    )
    return d, d + trained


_FAILED = ("submitted_failure", "budget_failure")
_ENDED = ("solved", *_FAILED)

QUANTITIES: dict[str, Quantity] = {
    q.name: q
    for q in (
        Quantity(
            "success", "success rate", BEHAVIOUR, ("rollouts", "outcome/solved"), _rate("solved")
        ),
        Quantity(
            "cap_hit",
            "cap-hit rate",
            BEHAVIOUR,
            ("rollouts", "cap_hit_rate"),
            lambda r, p: (_z(r, p + "cap_hit_rate") * _z(r, p + "rollouts"), _z(r, p + "rollouts")),
        ),
        Quantity(
            "submitted_failure",
            "submitted-failure rate",
            BEHAVIOUR,
            ("rollouts", "outcome/submitted_failure"),
            _rate("submitted_failure"),
        ),
        Quantity(
            "turns_solved",
            "turns of successes",
            BEHAVIOUR,
            ("outcome/solved", "turns_mean/solved"),
            _turns("solved"),
        ),
        Quantity(
            "turns_failed",
            "turns of failures (submitted or capped)",
            BEHAVIOUR,
            ("outcome/submitted_failure", "outcome/budget_failure"),
            _turns(*_FAILED),
            ("turns_mean/submitted_failure", "turns_mean/budget_failure"),
        ),
        Quantity(
            "turns",
            "episode length (turns of every ended rollout)",
            BEHAVIOUR,
            tuple(f"outcome/{o}" for o in _ENDED),
            _turns(*_ENDED),
            tuple(f"turns_mean/{o}" for o in _ENDED),
        ),
        Quantity(
            "ran_tests_solved",
            "test-run rate among successes",
            BEHAVIOUR,
            ("outcome/solved", "ran_tests_rate/solved"),
            _ran_tests,
        ),
        Quantity(
            "b_realized",
            "realized baseline b (mean reward of trained, unmasked rollouts)",
            (CENSUS,),
            ("rollouts", "b_realized"),
            _b_realized,
        ),
        Quantity(
            "b_paid",
            "baseline paid to loss-masked rollouts",
            (CENSUS,),
            ("b_paid/masked", "b_paid/masked_rollouts"),
            _b_paid,
        ),
        Quantity(
            "dropped",
            "dropped-stale share of groups",
            (CENSUS,),
            ("groups/dropped_stale",),
            _dropped,
        ),
        Quantity(
            "p_thorough",
            "P(thorough) strategy share",
            ("sim/",),
            ("p_thorough",),
            _per_row("p_thorough"),
        ),
        Quantity(
            "sandbox_s",
            "sandbox seconds per trained sample",
            ("perf/",),
            ("non_generation_time/mean",),
            _per_row("non_generation_time/mean"),
        ),
    )
}

#: Keys of the wall-clock, in order of preference: the simulator's clock, wandb's runtime.
WALL_CLOCK_KEYS: tuple[str, ...] = ("sim/time", "_runtime")


def b_quantity(run: Run) -> Quantity:
    """The b a run's arm is judged against: paid to masked rollouts, or realized."""
    return QUANTITIES["b_paid" if run.condition.base_arm in MASKING_ARMS else "b_realized"]


@dataclass
class Series:
    """A quantity's (num, den) per logged row of one run, ordered by step."""

    step: np.ndarray
    num: np.ndarray
    den: np.ndarray
    source: str

    @property
    def last_step(self) -> float:
        return float(self.step.max()) if self.step.size else float("nan")

    def values(self) -> np.ndarray:
        """Per-row value ``num / den`` (NaN where the row does not count)."""
        return np.divide(
            self.num, self.den, out=np.full(self.num.shape, np.nan), where=self.den > 0
        )

    def pooled(self, start: float = -np.inf, stop: float = np.inf) -> float:
        """``Σ num / Σ den`` over the rows with ``start <= step <= stop`` (NaN when empty)."""
        sel = (self.step >= start) & (self.step <= stop)
        den = float(self.den[sel].sum())
        return float(self.num[sel].sum()) / den if den > 0 else float("nan")

    def trailing(self, window: int, stop: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, value pooled over the trailing window)`` per integer step 0..stop."""
        last_f = self.last_step if stop is None else float(stop)
        last = int(last_f) if np.isfinite(last_f) else -1
        n = last + 1
        num = np.zeros(max(n, 0))
        den = np.zeros(max(n, 0))
        sel = (self.step >= 0) & (self.step <= last)
        idx = self.step[sel].astype(int)
        np.add.at(num, idx, self.num[sel])
        np.add.at(den, idx, self.den[sel])
        cn, cd = np.concatenate(([0.0], np.cumsum(num))), np.concatenate(([0.0], np.cumsum(den)))
        hi = np.arange(1, n + 1)
        lo = np.maximum(hi - max(int(window), 1), 0)
        wn, wd = cn[hi] - cn[lo], cd[hi] - cd[lo]
        return np.arange(n, dtype=float), np.divide(
            wn, wd, out=np.full(wn.shape, np.nan), where=wd > 0
        )


def series(run: Run, quantity: Quantity | str) -> Series:
    """The quantity's rows of one run (``MissingKey`` when it was not logged)."""
    q = QUANTITIES[quantity] if isinstance(quantity, str) else quantity
    prefix = q.source(run)
    num, den = q.rows(run, prefix)
    step = run.steps()
    ok = np.isfinite(num) & np.isfinite(den) & (den > 0)
    order = np.argsort(step[ok], kind="stable")
    return Series(step[ok][order], num[ok][order], den[ok][order], prefix)


def wall_clock(run: Run) -> Series:
    """The run's clock per row (``sim/time`` or wandb's ``_runtime``), as a level series."""
    for key in WALL_CLOCK_KEYS:
        if run.has(key):
            v = run.column(key)
            ok = np.isfinite(v)
            step = run.steps()[ok]
            order = np.argsort(step, kind="stable")
            return Series(step[order], v[ok][order], np.ones(int(ok.sum())), key)
    raise MissingKey(" or ".join(WALL_CLOCK_KEYS), run)


def final_start(stop: float) -> float:
    """First step of the final window of steps 0..stop."""
    n = int(stop) + 1
    return float(n - max(1, round(FINAL_FRACTION * n)))


def crossing(run: Run) -> float:
    """First step at which the run's b, pooled over ``B_SMOOTH`` steps, exceeds ``B_THRESHOLD``.

    NaN when it never does; ``MissingKey`` when the run did not log its b.
    """
    steps, b = series(run, b_quantity(run)).trailing(B_SMOOTH)
    above = np.flatnonzero(np.nan_to_num(b, nan=-1.0) > B_THRESHOLD)
    return float(steps[above[0]]) if above.size else float("nan")
