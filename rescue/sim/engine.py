"""Discrete-event simulation of a fully asynchronous multi-turn agent trainer.

Specification
-------------
Rollout workers generate up to ``concurrency`` groups at once. A group is launched with
the trainer's current weight version ``v`` and G episodes of one task under that policy
(``env``); it finishes when its slowest rollout does and is put into the buffer (FIFO).
A finished group waits, holding its worker, while the buffer holds ``capacity`` groups
(``--buffer-capacity``, by default sized for the pace window; Miles' back-pressure). The
trainer ``get``s groups until it has ``groups_per_step`` kept ones, spends ``train_time``
on the update (``update.step``), then bumps ``v``. Staleness ``= v at get − v at launch`` therefore comes from the timing alone:
a group with a long rollout is more stale.

The ``pace`` arm bounds staleness by waiting instead of dropping, by the schedule the
Miles adapter runs (``rescue.pace.PaceSchedule``, the rules and why they bound staleness
are there): a step starts when the trainer starts collecting its batch; a group is launched
only while the schedule admits it (generating + buffered + taken this step below the
window ``pace_limit``, (K + 1) × B by default); the trainer takes the group the schedule
chooses (earliest deadline first) and, when every place left in its batch is owed to
groups still generating, waits for them. The time it waits so while another finished group
is ready (``waits_for_straggler``), and how many such waits, are logged per step as
``rollout/census/pace_wait_s`` and ``rollout/census/pace_wait_groups``, as on Miles; the
clock includes the waits. An aborted group frees its place.

The same core objects as the Miles adapters decide everything:

- put: a group with a lost rollout (``infra_no_result``) is *aborted*
  (``rescue.census.no_result``, the rule the Miles buffer and the slime drain apply;
  unused handler ``drop``);
- get: ``rescue.gate.Gate.decide(group_id, staleness)`` keeps or drops it and gives the
  weight (1 or 1/a); ``rescue.census.Bucket.after_gate`` names its bucket, as in the
  Miles buffer and the slime drain;
- filter: ``rescue.mask.mask_decision`` (what the sample filters apply) marks capped
  rollouts of the mask arms;
- advantages: ``rescue.advantages`` (in ``update``), weights applied after normalization;
- census: ``rescue.census.Census`` settles every group that entered the buffer into one
  bucket; ``step_metrics`` is logged each step under ``rollout/census/``.

Behaviour is logged three ways per step: the trained groups' census (``rollout/census/``),
every rollout that finished in the step (``rollout/census/generated/``: the census's own
view of every group that entered it, the keys the Miles buffer and the slime drain log),
and every rollout launched with the weight version of the step (``sim/launched/``, written
at the end of the run for the versions whose groups all finished; the completion-time view
over-represents short rollouts right after a change of policy, the launch view does not).
Outputs of earlier versions logged the completion view as ``sim/generated/``; the judge
still reads it there.

With ``subsidy`` on, each step also carries ``sim/subsidy/*`` (``rescue.sim.subsidy``): the
exact b·∇P(cap) and ∇J terms of the masked update at the parameters the step's update
started from, swept over every step at the end of the run (no random draw: the run's
other outputs are the same with it off).

Everything random comes from ``numpy.random.Generator``s spawned from the seed, and events
are ordered by (time, sequence number): a seed gives the same run in any process.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rescue.census import GENERATED as CENSUS_GENERATED
from rescue.census import PREFIX as CENSUS_PREFIX
from rescue.census import Bucket, Census, RolloutRecord, no_result, outcome_metrics
from rescue.errors import InputError
from rescue.gate import Gate
from rescue.mask import mask_decision
from rescue.outcomes import is_capped
from rescue.pace import PaceSchedule, PaceSettings
from rescue.sim import env, subsidy, update
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.policy import Policy

#: Prefix of the simulator's own metrics (those the cluster cannot see).
SIM_PREFIX = "sim/"
#: Prefix of the outcome metrics over every rollout finished in a step (trained or not):
#: the census's generated view (``rescue.census``).
GENERATED_PREFIX = CENSUS_PREFIX + CENSUS_GENERATED
#: Prefix of the outcome metrics over the rollouts launched with a step's weight version.
LAUNCHED_PREFIX = "sim/launched/"
#: Census keys of the pace arm's waits.
PACE_WAIT_S = "rollout/census/pace_wait_s"
PACE_WAIT_GROUPS = "rollout/census/pace_wait_groups"
P7_BASELINES = update.P7_BASELINES


@dataclass
class Group:
    """One launched group: its id, task, the weight version it was generated with, episodes."""

    group_id: int
    version: int
    launched: float
    finished: float
    episodes: env.Episodes  # G rollouts
    records: list[RolloutRecord] | None = None  # set when the group is put into the buffer


@dataclass
class Flow:
    """Where the launched groups are, between launch and the trainer's update."""

    events: list[tuple[float, int, Group]] = field(default_factory=list)  # min-heap by finish
    blocked: deque[Group] = field(default_factory=deque)  # finished, waiting for buffer room
    buffer: deque[Group] = field(default_factory=deque)  # FIFO, at most cfg.capacity
    batch: list[tuple[Group, float, float]] = field(default_factory=list)  # (group, w, staleness)
    in_flight: int = 0  # launched and not yet in the buffer (generating or blocked)
    versions: Counter[int] = field(default_factory=Counter)  # launch versions in flight
    train_end: float | None = None  # when the running update ends; None: none is running
    wait_since: float | None = None  # pace: the trainer waits for a straggler since


def check_runnable(cfg: SimConfig, arm: ArmSpec) -> None:
    """Refuse a setting this arm cannot run with, in one line naming the flags; the runner
    calls it for every arm before the first step of any run, ``Simulation`` again."""
    if arm.pace and cfg.capacity < cfg.pace_limit:
        raise InputError(
            f"arm pace: --buffer-capacity={cfg.buffer_capacity} is below the pace window "
            f"{cfg.pace_limit} (--pace-window, default (K + 1) x --groups-per-step with K = "
            f"--max-staleness = {cfg.max_staleness}); allowed: 0 (the default: a buffer sized "
            f"for the window) or at least {cfg.pace_limit}"
        )


class Simulation:
    """One arm, one seed. ``run()`` returns one metrics dict per trainer step.

    Attributes (the shared core objects, exposed so tests can check their identity):
        gate: the ``rescue.gate.Gate`` of the arm.
        census: the ``rescue.census.Census`` of the run.
        policy: the simulated agent (``policy.Policy``).
    """

    def __init__(self, cfg: SimConfig, arm: ArmSpec, seed: int) -> None:
        check_runnable(cfg, arm)
        self.cfg, self.arm, self.seed = cfg, arm, int(seed)
        self.gate = Gate(arm=arm.gate_arm, a=arm.a, seed=self.seed, max_staleness=cfg.max_staleness)
        self.census = Census(population=arm.population)
        self.policy = Policy(np.array(cfg.initial_logits, dtype=np.float64))
        task_seq, episode_seq = np.random.SeedSequence(self.seed).spawn(2)
        self._task_rng = np.random.default_rng(task_seq)
        self._episode_rng = np.random.default_rng(episode_seq)
        self.version = 0
        self.time = 0.0
        self._next_id = 0
        self._pool: deque[tuple[int, env.Episodes]] = deque()  # (version, G episodes)
        self._launched: dict[int, list[RolloutRecord]] = {}  # launch version -> records
        self._waits = [0.0, 0]  # pace: seconds waited for stragglers, waits, this step
        self.pace = (
            PaceSchedule(
                PaceSettings(cfg.max_staleness, cfg.groups_per_step, cfg.pace_window or None)
            )
            if arm.pace
            else None
        )
        self.p7 = np.zeros((3, 3))  # per baseline in P7_BASELINES: n, ΣA, ΣA²
        self._thetas: list[np.ndarray] = []  # with cfg.subsidy: θ each update started from

    # ------------------------------------------------------------------ records

    def records(self, group: Group) -> list[RolloutRecord]:
        """The census records of a group's rollouts, classified by ``rescue.outcomes``."""
        ep = group.episodes
        out = []
        for i in range(ep.kind.shape[0]):
            kind = int(ep.kind[i])
            c = env.CLASSIFICATIONS[kind]
            masked = self.arm.mask and mask_decision(c, f"{group.group_id}/{i}", 1.0, self.seed)
            out.append(
                RolloutRecord(
                    outcome=c.outcome,
                    reward=env.KIND_FIELDS[kind]["reward"],
                    turns=int(ep.turns[i]),
                    capped=is_capped(c),
                    masked=masked,
                    ran_tests=bool(ep.ran_tests[i]),
                    reason=c.reason,
                )
            )
        return out

    # ------------------------------------------------------------------ generation

    def _launch(self) -> Group:
        if not self._pool:
            # About one batch is launched per weight version; a chunk of two batches is
            # played at once (numpy over its rollouts), what is left is discarded at the update.
            n, G = 2 * self.cfg.groups_per_step, self.cfg.group_size
            k = np.repeat(env.draw_tasks(self._task_rng, n, self.cfg), G)
            ep = env.play(self.policy.probs(), k, self._episode_rng, self.cfg)
            for j in range(n):
                sl = slice(j * G, (j + 1) * G)
                part = env.Episodes(
                    *(getattr(ep, f)[sl] for f in env.Episodes.__dataclass_fields__)
                )
                self._pool.append((self.version, part))
        version, episodes = self._pool.popleft()
        gid = self._next_id
        self._next_id += 1
        return Group(gid, version, self.time, self.time + float(episodes.duration.max()), episodes)

    def _admits(self, flow: Flow) -> bool:
        if flow.in_flight >= self.cfg.concurrency:
            return False
        return self.pace is None or self.pace.can_admit()

    # ------------------------------------------------------------------ the run

    def run(self, on_step: Callable[[int], None] | None = None) -> list[dict[str, float]]:
        """Simulate ``cfg.steps`` trainer steps; ``on_step(step)`` is called after each.

        Each turn of the loop settles the state (``_settle``), then advances the clock to
        the next event: the running update ends (ties: the update first), or a group
        finishes.
        """
        flow = Flow()
        steps: list[dict[str, float]] = []
        if self.pace is not None:
            self.pace.begin_step()
        while len(steps) < self.cfg.steps:
            self._settle(flow)
            if flow.train_end is not None and (
                not flow.events or flow.train_end <= flow.events[0][0]
            ):
                steps.append(self._train(flow))
                if on_step is not None:
                    on_step(len(steps))
            else:
                self._finish_next(flow)
        for v, m in enumerate(steps):  # the launch view, of every version whose groups finished
            if flow.versions[v] == 0 and self._launched.get(v):
                m.update(outcome_metrics(self._launched[v], LAUNCHED_PREFIX))
        if self.cfg.subsidy:  # exact, from the parameters: swept once over every step
            for m, extra in zip(steps, subsidy.step_metrics(self._thetas, self.cfg), strict=True):
                m.update(extra)
        return steps

    def _settle(self, flow: Flow) -> None:
        """Fill the buffer from blocked workers, launch, let the trainer get; until stable."""
        cfg = self.cfg
        while True:
            while flow.blocked and len(flow.buffer) < cfg.capacity:
                self._put(flow, flow.blocked.popleft())
            while self._admits(flow):
                g = self._launch()
                if self.pace is not None:
                    self.pace.admit(g.group_id)
                heapq.heappush(flow.events, (g.finished, g.group_id, g))
                flow.in_flight += 1
                flow.versions[g.version] += 1
            if flow.train_end is not None or not flow.buffer:
                return
            if self.arm.pace:
                self._pace_get(flow)
            else:
                self._get(flow)
            if len(flow.batch) == cfg.groups_per_step:
                flow.train_end = self.time + cfg.train_time
            if not flow.blocked or len(flow.buffer) >= cfg.capacity:
                return

    def _put(self, flow: Flow, group: Group) -> None:
        """A finished group enters the buffer (census entry); a lost one is aborted at once."""
        flow.in_flight -= 1
        flow.versions[group.version] -= 1
        group.records = self.records(group)
        self.census.enter(group.group_id, group.records)
        self._launched.setdefault(group.version, []).extend(group.records)
        if (reason := no_result(group.records)) is not None:
            self.census.settle(group.group_id, Bucket.ABORTED, group.records, reason=reason)
            if self.pace is not None:
                self.pace.reject(group.group_id)
        else:
            flow.buffer.append(group)
            if self.pace is not None:
                self.pace.ready(group.group_id)

    def _take(self, flow: Flow, g: Group) -> None:
        """The gate decides one group the trainer got; the census settles it."""
        staleness = self.version - g.version
        d = self.gate.decide(g.group_id, staleness)
        self.census.settle(
            g.group_id, Bucket.after_gate(d), g.records, staleness=staleness, weight=d.weight
        )
        if d.keep:
            flow.batch.append((g, d.weight, staleness))

    def _get(self, flow: Flow) -> None:
        """The trainer takes groups in FIFO order through the gate until its batch is full."""
        while flow.buffer and len(flow.batch) < self.cfg.groups_per_step:
            self._take(flow, flow.buffer.popleft())

    def _pace_get(self, flow: Flow) -> None:
        """Pace: the groups the schedule chooses; it waits while its places are owed."""
        while len(flow.batch) < self.cfg.groups_per_step:
            key = self.pace.choose()
            if key is None:
                if flow.wait_since is None and self.pace.waits_for_straggler():
                    flow.wait_since = self.time
                return
            if flow.wait_since is not None:
                self._waits[0] += self.time - flow.wait_since
                self._waits[1] += 1
                flow.wait_since = None
            self.pace.take(key)
            g = next(x for x in flow.buffer if x.group_id == key)
            flow.buffer.remove(g)
            self._take(flow, g)

    def _finish_next(self, flow: Flow) -> None:
        """The next group finishes: into the buffer, or blocked while the buffer is full."""
        finish, _, g = heapq.heappop(flow.events)
        self.time = finish
        if len(flow.buffer) < self.cfg.capacity:
            self._put(flow, g)
        else:
            flow.blocked.append(g)

    def _train(self, flow: Flow) -> dict[str, float]:
        """The running update ends: apply it and return the step's metrics."""
        self.time = flow.train_end
        flow.train_end = None
        batch = update.Batch.of(
            [g.episodes for g, _, _ in flow.batch],
            [[r.masked for r in g.records] for g, _, _ in flow.batch],
            [w for _, w, _ in flow.batch],
        )
        if self.cfg.subsidy:
            self._thetas.append(self.policy.theta.copy())
        info = update.step(self.policy, batch, self.arm, self.cfg)
        self.p7 += update.p7_moments(batch, self.cfg)
        self.version += 1
        self._pool.clear()  # groups not yet launched are generated with the new weights
        if self.pace is not None:
            self.pace.begin_step()  # the next batch starts: the window refills
        metrics = self._step_metrics(flow.batch, len(flow.buffer), info)
        flow.batch = []
        return metrics

    # ------------------------------------------------------------------ metrics

    def _step_metrics(self, batch, queue_size: int, info: dict[str, float]) -> dict[str, float]:
        m = self.census.step_metrics(queue_size=queue_size)
        if self.arm.pace:
            m[PACE_WAIT_S], m[PACE_WAIT_GROUPS] = float(self._waits[0]), float(self._waits[1])
            self._waits = [0.0, 0]
        m[SIM_PREFIX + "time"] = self.time
        m[SIM_PREFIX + "weight_version"] = float(self.version)
        m[SIM_PREFIX + "p_thorough"] = self.policy.p_thorough()
        m[SIM_PREFIX + "trained_weight_mean"] = float(np.mean([w for _, w, _ in batch]))
        for k, v in info.items():
            m[SIM_PREFIX + k] = v
        return m

    def p7_variances(self) -> dict[str, float]:
        """Per-decision advantage variance (R = 0 on cap, no std) under each of ``P7_BASELINES``."""
        return update.p7_variances(self.p7)
