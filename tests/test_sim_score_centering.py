"""Score centering in the simulator's trainer: the staleness drift, removed.

The simulator's sampler/trainer mismatch is staleness: decisions were drawn by the
launching policy ``q``, the trainer takes the gradient at its current ``p``. The batches
below hold each row's decisions in exactly ``q``'s proportions, so the batch sum *is* the
expectation over ``q``; with the advantage constant on a row, the covariance term is zero
there and whatever gradient the row gets is drift.
"""

from __future__ import annotations

import numpy as np
import pytest

from rescue.sim import ArmSpec, SimConfig, update
from rescue.sim import policy as P

ZERO = ArmSpec.parse("zero")
CFG = SimConfig(max_turns=1, group_size=8, groups_per_step=1, std_normalize=False, lr=1.0)
#: Launching policy: strategy (½, ½); fast's start row (¾, 0, ¼); thorough's (¼, ¼, ½).
Q0, Q1, Q7 = [0.5, 0.5, 0.0], [0.75, 0.0, 0.25], [0.25, 0.25, 0.5]


def batch(current_is_launch: bool = False) -> update.Batch:
    """One group of 8: four fast rollouts (R = 0) and four thorough ones (R = 1), one
    action each, every row's choices in the launching policy's exact proportions."""
    rows = np.array([[[0, 1]] * 4 + [[0, 7]] * 4])
    choices = np.array([[[0, 0], [0, 0], [0, 0], [0, 2], [1, 0], [1, 1], [1, 2], [1, 2]]])
    q = np.zeros((P.ROWS, P.CHOICES))
    q[0], q[1], q[7] = Q0, Q1, Q7
    if current_is_launch:
        q = P.Policy(np.zeros((P.ROWS, P.CHOICES))).probs()
    behaviour = q[rows]
    return update.Batch(
        rows=rows,
        choices=choices,
        prob=np.take_along_axis(behaviour, choices[..., None], -1)[..., 0],
        reward=np.array([[0.0] * 4 + [1.0] * 4]),
        lengths=np.ones((1, 8), dtype=np.int64),
        masked=np.zeros((1, 8), dtype=bool),
        weight=np.ones(1),
        behaviour=behaviour,
    )


def gradient(cfg: SimConfig, b: update.Batch | None = None) -> np.ndarray:
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))  # the current policy: uniform rows
    grad, _ = update.gradient(pol, b or batch(), ZERO, cfg, pol.probs())
    return grad


@pytest.mark.parametrize(("tis", "clip"), [(True, 1.2), (False, 2.0)])
def test_centering_removes_the_drift_on_rows_with_a_constant_advantage(tis, clip):
    cfg = CFG.replace(tis=tis, tis_clip=clip)
    without = gradient(cfg.replace(score_centering=False))
    centred = gradient(cfg.replace(score_centering=True))
    # rows 1 and 7: every decision has A = ∓½: their whole gradient is drift
    for row in (1, 7):
        assert np.abs(without[row]).max() > 1e-3
        np.testing.assert_allclose(centred[row], 0.0, atol=1e-12)
    # row 0: the advantage differs between the strategies (the signal) and q = p there,
    # so centering changes nothing
    np.testing.assert_allclose(centred[0], without[0], atol=1e-12)
    assert np.abs(centred[0]).max() > 0.02


def test_untruncated_weights_leave_no_drift_and_no_correction():
    """min(p/q, C) with no ratio above C is plain importance sampling: E_q[w ∇log p] = 0."""
    cfg = CFG.replace(tis=True, tis_clip=10.0)
    without = gradient(cfg.replace(score_centering=False))
    np.testing.assert_allclose(without[[1, 7]], 0.0, atol=1e-12)
    np.testing.assert_allclose(gradient(cfg.replace(score_centering=True)), without, atol=1e-12)


def test_fresh_decisions_get_no_correction():
    b = batch(current_is_launch=True)
    for tis in (True, False):
        cfg = CFG.replace(tis=tis, tis_clip=1.2)
        np.testing.assert_allclose(
            gradient(cfg.replace(score_centering=True), b),
            gradient(cfg.replace(score_centering=False), b),
            atol=1e-12,
        )


def test_the_step_reports_the_corrections_size_and_needs_the_launching_rows():
    from rescue.errors import InputError

    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    info = update.step(pol, batch(), ZERO, CFG.replace(tis=True, tis_clip=1.2))
    # row 7: c = min(p, 1.2 q) − p = (−1/30, −1/30, 0); row 1 (test unavailable):
    # (min(½, 0.9) − ½, 0, min(½, 0.3) − ½) = (0, 0, −0.2); row 0: q = p, 0
    assert info["sc_correction_l1"] == pytest.approx((4 * 2 / 30 + 4 * 0.2) / 16)
    b = batch()
    b.behaviour = None
    with pytest.raises(InputError, match="launching row"):
        update.step(pol, b, ZERO, CFG)


def test_the_simulation_records_the_launching_rows_and_trains_with_them():
    from rescue.sim import Simulation

    cfg = SimConfig(steps=4, groups_per_step=4, group_size=4, concurrency=8, max_turns=8,
                    max_staleness=4, lr=1.0, tis_clip=1.01)  # fmt: skip
    rows = Simulation(cfg, ZERO, seed=0).run()
    # the first batch is fresh (nothing to correct); later ones were launched by older weights
    assert rows[0]["sim/sc_correction_l1"] == 0.0
    assert all(r["sim/sc_correction_l1"] > 0 for r in rows[1:])
    off = Simulation(cfg.replace(score_centering=False), ZERO, seed=0).run()
    assert "sim/sc_correction_l1" not in off[-1]
    assert off[-1]["sim/update_norm"] != pytest.approx(rows[-1]["sim/update_norm"])
