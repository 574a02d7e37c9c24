"""The outcome census: where every group went, and what the trained rollouts were.

Invariant
---------
Every entry (one group entering the buffer; a recycled group enters again as a new entry)
lands in exactly one bucket, or is still buffered::

    entered + carried == trained_fresh + trained_stale + trained_protected
                         + dropped_stale + aborted + filtered + lost + lost_at_restart
                         + buffered

``Census`` checks this at every ``step_metrics`` call, and against the adapter's own queue
length when it is given one. ``carried`` is zero but in a run resumed from a checkpoint
(``restart``): the entries an earlier life left open, counted entered there. A group is never silently lost: whatever excluded it is a
bucket with a count. ``lost`` is the bucket of a group whose generation raised (slime's
fully-async worker logs the exception of ``generate_and_rm_group``, e.g. a remote reward
model after its retries, and the group is gone); ``groups/requeued`` counts the
``aborted`` entries whose prompt group went back to be generated again (slime requeues
every group aborted at a weight update; Miles' ``retry`` handler recycles), so
``requeued <= aborted`` at every step.

``lost_at_restart`` is the bucket of the groups a restart loses (``restart``): a run killed
and resumed from its checkpoint of step N gets back the trainer's weights and the data
source's counters, not its buffer nor the groups in flight, so the groups drawn before the
checkpoint that no census up to step N settled never come back. The first census of the
later life settles them here, once: an infrastructure bucket (no result), never trained
and never a failure. ``carried`` of them were open in the earlier life (buffered at its
census of step N, entered there); the ``unseen`` others had not entered (in flight, or
settled only in a step after N that the later life trains again) and enter here.

Groups without a result (``no_result``, the one rule the Miles buffer, the slime drain
and the simulator apply when a group arrives): a group with any rollout classified
``infra_no_result`` (an aborted sample, a trial timeout, a lost container, an endpoint or
grader fault, an agent function that returned nothing) has no trustworthy reward for
that rollout, and its group baseline would be computed without it. It never reaches the
loss: the caller sends it where the trainer sends an aborted group (Miles' unused
handler, ``drop`` or ``retry``; slime and the simulator discard it) in every arm, and
settles it ``aborted`` with the reason of its first such rollout. Miles itself excludes
only groups with an ABORTED sample, which its session server sets only when no model
call happened; any later fault would otherwise be trained as a failure with reward 0.

What a step reports (keys under ``rollout/census/`` by default, the same in the simulator
and on the cluster):

- ``groups/<bucket>`` entries settled this step, ``groups/entered``, ``groups/buffered``
  (``groups/lost_at_restart``: the groups a restart lost, in the first step of a resumed
  life; 0 otherwise);
- ``staleness_mean``, ``staleness_max`` of the trained groups;
- ``protected_groups`` and ``protected_weight_mean`` (the 1/a weights);
- ``outcome_metrics`` of the rollouts of trained groups: count and rate per outcome, turn
  count mean / p50 / p90 per outcome, cap-hit rate, masked fraction per outcome, the
  realized baseline ``b`` (mean reward of trained, unmasked rollouts), the rate at
  which solved rollouts ran tests before submitting, and ``reason/<outcome>/<reason>``:
  the count per classifier reason (keys only for reasons that occurred);
- ``b_all``: the realized all-members baseline, the mean reward of every scored rollout
  of the trained groups, loss-masked ones included and a budget failure scored 0 (the
  plan's R = 0 convention), whatever the arm did with it: the one b every arm is compared
  on (the judge's P3 axis). ``b_realized`` is the mean over the unmasked rollouts only;
- ``b_prior``: ``b_all`` pooled over the ``PRIOR_STEPS`` steps *before* this one (weighted
  by their ``rollouts``; left out until an earlier step trained something). It is the x
  axis of every trend against b (``PriorB``): a step's own ``b_all`` and its cap-hit rate
  are read off the same rollouts (a capped rollout adds to one and scores 0 in the other),
  so their noise is coupled and a slope of one on the other reads that noise; the steps
  before share no rollout with this one;
- ``generated/*``: the same outcome metrics (counts and rates per outcome, turn counts per
  outcome, cap-hit rate, ran-tests rate of successes) over every rollout of every group
  that *entered* the census this step (``enter(group_id, rollouts)``): trained, dropped,
  aborted, filtered or still buffered alike, so that a comparison of behaviour between
  arms never compares one arm's survivors with another's everything. What the trainer did
  with a rollout (``masked_frac``, ``b_realized``, ``b_all``) is not part of this view;
- ``dropped/outcome/<outcome>``: the outcomes of the rollouts in dropped stale groups,
  which is where an outcome-dependent drop shows;
- the baseline paid to excluded rollouts: ``b_paid/masked``, the mean over the loss-masked
  rollouts of trained groups of their own group's baseline under the run's population
  (``Census(population=...)``, ``rescue.advantages.group_baseline``: the group mean for
  ``all``, the survivors' mean for ``survivors``), and ``b_paid/dropped``, the mean over
  the rollouts of dropped stale groups of their own group's mean reward; each with its
  count (``b_paid/masked_rollouts``, ``b_paid/dropped_rollouts``, always logged; the means
  only when the count is not 0); rollouts without a reward neither vote nor count;
- ``aborted/reason/<reason>``: the groups settled ``aborted`` this step, by the reason
  ``no_result`` gave (keys only for reasons that occurred); ``groups/requeued`` (always
  logged): those of them sent back to be generated again;
- ``lost/reason/<reason>``: the groups settled ``lost`` this step, by the reason the
  caller gave (the exception's class name; keys only for reasons that occurred);
- the groups dropped for a no-result rollout (the ``aborted`` bucket less the requeued) as a count and a
  fraction of the groups that entered this step: ``no_result/groups`` (always logged),
  ``no_result/fraction`` (when some group entered) and ``no_result/fraction/<reason>`` per
  reason. A fraction that grows is an exclusion to look at, and what the run's watchdog
  (``rescue.watchdog``) stops on.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from rescue.advantages import POPULATIONS, group_baseline
from rescue.errors import InputError
from rescue.gate import Decision
from rescue.outcomes import OUTCOMES, Outcome, classify, is_capped

PREFIX = "rollout/census/"
#: Sub-prefix of the outcome metrics over every generated rollout (``enter``).
GENERATED = "generated/"
#: Steps before the current one whose ``b_all`` is pooled into ``b_prior``.
PRIOR_STEPS = 10


class Bucket(str, Enum):
    """Where an entry ended. An entry not yet settled is *buffered*."""

    TRAINED_FRESH = "trained_fresh"
    TRAINED_STALE = "trained_stale"  # stale, weight 1: never-drop; protect a=1; pace past K
    TRAINED_PROTECTED = "trained_protected"  # stale, kept by the coin with weight 1/a
    DROPPED_STALE = "dropped_stale"
    ABORTED = "aborted"
    FILTERED = "filtered"  # rejected by the dynamic-sampling filter
    LOST = "lost"  # its generation raised: the group never came back
    LOST_AT_RESTART = "lost_at_restart"  # drawn before the checkpoint a run resumed from

    @property
    def trained(self) -> bool:
        return self in _TRAINED

    @classmethod
    def after_gate(cls, decision: Decision) -> Bucket:
        """Where the gate's decision puts a group: the one mapping every caller uses.

        Not kept: ``dropped_stale``. Kept: ``trained_protected`` when protected (stale,
        weight ``1/a != 1``), ``trained_stale`` when stale with weight 1, else
        ``trained_fresh``.
        """
        if not decision.keep:
            return cls.DROPPED_STALE
        if decision.protected:
            return cls.TRAINED_PROTECTED
        return cls.TRAINED_STALE if decision.stale else cls.TRAINED_FRESH


_TRAINED = frozenset({Bucket.TRAINED_FRESH, Bucket.TRAINED_STALE, Bucket.TRAINED_PROTECTED})


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout (all turns of one trajectory) as the census sees it.

    Attributes:
        outcome: its class (``rescue.outcomes``).
        reward: scalar reward, ``None`` when there is none; a NaN or infinite reward is
            stored as ``None`` (``classify`` calls it ``infra_no_result``), so it never
            enters a mean such as ``b_realized``.
        turns: number of turns (model calls), ``None`` when unknown.
        capped: hit the turn cap or a length/context limit (``outcomes.is_capped``).
        masked: excluded from the loss by a filter (Miles ``remove_sample``).
        ran_tests: ran the repository's tests before submitting (``None`` = unknown).
        reason: the classifier's reason label.
    """

    outcome: Outcome
    reward: float | None = None
    turns: int | None = None
    capped: bool = False
    masked: bool = False
    ran_tests: bool | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.reward is not None and not math.isfinite(self.reward):
            object.__setattr__(self, "reward", None)

    @classmethod
    def from_sample_fields(
        cls,
        *,
        status: Any = None,
        reward: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        remove_sample: bool = False,
        turns: int | None = None,
        agentic: bool | None = None,
    ) -> RolloutRecord:
        """A record from the fields every framework's sample has, through ``classify``.

        ``turns`` defaults to ``metadata["turns"]`` or ``metadata["agent_metrics"]["turns"]``;
        ``ran_tests`` comes from ``metadata["ran_repo_tests"]`` (the SWE agent's flag).
        """
        metadata = metadata or {}
        c = classify(status=status, reward=reward, metadata=metadata, agentic=agentic)
        if turns is None:
            turns = metadata.get("turns", (metadata.get("agent_metrics") or {}).get("turns"))
        ran = metadata.get("ran_repo_tests")
        return cls(
            outcome=c.outcome,
            reward=None if reward is None else float(reward),
            turns=None if turns is None else int(turns),
            capped=is_capped(c),
            masked=bool(remove_sample),
            ran_tests=None if ran is None else bool(ran),
            reason=c.reason,
        )


def no_result(records: Iterable[RolloutRecord]) -> str | None:
    """Why a group has no result: its first ``infra_no_result`` rollout's reason, else None.

    The rule in the module docstring; a record without a reason gives ``"no_result"``.
    """
    for r in records:
        if r.outcome is Outcome.INFRA_NO_RESULT:
            return r.reason or "no_result"
    return None


def outcome_metrics(
    records: Sequence[RolloutRecord], prefix: str = PREFIX, *, trained: bool = True
) -> dict[str, float]:
    """Sample-level census of a set of rollouts (keys documented in the module docstring).

    ``trained=False`` (the ``generated/`` view) leaves out what the trainer did with the
    rollouts: the masked fractions and the realized baselines. Keys whose population is
    empty (e.g. turn quantiles of an outcome that did not occur) are left out rather than
    reported as NaN. One pass over the records, plain Python: it runs on every step of the
    trainer, over a few hundred records.
    """
    n = len(records)
    out: dict[str, float] = {f"{prefix}rollouts": float(n)}
    if n == 0:
        return out
    count = dict.fromkeys(OUTCOMES, 0)
    masked = dict.fromkeys(OUTCOMES, 0)
    turns: dict[Outcome, list[int]] = {o: [] for o in OUTCOMES}
    capped = 0
    reward_sum, reward_n = 0.0, 0
    all_sum, all_n = 0.0, 0
    ran, ran_n = 0, 0
    reasons: Counter[tuple[str, str]] = Counter()
    for r in records:
        o = r.outcome
        count[o] += 1
        reasons[o.value, r.reason or "unknown"] += 1
        if r.reward is not None:
            all_sum += 0.0 if o is Outcome.BUDGET_FAILURE else r.reward
            all_n += 1
        if r.masked:
            masked[o] += 1
        elif r.reward is not None:
            reward_sum += r.reward
            reward_n += 1
        if r.turns is not None:
            turns[o].append(r.turns)
        capped += r.capped
        if o is Outcome.SOLVED and r.ran_tests is not None:
            ran += r.ran_tests
            ran_n += 1
    for o in OUTCOMES:
        k = count[o]
        out[f"{prefix}outcome/{o.value}"] = float(k)
        out[f"{prefix}outcome/{o.value}_rate"] = k / n
        if not k:
            continue
        if trained:
            out[f"{prefix}masked_frac/{o.value}"] = masked[o] / k
        if t := sorted(turns[o]):
            out[f"{prefix}turns_mean/{o.value}"] = sum(t) / len(t)
            out[f"{prefix}turns_p50/{o.value}"] = quantile(t, 0.5)
            out[f"{prefix}turns_p90/{o.value}"] = quantile(t, 0.9)
    for (o, why), k in sorted(reasons.items()):
        out[f"{prefix}reason/{o}/{why}"] = float(k)
    out[f"{prefix}cap_hit_rate"] = capped / n
    if trained:
        out[f"{prefix}masked_frac"] = sum(masked.values()) / n
        if reward_n:
            out[f"{prefix}b_realized"] = reward_sum / reward_n
        if all_n:
            out[f"{prefix}b_all"] = all_sum / all_n
    if ran_n:
        out[f"{prefix}ran_tests_rate/solved"] = ran / ran_n
    return out


class PriorB:
    """``b_prior``: ``b_all`` pooled over the ``steps`` steps before the current one.

    ``observe(metrics, prefix)`` adds ``<prefix>b_prior`` to a step's metrics from the steps
    it saw before, then remembers this step's ``b_all`` weighted by its ``rollouts``. The
    pooling is the judge's (``Σ b·n / Σ n``), so the key equals what ``rescue report``
    computes from the logged ``b_all`` series of a run without gaps.
    """

    def __init__(self, steps: int = PRIOR_STEPS) -> None:
        if steps < 1:
            raise InputError(f"PriorB steps={steps}; allowed: an integer >= 1")
        self.steps = steps
        self._past: list[tuple[float, float]] = []  # (Σ b·n, n) of each earlier step

    def observe(self, metrics: dict[str, float], prefix: str = PREFIX) -> dict[str, float]:
        total = sum(x for x, _ in self._past)
        n = sum(k for _, k in self._past)
        if n > 0:
            metrics[f"{prefix}b_prior"] = total / n
        b, k = metrics.get(f"{prefix}b_all"), metrics.get(f"{prefix}rollouts", 0.0)
        ok = b is not None and math.isfinite(b) and k > 0
        self._past.append((b * k, k) if ok else (0.0, 0.0))
        del self._past[: -self.steps]
        return metrics


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linear interpolation (numpy's default method)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


class Census:
    """Per-step accumulator of entries, their buckets, and the rollouts of trained groups.

    Args:
        population: the run's baseline population (``all``, default, as Miles: masked
            rollouts vote; ``survivors``), for ``b_paid/masked``.
    """

    def __init__(self, population: str = "all") -> None:
        if population not in POPULATIONS:
            raise InputError(f"population={population!r}; allowed: {', '.join(POPULATIONS)}")
        self.population = population
        self._open: Counter[Any] = Counter()  # group id -> open entries
        self._entered = 0
        self._carried = 0  # entries an earlier life left open (``restart``)
        self._settled: Counter[Bucket] = Counter()
        self._prior = PriorB()
        self._reset_window()

    def _reset_window(self) -> None:
        self._w_entered = 0
        self._w_buckets: Counter[Bucket] = Counter()
        self._w_trained: list[RolloutRecord] = []
        self._w_generated: list[RolloutRecord] = []
        self._w_dropped: list[RolloutRecord] = []
        self._w_staleness: list[float] = []
        self._w_protected_weights: list[float] = []
        self._w_paid = {"masked": [0.0, 0], "dropped": [0.0, 0]}  # Σ baseline, rollouts
        self._w_aborted_reasons: Counter[str] = Counter()
        self._w_lost_reasons: Counter[str] = Counter()
        self._w_requeued = 0
        self._w_no_result_reasons: Counter[str] = Counter()  # aborted and not requeued

    def enter(self, group_id: Any, rollouts: Iterable[RolloutRecord] = ()) -> None:
        """A group entered the buffer (Miles ``put``): one entry opens.

        ``rollouts``: the group's records as generated; they are counted in the step's
        ``generated/`` view whatever becomes of the group.
        """
        self._open[group_id] += 1
        self._entered += 1
        self._w_entered += 1
        self._w_generated.extend(rollouts)

    def settle(
        self,
        group_id: Any,
        bucket: Bucket,
        rollouts: Iterable[RolloutRecord] = (),
        *,
        staleness: float | None = None,
        weight: float = 1.0,
        reason: str | None = None,
        requeued: bool = False,
    ) -> None:
        """Close the oldest open entry of ``group_id`` into ``bucket``.

        ``reason`` says why an ``aborted`` group had no result (``no_result``; default
        ``"aborted"``) or why a ``lost`` one was lost (default ``"exception"``); other
        buckets take none. ``requeued``: an ``aborted`` group sent back to be generated
        again (``groups/requeued``).
        """
        bucket = Bucket(bucket)
        if reason is not None and bucket not in (Bucket.ABORTED, Bucket.LOST):
            raise ValueError(f"census: a reason is for aborted or lost groups, not {bucket.value}")
        if requeued and bucket is not Bucket.ABORTED:
            raise ValueError(f"census: only an aborted group is requeued, not {bucket.value}")
        if self._open[group_id] <= 0:
            del self._open[group_id]
            raise ValueError(
                f"census: group {group_id!r} settled as {bucket.value} but has no open entry "
                "(settled twice, or never entered)"
            )
        self._open[group_id] -= 1
        if self._open[group_id] == 0:
            del self._open[group_id]
        self._settled[bucket] += 1
        self._w_buckets[bucket] += 1
        if bucket.trained:
            rollouts = list(rollouts)
            self._w_trained.extend(rollouts)
            self._pay_masked(rollouts)
            if staleness is not None:
                self._w_staleness.append(float(staleness))
            if bucket is Bucket.TRAINED_PROTECTED:
                self._w_protected_weights.append(float(weight))
        elif bucket is Bucket.DROPPED_STALE:
            rollouts = list(rollouts)
            self._w_dropped.extend(rollouts)
            scored = [r.reward for r in rollouts if r.reward is not None]
            if scored:  # each rollout is paid its own group's mean reward
                paid = self._w_paid["dropped"]
                paid[0] += sum(scored)
                paid[1] += len(scored)
        elif bucket is Bucket.ABORTED:
            self._w_aborted_reasons[reason or "aborted"] += 1
            self._w_requeued += bool(requeued)
            if not requeued:
                self._w_no_result_reasons[reason or "aborted"] += 1
        elif bucket is Bucket.LOST:
            self._w_lost_reasons[reason or "exception"] += 1

    def restart(self, carried: int, unseen: int) -> None:
        """The run resumed from a checkpoint: settle the groups the restart lost as
        ``lost_at_restart`` in this window (module docstring). ``carried``: entries the
        earlier life left open at the checkpoint's step (entered and counted there);
        ``unseen``: groups drawn before the checkpoint that had not entered, which enter now.
        """
        for name, n in (("carried", carried), ("unseen", unseen)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"census restart: {name}={n!r}; allowed: an integer >= 0")
        self._carried += carried
        self._entered += unseen
        self._w_entered += unseen
        self._settled[Bucket.LOST_AT_RESTART] += carried + unseen
        self._w_buckets[Bucket.LOST_AT_RESTART] += carried + unseen

    def _pay_masked(self, rollouts: Sequence[RolloutRecord]) -> None:
        """Add the group's baseline once per loss-masked rollout of a trained group."""
        scored = [r for r in rollouts if r.reward is not None]
        masked = np.array([r.masked for r in scored], dtype=bool)
        if not masked.any():
            return
        rewards = np.array([r.reward for r in scored], dtype=np.float64)
        b = group_baseline(
            rewards, np.zeros(len(scored), np.int64), population=self.population, kept=~masked
        )
        paid = self._w_paid["masked"]
        paid[0] += float(b[masked].sum())
        paid[1] += int(masked.sum())

    @property
    def buffered(self) -> int:
        """Entries that entered and are not settled yet."""
        return sum(self._open.values())

    def totals(self) -> dict[str, int]:
        """Cumulative entries per bucket, plus ``entered`` and ``buffered`` (``carried``
        entries, which entered in an earlier life, are not among ``entered``)."""
        t = {b.value: self._settled[b] for b in Bucket}
        t["buffered"] = self.buffered
        t["entered"] = self._entered
        return t

    @property
    def carried(self) -> int:
        """Entries an earlier life left open, settled here at the restart (``restart``)."""
        return self._carried

    def check(self, queue_size: int | None = None) -> None:
        """Assert conservation; with ``queue_size``, also that the buffer holds what we think."""
        settled = sum(self._settled.values())
        if self._entered + self._carried != settled + self.buffered:
            raise AssertionError(
                f"census conservation broken: entered={self._entered} + "
                f"carried={self._carried} != settled={settled} + buffered={self.buffered}"
            )
        if queue_size is not None and queue_size != self.buffered:
            raise AssertionError(
                f"census: the buffer holds {queue_size} groups but {self.buffered} entries are open"
            )

    def step_metrics(
        self, prefix: str = PREFIX, *, queue_size: int | None = None
    ) -> dict[str, float]:
        """Metrics of the window since the last call, then reset the window."""
        self.check(queue_size)
        m: dict[str, float] = {f"{prefix}groups/entered": float(self._w_entered)}
        for b in Bucket:
            m[f"{prefix}groups/{b.value}"] = float(self._w_buckets[b])
        m[f"{prefix}groups/buffered"] = float(self.buffered)
        if self._w_staleness:
            m[f"{prefix}staleness_mean"] = float(np.mean(self._w_staleness))
            m[f"{prefix}staleness_max"] = float(np.max(self._w_staleness))
        m[f"{prefix}protected_groups"] = float(len(self._w_protected_weights))
        if self._w_protected_weights:
            m[f"{prefix}protected_weight_mean"] = float(np.mean(self._w_protected_weights))
        m.update(outcome_metrics(self._w_trained, prefix))
        self._prior.observe(m, prefix)
        m.update(outcome_metrics(self._w_generated, prefix + GENERATED, trained=False))
        for o in OUTCOMES:
            m[f"{prefix}dropped/outcome/{o.value}"] = float(
                sum(r.outcome is o for r in self._w_dropped)
            )
        for name, (total, n) in self._w_paid.items():
            m[f"{prefix}b_paid/{name}_rollouts"] = float(n)
            if n:
                m[f"{prefix}b_paid/{name}"] = total / n
        for reason, count in sorted(self._w_aborted_reasons.items()):
            m[f"{prefix}aborted/reason/{reason}"] = float(count)
        dropped = sum(self._w_no_result_reasons.values())
        m[f"{prefix}no_result/groups"] = float(dropped)
        if self._w_entered:
            m[f"{prefix}no_result/fraction"] = dropped / self._w_entered
            for reason, count in sorted(self._w_no_result_reasons.items()):
                m[f"{prefix}no_result/fraction/{reason}"] = count / self._w_entered
        m[f"{prefix}groups/requeued"] = float(self._w_requeued)
        for reason, count in sorted(self._w_lost_reasons.items()):
            m[f"{prefix}lost/reason/{reason}"] = float(count)
        self._reset_window()
        return m
