"""What the predictions measure, per logged row, and the windows they are pooled over.

Specification
-------------
A quantity gives each history row a numerator and a denominator; its value over a
window of steps is ``Σ num / Σ den`` (counts summed, then divided: a step with more
rollouts weighs more). Quantities of the policy's behaviour read the first source a run
logs: ``rollout/census/generated/`` (every rollout of every group that entered the
census, trained, dropped, aborted or filtered alike: the simulator, the Miles buffer and
the slime drain log it from the same ``rescue.census`` code), else ``sim/generated/``
(the simulator's name for the same view before the census logged it), else
``rollout/census/`` (the rollouts of the groups the trainer trained), else
``rollout/census/samples/`` (the batch Miles trains, from ``rescue.miles.log``: the only
census a run of Miles' synchronous trainer logs, the single-turn and text-game arms, where
the batch is every rollout of the step but the groups its filter drops). The batch
quantities (b, the dropped share) read ``rollout/census/``, else ``rollout/census/samples/``. A check that is a
claim about generation reads only the generated views (``series(..., GENERATED)``) and
refuses trained-only data. A quantity whose keys a run never logged raises ``MissingKey``
naming the key.

b, the x axis of P3 and of the two-outcome control, is one functional of the trained
batch for every arm (``b``): the realized all-members baseline, the mean reward of every
rollout of the trained groups with budget failures scored 0 and loss-masked rollouts
included (``rollout/census/b_all``). Runs logged before the census had that key give it
as ``b_realized × (1 − masked_frac)``, the same number when the masked rollouts are
budget failures scored 0 (what every masking arm masks). It is never the baseline paid to
masked rollouts for one arm and the realized one for another: two arms are compared at
the same b only when b means the same thing in both.

Windows (fixed here, before any run is looked at):

- ``final``: the last ``FINAL_FRACTION`` of the steps both runs of a pair reached;
- ``whole``: every step both runs reached;
- ``matched b`` (``windows.matched_b``): per seed, the steps at which each arm's prior b
  (b pooled over the ``B_SMOOTH`` steps before the step: ``prior``; it shares no rollout
  with the step whose value is read) exceeds ``B_THRESHOLD`` and lies in the range of b
  both arms reached there; at least ``MIN_MATCHED_STEPS`` such steps per arm, else the
  seed has no value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rescue.census import PRIOR_STEPS
from rescue.judge.runs import Run

CENSUS = "rollout/census/"
#: Every generated rollout, as the census logs it (simulator, Miles buffer, slime drain).
GEN = CENSUS + "generated/"
#: The simulator's earlier name of the same view (outputs written before the census had it).
SIM_GEN = "sim/generated/"
#: The generated views, newest name first: what a claim about generation reads.
GENERATED = (GEN, SIM_GEN)
#: The census of the batch Miles trains (``rescue.miles.log``), the synchronous runs' only one.
SAMPLES = CENSUS + "samples/"
#: The policy's behaviour: the generated views, else the trained groups' census, else the
#: trained batch's.
BEHAVIOUR = (GEN, SIM_GEN, CENSUS, SAMPLES)
#: The trained batch: the group census, else the sample census.
BATCH = (CENSUS, SAMPLES)

#: Fraction of the common steps that makes the final window.
FINAL_FRACTION = 0.2
#: b above which P3 expects the mask arm's cap-hit rate to stop falling.
B_THRESHOLD = 0.3
#: Steps over which b is pooled: the steps before a step, for its prior b (the census'
#: ``b_prior``, ``rescue.census.PRIOR_STEPS``), and the trailing steps of ``crossing``.
B_SMOOTH = PRIOR_STEPS
#: Fewest steps per arm in the shared range of b for a seed to have a matched-b value.
MIN_MATCHED_STEPS = 10
B_ALL = CENSUS + "b_all"
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

    def source(self, run: Run, sources: tuple[str, ...] | None = None) -> str:
        """The prefix this run's values come from (the first of ``sources``, default the
        quantity's own, the run logs); ``MissingKey`` when none is logged."""
        sources = self.sources if sources is None else sources
        missing = [self._missing(run, p) for p in sources]
        for prefix, m in zip(sources, missing, strict=True):
            if m is None:
                return prefix
        # Name the key of the source the run logs something of (else the first source).
        keys = (*self.required, *self.any_of)
        i = next((i for i, p in enumerate(sources) if any(run.has(p + k) for k in keys)), 0)
        raise MissingKey(str(missing[i]), run)


def _z(run: Run, key: str) -> np.ndarray:
    """The column with NaN read as 0 (an outcome that did not occur has no turns key)."""
    return run.zeroed(key)


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


def _b(r: Run, p: str) -> Rows:
    """``b_all`` per row; where a row lacks it, ``b_realized × (1 − masked_frac)``."""
    b = r.column(p + "b_all") if r.has(p + "b_all") else np.full(len(r.rows), np.nan)
    old = r.column(p + "b_realized") * (1.0 - _z(r, p + "masked_frac"))
    b = np.where(np.isfinite(b), b, old)
    n = _z(r, p + "rollouts") * np.isfinite(b)
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
            "b",
            "b (realized, all members)",
            BATCH,
            ("rollouts",),
            _b,
            ("b_all", "b_realized"),
        ),
        Quantity(
            "b_realized",
            "realized baseline of the unmasked rollouts (mean reward of trained, unmasked rollouts)",
            BATCH,
            ("rollouts", "b_realized"),
            _b_realized,
        ),
        Quantity(
            "b_paid",
            "baseline paid to loss-masked rollouts",
            BATCH,
            ("b_paid/masked", "b_paid/masked_rollouts"),
            _b_paid,
        ),
        Quantity(
            "dropped",
            "dropped-stale share of groups",
            BATCH,
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
            "update_norm",
            "update norm (the step's ‖Δθ‖)",
            ("sim/", "train/rescue/"),
            ("update_norm",),
            _per_row("update_norm"),
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


def prior(s: Series, window: int, stop: float) -> np.ndarray:
    """The series pooled over the ``window`` steps *before* each integer step 0..stop (the
    value at step t pools steps t − window .. t − 1; NaN where none of them counted)."""
    _, pooled = s.trailing(window, stop)
    out = np.full(pooled.shape, np.nan)
    out[1:] = pooled[:-1]
    return out


def series(run: Run, quantity: Quantity | str, sources: tuple[str, ...] | None = None) -> Series:
    """The quantity's rows of one run (``MissingKey`` when it was not logged), read from
    the first of ``sources`` (default the quantity's own) the run logs."""
    q = QUANTITIES[quantity] if isinstance(quantity, str) else quantity
    prefix = q.source(run, sources)
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
    steps, b = series(run, "b").trailing(B_SMOOTH)
    above = np.flatnonzero(np.nan_to_num(b, nan=-1.0) > B_THRESHOLD)
    return float(steps[above[0]]) if above.size else float("nan")
