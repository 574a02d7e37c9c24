"""The simulated agent's policy: a table of softmax rows with an exact score function.

Specification
-------------
The policy is ``ROWS = 13`` softmax rows of 3 choices, with logits ``θ[row, choice]``:

- row 0, the strategy, chosen once before turn 1: ``fast`` | ``thorough`` (choice 2
  unused);
- rows ``1 + 6·s + phase`` for strategy ``s`` (0 fast, 1 thorough): the action at each
  turn, ``edit`` | ``test`` | ``submit``. Fast never runs tests (its ``test`` choice is
  unavailable). The phase is what the agent knows: ``start`` (nothing edited),
  ``edited ×1 / ×2 / ×3+`` (edits since the last test run), ``tests fail``, ``tests pass``.

Unavailable choices have probability 0. For a decision ``(row, a)`` the score is exact::

    ∇_θ log π(a | row) = e_a − π(· | row)      (on row ``row``; 0 elsewhere)

and the score of a trajectory is the sum over its decisions. ``gradient`` evaluates it at
the *current* θ for decisions sampled under an older θ, as a trainer that recomputes log
probabilities with its current weights does (no importance ratio).
"""

from __future__ import annotations

import numpy as np

from rescue.errors import InputError

#: Number of softmax rows and choices per row.
ROWS, CHOICES = 13, 3
STRATEGY_ROW = 0
FAST, THOROUGH = 0, 1
EDIT, TEST, SUBMIT = 0, 1, 2
#: Phases of the action rows.
START, EDITED1, EDITED2, EDITED3, TESTS_FAIL, TESTS_PASS = range(6)
PHASES = 6


def action_row(strategy: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Row index of the action decision for a strategy and a phase (vectorized)."""
    return 1 + PHASES * strategy + phase


def available() -> np.ndarray:
    """``[ROWS, CHOICES]`` bool: which choices exist on each row."""
    ok = np.ones((ROWS, CHOICES), dtype=bool)
    ok[STRATEGY_ROW, 2] = False
    ok[1 : 1 + PHASES, TEST] = False  # fast never runs tests
    return ok


class Policy:
    """Softmax rows with logits ``theta [ROWS, CHOICES]`` (unavailable entries ignored)."""

    def __init__(self, theta: np.ndarray) -> None:
        theta = np.array(theta, dtype=np.float64)
        if theta.shape != (ROWS, CHOICES):
            raise InputError(
                f"policy logits must have shape ({ROWS}, {CHOICES}); got {theta.shape}"
            )
        self.available = available()
        self.theta = np.where(self.available, theta, 0.0)

    def probs(self) -> np.ndarray:
        """``π [ROWS, CHOICES]``: softmax of each row over its available choices."""
        z = np.where(self.available, self.theta, -np.inf)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def gradient(self, rows: np.ndarray, choices: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """``Σ_d coef_d · ∇ log π(choice_d | row_d)`` at the current θ, shape ``[ROWS, CHOICES]``.

        Args:
            rows, choices: integer arrays of decisions, any shape; entries with ``rows < 0``
                are padding and ignored.
            coef: the per-decision coefficient (advantage / loss normalizer), same shape.
        """
        rows, choices, coef = (np.asarray(x).ravel() for x in (rows, choices, coef))
        real = rows >= 0
        r, c, w = rows[real], choices[real], coef[real]
        counts = np.bincount(r * CHOICES + c, weights=w, minlength=ROWS * CHOICES)
        visits = np.bincount(r, weights=w, minlength=ROWS)
        return counts.reshape(ROWS, CHOICES) - visits[:, None] * self.probs()

    def step(self, grad: np.ndarray, lr: float) -> None:
        """Gradient ascent on the objective: ``θ ← θ + lr · grad``."""
        self.theta = np.where(self.available, self.theta + lr * grad, 0.0)

    def p_thorough(self) -> float:
        """Probability of choosing the thorough strategy."""
        return float(self.probs()[STRATEGY_ROW, THOROUGH])
