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

With ``submit_failure`` off, a submit on an unsolved task is refused and the episode goes
on (the turn is spent): the environment has two outcomes, solved or capped.

A rollout that has not submitted after ``max_turns`` turns is a ``budget_failure`` (the
turn cap, reward 0). Independently, a rollout is lost to an infrastructure fault with
probability ``infra_rate`` (``infra_no_result``, no reward).

The strategy table (``episodes = "table"``) is the research plan's two-strategy
construction as a learned choice: the policy decides the strategy only; then the outcome
and the turns are fixed per strategy and outcome. Fast succeeds with probability
``table_success[0]``, thorough with ``table_success[1]``; a share ``table_late`` of
thorough's successes take ``table_late_turns`` turns, every other episode the turns of
``table_turns`` (fast solved, fast failed, thorough solved, thorough failed). Thorough runs
the tests, fast never does. Every turn of a table episode takes an edit's wall-clock.

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
    ``prob`` is the probability the launching policy gave each decision (1 on padding): the
    denominator of the importance ratio; ``behaviour`` is the launching policy's whole
    distribution over the decision's row (0 on padding), what score centering centres by.
    """

    task_k: np.ndarray  # [n] correct edits the task needs
    strategy: np.ndarray  # [n] 0 fast, 1 thorough
    kind: np.ndarray  # [n] SOLVED | FAILED | CAPPED | LOST
    turns: np.ndarray  # [n] turns taken (actions)
    ran_tests: np.ndarray  # [n] ran the tests at least once
    duration: np.ndarray  # [n] wall-clock
    rows: np.ndarray  # [n, T + 1]
    choices: np.ndarray  # [n, T + 1]
    prob: np.ndarray  # [n, T + 1] behaviour probability of each decision
    behaviour: np.ndarray  # [n, T + 1, CHOICES] the launching policy's row of each decision

    @property
    def reward(self) -> np.ndarray:
        """1 for solved, 0 otherwise (a lost rollout's reward does not exist; 0 here)."""
        return (self.kind == SOLVED).astype(np.float64)


def draw_tasks(rng: np.random.Generator, n_groups: int, cfg: SimConfig) -> np.ndarray:
    """``k`` (correct edits needed) of ``n_groups`` tasks."""
    ks = np.array([k for k, _ in cfg.difficulty], dtype=np.int64)
    ps = np.array([p for _, p in cfg.difficulty], dtype=np.float64)
    return ks[rng.choice(ks.size, size=n_groups, p=ps)]


def play(
    probs: np.ndarray, task_k: np.ndarray, rng: np.random.Generator, cfg: SimConfig
) -> Episodes:
    """One episode per entry of ``task_k`` under ``probs``, by ``cfg.episodes``'s model."""
    if cfg.episodes == "table":
        return run_table(probs, task_k, rng, cfg)
    return run_episodes(probs, task_k, rng, cfg)


def _turn_seconds(turn: np.ndarray | int, base: np.ndarray | float, z, cfg: SimConfig):
    """Wall-clock of turn ``turn`` (1-based) whose turn-1 time is ``base``."""
    return base * (1.0 + cfg.context_growth * (turn - 1)) * np.exp(cfg.time_noise * z)


def run_table(
    probs: np.ndarray, task_k: np.ndarray, rng: np.random.Generator, cfg: SimConfig
) -> Episodes:
    """The strategy table (module docstring): the policy chooses the strategy, no more."""
    n, T = task_k.shape[0], cfg.max_turns
    u = rng.random((3, n))
    strategy = (u[0] >= probs[P.STRATEGY_ROW, P.FAST]).astype(np.int64)
    solved = u[1] < np.asarray(cfg.table_success)[strategy]
    late = solved & (strategy == P.THOROUGH) & (u[2] < cfg.table_late)
    turns = np.asarray(cfg.table_turns)[2 * strategy + (~solved)]
    turns = np.where(late, cfg.table_late_turns, turns).astype(np.int64)
    z = rng.standard_normal((n, T))
    ell = np.arange(1, T + 1)
    per_turn = _turn_seconds(ell[None, :], cfg.turn_time[P.EDIT], z, cfg)
    duration = np.where(ell[None, :] <= turns[:, None], per_turn, 0.0).sum(axis=1)
    rows = np.full((n, T + 1), -1, dtype=np.int16)
    choices = np.full((n, T + 1), -1, dtype=np.int8)
    prob = np.ones((n, T + 1))
    rows[:, 0], choices[:, 0] = P.STRATEGY_ROW, strategy
    prob[:, 0] = probs[P.STRATEGY_ROW, strategy]
    kind = np.where(solved, SOLVED, FAILED).astype(np.int64)
    kind[rng.random(n) < cfg.infra_rate] = LOST
    ran_tests = strategy == P.THOROUGH
    return Episodes(task_k.astype(np.int64), strategy, kind, turns, ran_tests, duration, rows,
                    choices, prob, behaviour_rows(probs, rows))  # fmt: skip


def behaviour_rows(probs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[n, T + 1, CHOICES]``: the row of ``probs`` each decision was drawn from (0 on padding)."""
    real = rows >= 0
    return np.where(real[..., None], probs[np.where(real, rows, 0)], 0.0)


def run_episodes(
    probs: np.ndarray, task_k: np.ndarray, rng: np.random.Generator, cfg: SimConfig
) -> Episodes:
    """Play one episode per entry of ``task_k`` under the agent policy ``probs [ROWS, CHOICES]``."""
    n, T = task_k.shape[0], cfg.max_turns
    k = task_k.astype(np.int64)
    rows = np.full((n, T + 1), -1, dtype=np.int16)
    choices = np.full((n, T + 1), -1, dtype=np.int8)
    prob = np.ones((n, T + 1))
    strategy = (rng.random(n) >= probs[P.STRATEGY_ROW, P.FAST]).astype(np.int64)
    rows[:, 0] = P.STRATEGY_ROW
    choices[:, 0] = strategy
    prob[:, 0] = probs[P.STRATEGY_ROW, strategy]

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
        prob[idx, turn] = pi[np.arange(idx.size), a]
        turns[idx] = turn
        duration[idx] += _turn_seconds(turn, turn_time[a], z, cfg)

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
        # A wrong submit ends the episode, unless the environment refuses it (two outcomes).
        ends = submit & (done | cfg.submit_failure)
        ended = idx[ends]
        kind[ended] = np.where(done[ends], SOLVED, FAILED)
        alive[ended] = False
    lost = rng.random(n) < cfg.infra_rate
    kind[lost] = LOST
    return Episodes(
        k, strategy, kind, turns, ran_tests, duration, rows, choices, prob,
        behaviour_rows(probs, rows),
    )  # fmt: skip
