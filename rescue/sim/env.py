"""The simulated task and agent episodes, vectorized across rollouts.

Specification
-------------
A task needs ``k`` correct edits (``k`` drawn from ``SimConfig.difficulty``; every
rollout of a group shares its task). An episode starts with the strategy choice, then
each turn the agent takes one action from its policy row (``policy``):

``edit``    progress +1 with probability q, −1 (not below 0) with probability r, else
            unchanged; (q, r) = ``informed_edit`` right after a failing test run, else
            ``blind_edit``.
``test``    runs the tests (thorough only): the phase becomes *tests pass* when
            progress ≥ k, *tests fail* otherwise. Marks the rollout as having run tests.
``submit``  ends the episode: ``solved`` (reward 1) when progress ≥ k, else
            ``submitted_failure`` (reward 0).

A rollout that has not submitted after ``max_turns`` turns is a ``budget_failure`` (the
turn cap, reward 0). Independently, a rollout is lost to an infrastructure fault with
probability ``infra_rate`` (``infra_no_result``, no reward).

Turn ``ℓ`` (1-based) with action ``a`` takes ``turn_time[a] · (1 + context_growth·(ℓ−1))
· exp(time_noise · z)`` wall-clock, ``z`` standard normal; an episode takes the sum.

Outcome classes come from the one classifier, ``rescue.outcomes.classify``, applied to
the fields a Miles sample of each kind of episode carries (``CLASSIFICATIONS``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rescue.outcomes import Classification, classify
from rescue.sim import policy as P
from rescue.sim.config import SimConfig

#: Episode kinds (how it ended), the index into ``CLASSIFICATIONS``.
SOLVED, FAILED, CAPPED, LOST = range(4)
#: The sample fields each kind of episode would carry on the cluster.
KIND_FIELDS: tuple[dict, ...] = (
    {
        "status": "completed",
        "reward": 1.0,
        "metadata": {"exit_status": "Submitted", "resolved": True},
    },
    {
        "status": "completed",
        "reward": 0.0,
        "metadata": {"exit_status": "Submitted", "resolved": False},
    },
    {"status": "truncated", "reward": 0.0, "metadata": {"exit_status": "LimitsExceeded"}},
    {"status": "aborted", "reward": None, "metadata": {}},
)
#: Classification of each kind by ``rescue.outcomes.classify``.
CLASSIFICATIONS: tuple[Classification, ...] = tuple(classify(**f) for f in KIND_FIELDS)


@dataclass
class Episodes:
    """``n`` finished episodes, arrays indexed by rollout (``n = groups × G``).

    ``rows`` / ``choices`` are ``[n, max_turns + 1]`` decisions: column 0 is the strategy
    choice (taken with turn 1), column ``ℓ`` the action at turn ``ℓ``; padding rows are −1.
    """

    task_k: np.ndarray  # [n] correct edits the task needs
    strategy: np.ndarray  # [n] 0 fast, 1 thorough
    kind: np.ndarray  # [n] SOLVED | FAILED | CAPPED | LOST
    turns: np.ndarray  # [n] turns taken (actions)
    ran_tests: np.ndarray  # [n] ran the tests at least once
    duration: np.ndarray  # [n] wall-clock
    rows: np.ndarray  # [n, T + 1]
    choices: np.ndarray  # [n, T + 1]

    @property
    def reward(self) -> np.ndarray:
        """1 for solved, 0 otherwise (a lost rollout's reward does not exist; 0 here)."""
        return (self.kind == SOLVED).astype(np.float64)


def draw_tasks(rng: np.random.Generator, n_groups: int, cfg: SimConfig) -> np.ndarray:
    """``k`` (correct edits needed) of ``n_groups`` tasks."""
    ks = np.array([k for k, _ in cfg.difficulty], dtype=np.int64)
    ps = np.array([p for _, p in cfg.difficulty], dtype=np.float64)
    return ks[rng.choice(ks.size, size=n_groups, p=ps)]


def run_episodes(
    probs: np.ndarray, task_k: np.ndarray, rng: np.random.Generator, cfg: SimConfig
) -> Episodes:
    """Play one episode per entry of ``task_k`` under the policy ``probs [ROWS, CHOICES]``."""
    n, T = task_k.shape[0], cfg.max_turns
    k = task_k.astype(np.int64)
    rows = np.full((n, T + 1), -1, dtype=np.int16)
    choices = np.full((n, T + 1), -1, dtype=np.int8)
    strategy = (rng.random(n) >= probs[P.STRATEGY_ROW, P.FAST]).astype(np.int64)
    rows[:, 0] = P.STRATEGY_ROW
    choices[:, 0] = strategy

    phase = np.zeros(n, dtype=np.int64)
    progress = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    kind = np.full(n, CAPPED, dtype=np.int64)
    turns = np.zeros(n, dtype=np.int64)
    ran_tests = np.zeros(n, dtype=bool)
    duration = np.zeros(n)
    qb, rb = cfg.blind_edit
    qi, ri = cfg.informed_edit
    turn_time = np.asarray(cfg.turn_time, dtype=np.float64)
    for turn in range(1, T + 1):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        u = rng.random((2, idx.size))
        z = rng.standard_normal(idx.size)
        ph, pr = phase[idx], progress[idx]
        row = P.action_row(strategy[idx], ph)
        pi = probs[row]
        a = (u[0] >= pi[:, 0]).astype(np.int64) + (u[0] >= pi[:, 0] + pi[:, 1])
        rows[idx, turn] = row
        choices[idx, turn] = a
        turns[idx] = turn
        duration[idx] += (
            turn_time[a] * (1.0 + cfg.context_growth * (turn - 1)) * np.exp(cfg.time_noise * z)
        )

        edit, test, submit = a == P.EDIT, a == P.TEST, a == P.SUBMIT
        informed = ph == P.TESTS_FAIL
        q = np.where(informed, qi, qb)
        r = np.where(informed, ri, rb)
        step = np.where(u[1] < q, 1, np.where(u[1] < q + r, -1, 0))
        pr = np.where(edit, np.maximum(pr + step, 0), pr)
        done = pr >= k[idx]
        ph = np.where(
            edit,
            np.where(
                (ph >= P.EDITED1) & (ph <= P.EDITED3), np.minimum(ph + 1, P.EDITED3), P.EDITED1
            ),
            ph,
        )
        ph = np.where(test, np.where(done, P.TESTS_PASS, P.TESTS_FAIL), ph)
        phase[idx], progress[idx] = ph, pr
        ran_tests[idx[test]] = True
        ended = idx[submit]
        kind[ended] = np.where(done[submit], SOLVED, FAILED)
        alive[ended] = False
    lost = rng.random(n) < cfg.infra_rate
    kind[lost] = LOST
    return Episodes(k, strategy, kind, turns, ran_tests, duration, rows, choices)
