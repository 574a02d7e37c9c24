"""The simulator's learning step, by hand: one fixed batch under each arm's rule.

The batch: two groups of two rollouts, a 2-turn cap, the policy at θ = 0 (so the strategy
row is (½, ½), fast's action rows (½, 0, ½), thorough's (⅓, ⅓, ⅓)). Decisions (row, choice):

    group 0  a: fast,     (0,0) (1,0) (2,2)  solved           R = 1, 2 turns
             b: thorough, (0,1) (7,0) (8,1)  capped           R = 0, 2 turns
    group 1  c: fast,     (0,0) (1,2)        submitted, wrong R = 0, 1 turn
             d: thorough, (0,1) (7,2)        solved           R = 1, 1 turn

Each expected step below is worked out in the comments from
``Δθ[row] = lr/N · Σ_i A_i Σ_{d on row} (e_choice − π(row))``; nothing is computed with the
code under test.
"""

import numpy as np
import pytest

from rescue.sim import ArmSpec, SimConfig, Simulation, update
from rescue.sim import policy as P

CFG = SimConfig(
    max_turns=2,
    group_size=2,
    groups_per_step=2,
    std_normalize=False,
    tis=False,
    lr=1.0,
    score_centering=False,
)
ROWS = [[[0, 1, 2], [0, 7, 8]], [[0, 1, -1], [0, 7, -1]]]
CHOICES = [[[0, 0, 2], [1, 0, 1]], [[0, 2, -1], [1, 2, -1]]]
REWARD = [[1.0, 0.0], [0.0, 1.0]]
LENGTHS = [[2, 2], [1, 1]]
CAPPED = [[False, True], [False, False]]


def batch(masked=False, weights=(1.0, 1.0), prob=None) -> update.Batch:
    rows, choices = np.array(ROWS), np.array(CHOICES)
    probs = P.Policy(np.zeros((P.ROWS, P.CHOICES))).probs()
    behaviour = np.where(rows >= 0, probs[np.maximum(rows, 0), np.maximum(choices, 0)], 1.0)
    if prob is not None:
        behaviour = np.array(prob, dtype=float)
    return update.Batch(
        rows=rows,
        choices=choices,
        prob=behaviour,
        reward=np.array(REWARD),
        lengths=np.array(LENGTHS),
        masked=np.array(CAPPED) & masked,
        weight=np.array(weights, dtype=float),
    )


def step(arm: str, b: update.Batch, cfg: SimConfig = CFG) -> np.ndarray:
    """Δθ of one update from θ = 0."""
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    update.step(pol, b, ArmSpec.parse(arm), cfg)
    return pol.theta


def expect(**rows) -> np.ndarray:
    out = np.zeros((P.ROWS, P.CHOICES))
    for r, v in rows.items():
        out[int(r[1:])] = v
    return out


def test_r0_step_by_hand():
    # Group means ½ and ½: A = (+½, −½, −½, +½); N = B·G = 4.
    # row 0: a ½(½,−½) + b −½(−½,½) + c −½(½,−½) + d ½(−½,½) = 0
    # row 1: a ½(½,0,−½) + c −½(−½,0,½) = (½,0,−½) → /4
    # row 2: a ½(−½,0,½) → /4;  row 7: b −½(⅔,−⅓,−⅓) + d ½(−⅓,−⅓,⅔) = (−½,0,½) → /4
    # row 8: b −½(−⅓,⅔,−⅓) = (⅙,−⅓,⅙) → /4
    want = expect(
        r1=[1 / 8, 0, -1 / 8], r2=[-1 / 16, 0, 1 / 16], r7=[-1 / 8, 0, 1 / 8],
        r8=[1 / 24, -1 / 12, 1 / 24],
    )  # fmt: skip
    assert step("zero", batch()) == pytest.approx(want)


def test_mask_step_zeroes_the_capped_rollout_but_keeps_its_vote_and_its_place_in_n():
    # b is masked: its decisions get 0, but the group mean is still ½ (b votes) and N = 4.
    # row 0: a ½(½,−½) + c −½(½,−½) + d ½(−½,½) = (−¼, ¼) → /4; row 7: d only; row 8: 0
    want = expect(
        r0=[-1 / 16, 1 / 16, 0], r1=[1 / 8, 0, -1 / 8], r2=[-1 / 16, 0, 1 / 16],
        r7=[-1 / 24, -1 / 24, 1 / 12],
    )  # fmt: skip
    assert step("mask", batch(masked=True)) == pytest.approx(want)


def test_matched_step_is_the_mask_direction_at_the_zero_steps_norm():
    zero, mask = step("zero", batch()), step("mask", batch(masked=True))
    matched = step("matched", batch(masked=True))
    scale = np.linalg.norm(zero) / np.linalg.norm(mask)
    assert abs(scale - 1) > 0.05  # the two steps differ in norm: the check below can fail
    assert matched == pytest.approx(scale * mask, rel=1e-12)
    assert np.linalg.norm(matched) == pytest.approx(np.linalg.norm(zero), rel=1e-12)
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    info = update.step(pol, batch(masked=True), ArmSpec.parse("matched"), CFG)
    assert info["update_norm_ref"] == pytest.approx(np.linalg.norm(zero), rel=1e-12)
    assert info["update_norm_mask"] == pytest.approx(np.linalg.norm(mask), rel=1e-12)
    assert info["update_scale"] == pytest.approx(scale, rel=1e-12)
    assert info["update_norm"] == pytest.approx(np.linalg.norm(zero), rel=1e-12)


def test_step_control_is_the_zero_direction_at_the_mask_steps_norm():
    """The step-size control: R = 0's step (the hand-computed one above) rescaled to the mask
    step's norm on the same batch, against the zero and mask arms' own steps."""
    zero, mask = step("zero", batch()), step("mask", batch(masked=True))
    ctl = step("step-control", batch(masked=True))
    scale = np.linalg.norm(mask) / np.linalg.norm(zero)
    assert abs(scale - 1) > 0.05
    assert ctl == pytest.approx(scale * zero, rel=1e-12)  # R = 0's direction
    assert np.linalg.norm(ctl) == pytest.approx(np.linalg.norm(mask), rel=1e-12)
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    info = update.step(pol, batch(masked=True), ArmSpec.parse("step-control"), CFG)
    assert info["update_norm_mask"] == pytest.approx(np.linalg.norm(mask), rel=1e-12)
    assert info["update_norm_ref"] == pytest.approx(np.linalg.norm(zero), rel=1e-12)
    assert info["update_scale"] == pytest.approx(scale, rel=1e-12)
    assert info["update_norm"] == pytest.approx(np.linalg.norm(mask), rel=1e-12)
    # the matched control goes the other way: the two are not the same arm
    assert not np.allclose(ctl, step("matched", batch(masked=True)))


def test_matched_step_without_a_masked_rollout_is_the_mask_and_zero_step():
    # nothing capped: the three arms take the same step, scale 1
    assert step("matched", batch()) == pytest.approx(step("zero", batch()), rel=1e-12)
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    assert update.step(pol, batch(), ArmSpec.parse("matched"), CFG)["update_scale"] == 1.0


def test_matched_scale_of_a_zero_mask_step():
    from rescue.mask import matched_scale

    assert matched_scale(2.0, 4.0) == 0.5
    assert matched_scale(0.0, 0.0) == 1.0
    assert np.isnan(matched_scale(1.0, 0.0))


def test_survivor_step_takes_the_baseline_over_the_kept_rollouts():
    # Group 0's only survivor is a: b = 1, A_a = 0. Group 1: b = ½, A = (−½, +½).
    # row 0: c −½(½,−½) + d ½(−½,½) = (−½, ½) → /4; row 1: c; row 7: d
    want = expect(r0=[-1 / 8, 1 / 8, 0], r1=[1 / 16, 0, -1 / 16], r7=[-1 / 24, -1 / 24, 1 / 12])
    assert step("survivor", batch(masked=True)) == pytest.approx(want)


def test_protect_weights_scale_after_normalization_and_wnorm_divides_by_their_sum():
    # Group 1 protected with weight 2: A = (+½, −½, −1, +1). N = 4 as is.
    # row 0: a (¼,−¼) + b (¼,−¼) + c −1(½,−½) + d (−½,½) = (−½, ½) → /4
    b = batch(weights=(1.0, 2.0))
    as_is = step("protect:0.5", b)
    assert as_is[0] == pytest.approx([-1 / 8, 1 / 8, 0])
    # wnorm: N = G · Σ w = 2 · 3 = 6 instead of 4.
    assert step("protect:0.5:wnorm", b) == pytest.approx(as_is * 4 / 6)
    # The weights are the group's, not a reward: group 1's row 7 doubles, group 0's does not.
    assert as_is[7] == pytest.approx(
        [(-1 / 3 - 2 / 6) / 4, (1 / 6 - 2 / 6) / 4, (1 / 6 + 4 / 6) / 4]
    )


def test_turn_baseline_step_uses_the_other_rollouts_that_reached_the_turn():
    # a: the other member (b) reached turns 1 and 2 with R = 0: m = 0, b̄ = 0 → b_aℓ = 0, A = 1.
    # b: a reached both turns with R = 1 → b = 1, A = −1. c: d reached turn 1, R = 1 → A = −1;
    # d: A = +1. row 7: b −1(⅔,−⅓,−⅓) + d (−⅓,−⅓,⅔) = (−1, 0, 1) → /4
    got = step("turn-baseline", batch(), CFG.replace(kappa=2.0))
    assert got[7] == pytest.approx([-1 / 4, 0, 1 / 4])
    assert got[0] == pytest.approx([0, 0, 0])


def test_tis_multiplies_each_decision_by_its_truncated_ratio():
    # d's strategy decision was drawn with probability ¼ by the launching policy; now ½:
    # ratio 2, clipped at 1.5. row 0 (zero arm): a + b + c + 1.5·d = (−⅛, ⅛) → /4
    prob = np.where(np.array(ROWS) >= 0, 0.5, 1.0)
    prob[:, :, 1:] = batch().prob[:, :, 1:]
    prob[1, 1, 0] = 0.25
    got = step("zero", batch(prob=prob), CFG.replace(tis=True, tis_clip=1.5))
    assert got[0] == pytest.approx([-1 / 32, 1 / 32, 0])
    assert step("zero", batch(prob=prob), CFG.replace(tis=False))[0] == pytest.approx([0, 0, 0])


def test_the_batch_scope_takes_one_baseline_over_every_rollout():
    b = batch()
    b.reward = np.array([[1.0, 0.0], [0.0, 0.0]])
    group = update.advantages(b, ArmSpec.parse("zero"), CFG)[:, :, 0]
    whole = update.advantages(b, ArmSpec.parse("zero"), CFG.replace(baseline_scope="batch"))
    assert group == pytest.approx(np.array([[0.5, -0.5], [0.0, 0.0]]))
    assert whole[:, :, 0] == pytest.approx(np.array([[0.75, -0.25], [-0.25, -0.25]]))


def test_std_normalization_divides_by_the_groups_std():
    A = update.advantages(batch(), ArmSpec.parse("zero"), CFG.replace(std_normalize=True))
    # each group's rewards are {1, 0}: σ (ddof 1) = 1/√2, so ±½ becomes ±1/√2.
    assert A[:, :, 0] == pytest.approx(np.array([[1, -1], [-1, 1]]) / np.sqrt(2), rel=1e-5)


def test_p7_statistic_by_hand_over_the_trained_rollouts_only():
    # Group mean: ±½ on all 10 decisions → variance ¼. Leave-one-out: ±1 → 1. Turn-reached:
    # ±1 (as above) → 1.
    v = update.p7_variances(update.p7_moments(batch(), CFG))
    assert v == pytest.approx({"group_mean": 0.25, "leave_one_out": 1.0, "turn_reached": 1.0})
    # Masked b leaves: group mean over a (+½ ×3), c (−½ ×2), d (+½ ×2): mean 3/14, E[x²] ¼.
    v = update.p7_variances(update.p7_moments(batch(masked=True), CFG))
    assert v["group_mean"] == pytest.approx(0.25 - (3 / 14) ** 2)


def test_padding_decisions_never_move_the_policy():
    b = batch()
    b.choices = np.where(b.rows < 0, 2, b.choices)  # garbage behind the padding
    assert step("zero", b) == pytest.approx(step("zero", batch()))


#: Every task needs two correct edits, a 10-turn cap: success starts near 0.6.
EASY = SimConfig(
    difficulty=((2, 1.0),), max_turns=10, steps=40, lr=1.0, groups_per_step=8, group_size=8,
    concurrency=8, buffer_capacity=16,
)  # fmt: skip


def success(steps, start: int, stop: int) -> tuple[float, float]:
    """Success of the rollouts launched with the weights of steps[start:stop], its binomial SE."""
    rows = [m for m in steps[start:stop] if "sim/launched/rollouts" in m]
    n = sum(m["sim/launched/rollouts"] for m in rows)
    k = sum(m["sim/launched/outcome/solved"] for m in rows)
    p = k / n
    return p, float(np.sqrt(p * (1 - p) / n))


def test_success_rises_under_ascent_and_falls_under_descent():
    ascent = Simulation(EASY, ArmSpec.parse("zero"), 0).run()
    descent_sim = Simulation(EASY, ArmSpec.parse("zero"), 0)
    real = descent_sim.policy.step
    descent_sim.policy.step = lambda grad, lr: real(grad, -lr)
    descent = descent_sim.run()
    (p0, s0), (p1, s1) = success(ascent, 0, 1), success(ascent, 30, 40)
    (q0, t0), (q1, t1) = success(descent, 0, 1), success(descent, 30, 40)
    assert p0 == q0  # the same rollouts: launched with the same weights, before any update
    assert p1 - p0 > 5 * np.hypot(s0, s1)
    assert q0 - q1 > 5 * np.hypot(t0, t1)
