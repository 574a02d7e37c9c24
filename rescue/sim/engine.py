"""Discrete-event simulation of a fully asynchronous multi-turn agent trainer.

Specification
-------------
Rollout workers generate up to ``concurrency`` groups at once. A group is launched with
the trainer's current weight version ``v`` and G episodes of one task under that policy
(``env``); it finishes when its slowest rollout does and is put into the buffer (FIFO).
A finished group waits, holding its worker, while the buffer holds ``buffer_capacity``
groups (Miles' back-pressure). The trainer ``get``s groups until it has
``groups_per_step`` kept ones, spends ``train_time`` on the update, then bumps ``v``.
Staleness ``= v at get − v at launch`` therefore comes from the timing alone: a group
with a long rollout is more stale.

The same core objects as the Miles adapters decide everything:

- put: a group with a lost rollout (``infra_no_result``) is *aborted*
  (``rescue.census.no_result``, the rule the Miles buffer and the slime drain apply;
  unused handler ``drop``);
- get: ``rescue.gate.Gate.decide(group_id, staleness)`` keeps or drops it and gives the
  weight (1 or 1/a); ``rescue.census.Bucket.after_gate`` names its bucket, as in the
  Miles buffer and the slime drain;
- filter: ``rescue.mask.mask_decision`` (what the sample filters apply) marks capped
  rollouts of the mask arms;
- advantages: ``rescue.advantages.group_advantages`` (or ``per_token_advantages`` with the
  turn-reached baseline), weights applied after normalization;
- census: ``rescue.census.Census`` settles every group that entered the buffer into one
  bucket; ``step_metrics`` is logged each step under ``rollout/census/``.

The update is REINFORCE/GRPO with the exact score (``policy``): ``θ ← θ + lr · (1/N) Σ_i
Σ_ℓ A_iℓ ∇ log π(a_iℓ)``, summed over a rollout's decisions, averaged over the N rollouts
of the batch; masked rollouts contribute 0 but count in N (Miles' loss normalizer counts
them too). A rollout's turns are summed rather than token-averaged: the score of a whole
trajectory is the sum, which keeps the estimator exact.

Everything random comes from ``numpy.random.Generator``s spawned from the seed, and events
are ordered by (time, sequence number): a seed gives the same run in any process.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rescue.advantages import group_advantages, per_token_advantages
from rescue.census import Bucket, Census, RolloutRecord, no_result, outcome_metrics
from rescue.gate import Gate
from rescue.mask import mask_decision
from rescue.outcomes import is_capped
from rescue.sim import env
from rescue.sim.config import ArmSpec, SimConfig
from rescue.sim.policy import Policy

#: Prefix of the simulator's own metrics (those the cluster cannot see).
SIM_PREFIX = "sim/"
#: Prefix of the outcome metrics over every rollout generated in a step (trained or not).
GENERATED_PREFIX = "sim/generated/"
#: Baselines whose per-token advantage variance is accumulated for prediction P7: the
#: group mean (GRPO's, own reward included), the leave-one-out mean, the turn-reached one.
P7_BASELINES: tuple[str, ...] = ("group_mean", "leave_one_out", "turn_reached")


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
    buffer: deque[Group] = field(default_factory=deque)  # FIFO, at most buffer_capacity
    batch: list[tuple[Group, float, float]] = field(default_factory=list)  # (group, w, staleness)
    in_flight: int = 0  # launched and not yet in the buffer (generating or blocked)
    train_end: float | None = None  # when the running update ends; None: none is running


class Simulation:
    """One arm, one seed. ``run()`` returns one metrics dict per trainer step.

    Attributes (the shared core objects, exposed so tests can check their identity):
        gate: the ``rescue.gate.Gate`` of the arm.
        census: the ``rescue.census.Census`` of the run.
        policy: the simulated agent (``policy.Policy``).
    """

    def __init__(self, cfg: SimConfig, arm: ArmSpec, seed: int) -> None:
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
        self._window_generated: list[RolloutRecord] = []
        self.p7 = np.zeros((3, 3))  # per baseline in P7_BASELINES: n, ΣA, ΣA²

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
            ep = env.run_episodes(self.policy.probs(), k, self._episode_rng, self.cfg)
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

    # ------------------------------------------------------------------ the run

    def run(self, on_step: Callable[[int], None] | None = None) -> list[dict[str, float]]:
        """Simulate ``cfg.steps`` trainer steps; ``on_step(step)`` is called after each.

        Each turn of the loop settles the state (``_settle``), then advances the clock to
        the next event: the running update ends (ties: the update first), or a group
        finishes.
        """
        flow = Flow()
        steps: list[dict[str, float]] = []
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
        return steps

    def _settle(self, flow: Flow) -> None:
        """Fill the buffer from blocked workers, launch, let the trainer get; until stable."""
        cfg = self.cfg
        while True:
            while flow.blocked and len(flow.buffer) < cfg.buffer_capacity:
                self._put(flow, flow.blocked.popleft())
            while flow.in_flight < cfg.concurrency:
                g = self._launch()
                heapq.heappush(flow.events, (g.finished, g.group_id, g))
                flow.in_flight += 1
            if flow.train_end is not None or not flow.buffer:
                return
            self._get(flow)
            if len(flow.batch) == cfg.groups_per_step:
                flow.train_end = self.time + cfg.train_time
            if not flow.blocked or len(flow.buffer) >= cfg.buffer_capacity:
                return

    def _put(self, flow: Flow, group: Group) -> None:
        """A finished group enters the buffer (census entry); a lost one is aborted at once."""
        flow.in_flight -= 1
        self.census.enter(group.group_id)
        group.records = self.records(group)
        self._window_generated.extend(group.records)
        if (reason := no_result(group.records)) is not None:
            self.census.settle(group.group_id, Bucket.ABORTED, group.records, reason=reason)
        else:
            flow.buffer.append(group)

    def _get(self, flow: Flow) -> None:
        """The trainer takes groups in FIFO order through the gate until its batch is full."""
        while flow.buffer and len(flow.batch) < self.cfg.groups_per_step:
            g = flow.buffer.popleft()
            staleness = self.version - g.version
            d = self.gate.decide(g.group_id, staleness)
            self.census.settle(
                g.group_id, Bucket.after_gate(d), g.records, staleness=staleness, weight=d.weight
            )
            if d.keep:
                flow.batch.append((g, d.weight, staleness))

    def _finish_next(self, flow: Flow) -> None:
        """The next group finishes: into the buffer, or blocked while the buffer is full."""
        finish, _, g = heapq.heappop(flow.events)
        self.time = finish
        if len(flow.buffer) < self.cfg.buffer_capacity:
            self._put(flow, g)
        else:
            flow.blocked.append(g)

    def _train(self, flow: Flow) -> dict[str, float]:
        """The running update ends: apply it and return the step's metrics."""
        self.time = flow.train_end
        flow.train_end = None
        self._update(flow.batch)
        metrics = self._step_metrics(flow.batch, len(flow.buffer))
        flow.batch = []
        return metrics

    # ------------------------------------------------------------------ the update

    def _update(self, batch: list[tuple[Group, float, float]]) -> None:
        cfg, arm = self.cfg, self.arm
        B, G, T1 = len(batch), cfg.group_size, cfg.max_turns + 1
        rows = np.stack([g.episodes.rows for g, _, _ in batch]).astype(np.int64)  # [B, G, T+1]
        choices = np.stack([g.episodes.choices for g, _, _ in batch]).astype(np.int64)
        R = np.stack([g.episodes.reward for g, _, _ in batch])  # [B, G]; capped: R = 0
        lengths = np.stack([g.episodes.turns for g, _, _ in batch])
        masked = np.array([[r.masked for r in g.records] for g, _, _ in batch], dtype=bool)
        w = np.repeat(np.array([wt for _, wt, _ in batch])[:, None], G, axis=1)
        # Turn index of each decision: the strategy (column 0) is taken with turn 1.
        turn_index = np.where(rows >= 0, np.maximum(np.arange(T1), 1), 0)
        if arm.turn_baseline:
            coef = per_token_advantages(
                R, lengths, turn_index, kappa=cfg.kappa, std_normalize=cfg.std_normalize,
                weights=w, dtype=np.float64,
            )  # fmt: skip
        else:
            gids = np.repeat(np.arange(B), G)
            A = group_advantages(
                R.ravel(), gids, population=arm.population, kept=~masked.ravel(),
                std_normalize=cfg.std_normalize, weights=w.ravel(),
            ).reshape(B, G)  # fmt: skip
            coef = np.where(rows >= 0, A[:, :, None], 0.0)
        coef = np.where(masked[:, :, None], 0.0, coef) / (B * G)
        self.policy.step(self.policy.gradient(rows, choices, coef), cfg.lr)
        self._p7(R, lengths, turn_index)
        self.version += 1
        self._pool.clear()  # groups not yet launched are generated with the new weights

    def _p7(self, R: np.ndarray, lengths: np.ndarray, turn_index: np.ndarray) -> None:
        """Accumulate per-token (per-decision) advantages, R = 0 on cap, no std: P7 offline.

        The three baselines are ``rescue.advantages``' own: the group mean and the
        leave-one-out mean of ``group_advantages``, and ``per_token_advantages``.
        """
        real = turn_index > 0
        B, G = R.shape
        gids = np.repeat(np.arange(B), G)

        def per_token(population: str) -> np.ndarray:
            A = group_advantages(R.ravel(), gids, population=population, std_normalize=False)
            return np.broadcast_to(A.reshape(B, G)[:, :, None], turn_index.shape)

        a_turn = per_token_advantages(
            R, lengths, turn_index, kappa=self.cfg.kappa, std_normalize=False, dtype=np.float64
        )
        for j, a in enumerate((per_token("all"), per_token("loo"), a_turn)):
            a = a[real]
            self.p7[j] += (a.size, a.sum(), (a * a).sum())

    # ------------------------------------------------------------------ metrics

    def _step_metrics(self, batch, queue_size: int) -> dict[str, float]:
        m = self.census.step_metrics(queue_size=queue_size)
        m.update(outcome_metrics(self._window_generated, GENERATED_PREFIX))
        self._window_generated = []
        m[SIM_PREFIX + "time"] = self.time
        m[SIM_PREFIX + "weight_version"] = float(self.version)
        m[SIM_PREFIX + "p_thorough"] = self.policy.p_thorough()
        m[SIM_PREFIX + "trained_weight_mean"] = float(np.mean([w for _, w, _ in batch]))
        return m

    def p7_variances(self) -> dict[str, float]:
        """Per-token advantage variance (R = 0 on cap, no std) under each of ``P7_BASELINES``."""
        out = {}
        for j, name in enumerate(P7_BASELINES):
            n, s, s2 = self.p7[j]
            out[name] = float(s2 / n - (s / n) ** 2) if n else float("nan")
        return out
