"""The stale-group gate: determinism, independence, keep rate, weights, unbiasedness."""

import math
import subprocess
import sys

import numpy as np
import pytest

from rescue.census import Bucket
from rescue.gate import Arm, Gate, coin


def test_coin_is_identical_in_another_process():
    ids = [0, 1, 17, "g-42", 10**12]
    here = [coin(7, g) for g in ids]
    code = f"from rescue.gate import coin; print([coin(7, g) for g in {ids!r}])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert eval(there.stdout) == here


def test_a_group_reaching_the_gate_twice_gets_the_same_answer():
    gate = Gate(arm="protect", a=0.5, seed=3, max_staleness=1)
    first = [gate.decide(g, staleness=5) for g in range(200)]
    restarted = Gate(arm="protect", a=0.5, seed=3, max_staleness=1)  # a new process, a restart
    assert [restarted.decide(g, staleness=5) for g in range(200)] == first
    assert [gate.decide(g, staleness=9) for g in range(200)] == first  # retried, staler


def test_keep_rate_converges_to_a():
    # n Bernoulli(a) coins: the keep fraction has sd sqrt(a(1-a)/n); allow 5 sd.
    n = 20_000
    for a in (0.1, 0.5, 0.9):
        gate = Gate(arm="protect", a=a, seed=11, max_staleness=0)
        kept = sum(gate.decide(g, staleness=1).keep for g in range(n))
        assert abs(kept / n - a) < 5 * math.sqrt(a * (1 - a) / n)


def test_coins_are_independent_across_ids_and_seeds():
    # Uniform coins: correlation of independent pairs has sd 1/sqrt(n); allow 5 sd.
    n = 20_000
    u0 = np.array([coin(0, g) for g in range(n)])
    u1 = np.array([coin(1, g) for g in range(n)])
    shifted = np.array([coin(0, g + 1) for g in range(n)])
    bound = 5 / math.sqrt(n)
    assert abs(np.corrcoef(u0, u1)[0, 1]) < bound
    assert abs(np.corrcoef(u0, shifted)[0, 1]) < bound
    assert abs(u0.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert u0.min() >= 0.0 and u0.max() < 1.0


def test_weights_per_arm():
    fresh = 0
    stale = 3
    for arm in Arm:
        gate = Gate(arm=arm, a=0.25 if arm is Arm.PROTECT else None, seed=0, max_staleness=2)
        d = gate.decide(1, fresh)
        assert (d.keep, d.weight, d.stale) == (True, 1.0, False)
    assert Gate(arm="drop", max_staleness=2).decide(1, stale).keep is False
    d = Gate(arm="never-drop", max_staleness=2).decide(1, stale)
    assert (d.keep, d.weight, d.protected) == (True, 1.0, False)
    gate = Gate(arm="protect", a=0.25, seed=0, max_staleness=2)
    decisions = [gate.decide(g, stale) for g in range(400)]
    assert {d.weight for d in decisions if d.keep} == {4.0}
    assert all(d.protected for d in decisions if d.keep)
    assert {d.weight for d in decisions if not d.keep} == {0.0}


def test_pace_keeps_a_group_that_arrives_stale_and_counts_it_stale():
    """Under pace no group should arrive stale; one that does is kept with weight 1 and
    lands in ``trained_stale`` (never dropped, never counted fresh)."""
    gate = Gate(arm="pace", max_staleness=2)
    assert gate.describe() == "pace seed=0 K=2"
    for g in range(50):
        d = gate.decide(g, 2 + g % 5)
        assert d.stale is (g % 5 > 0)
        assert (d.keep, d.weight, d.protected) == (True, 1.0, False)
        assert Bucket.after_gate(d) is (Bucket.TRAINED_STALE if d.stale else Bucket.TRAINED_FRESH)
    assert Gate(arm="pace", max_staleness=2).decide(1, 9) == Gate(
        arm="never-drop", max_staleness=2
    ).decide(1, 9)


def test_only_drop_and_protect_can_drop():
    assert {arm for arm in Arm if arm.drops} == {Arm.DROP, Arm.PROTECT}
    for arm in Arm:
        gate = Gate(arm=arm, a=0.5 if arm is Arm.PROTECT else None, max_staleness=0)
        kept = [gate.decide(g, 1).keep for g in range(200)]
        assert all(kept) is not arm.drops


def test_a_equal_one_is_never_drop():
    gate = Gate(arm="protect", a=1.0, seed=5, max_staleness=0)
    assert all(
        gate.decide(g, 10) == Gate(arm="never-drop", max_staleness=0).decide(g, 10)
        for g in range(500)
    )


def test_unknown_staleness_or_no_limit_is_fresh():
    assert not Gate(arm="drop", max_staleness=2).decide(1, None).stale
    assert not Gate(arm="drop", max_staleness=None).decide(1, 100).stale
    assert Gate(arm="drop", max_staleness=2).decide(1, 2).keep  # staleness == K is not stale


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"arm": "keep"},
            r"RESCUE_ARM='keep' is not an arm; allowed: drop, never-drop, protect, pace$",
        ),
        ({"arm": "protect"}, r"RESCUE_A \(a\) is required with arm protect"),
        ({"arm": "protect", "a": 0.0}, r"RESCUE_A=0.0 is out of range; allowed: 0 < a <= 1"),
        ({"arm": "protect", "a": 1.5}, r"out of range"),
        ({"arm": "protect", "a": float("nan")}, r"not finite"),
        ({"arm": "drop", "max_staleness": -1}, r"max_weight_staleness=-1"),
    ],
)
def test_invalid_settings_name_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Gate(**kwargs)


def test_from_env_reads_the_documented_settings():
    gate = Gate.from_env(
        {"RESCUE_ARM": "protect", "RESCUE_A": "0.5", "RESCUE_SEED": "9"}, max_staleness=4
    )
    assert (gate.arm, gate.a, gate.seed, gate.max_staleness) == (Arm.PROTECT, 0.5, 9, 4)
    assert Gate.from_env({}).arm is Arm.DROP
    assert Gate.from_env({"RESCUE_ARM": "PACE"}, max_staleness=1).arm is Arm.PACE
    with pytest.raises(ValueError, match="RESCUE_A='half' is not a number"):
        Gate.from_env({"RESCUE_ARM": "protect", "RESCUE_A": "half"})
    with pytest.raises(ValueError, match="RESCUE_SEED='x' is not an integer"):
        Gate.from_env({"RESCUE_SEED": "x"})


def test_protect_weighted_sum_is_unbiased_for_never_drop():
    """E[sum_g w_g L_g] = sum_g L_g under protect, over independent coin seeds.

    Per seed the estimator S has Var(S) = sum_{stale g} L_g^2 (1/a - 1) (fresh groups are
    deterministic). Averaging R seeds gives standard error sqrt(Var(S)/R); allow 5 of them.
    """
    rng = np.random.default_rng(0)
    n_groups, reps, a = 300, 1500, 0.3
    losses = rng.normal(1.0, 2.0, n_groups)  # any per-group loss contribution
    staleness = rng.integers(0, 5, n_groups)
    target = losses.sum()  # never-drop keeps everything with weight 1
    stale = staleness > 2
    var_s = float((losses[stale] ** 2).sum() * (1 / a - 1))
    estimates = []
    for seed in range(reps):
        gate = Gate(arm="protect", a=a, seed=seed, max_staleness=2)
        w = np.array([gate.decide(g, int(s)).weight for g, s in enumerate(staleness)])
        estimates.append(float((w * losses).sum()))
    assert abs(np.mean(estimates) - target) < 5 * math.sqrt(var_s / reps)
    # and its spread is the predicted one (sample variance within 15% for R=1500)
    assert np.var(estimates) == pytest.approx(var_s, rel=0.15)
    # the drop arm is biased: it misses exactly the stale groups' contribution
    drop = Gate(arm="drop", max_staleness=2)
    w = np.array([drop.decide(g, int(s)).weight for g, s in enumerate(staleness)])
    assert (w * losses).sum() == pytest.approx(target - losses[stale].sum())


@pytest.mark.parametrize(
    "arm, a", [("drop", None), ("never-drop", None), ("protect", 0.5), ("pace", None)]
)
def test_decide_is_decide_drawn_on_the_group_coin(arm, a):
    """The oracle rebuilds each arm's selection from recorded (stale, coin) with the same rule."""
    gate = Gate(arm=arm, a=a, seed=3, max_staleness=1)
    for gid in range(50):
        for staleness in (0, 1, 2, None):
            assert gate.decide(gid, staleness) == gate.decide_drawn(
                gate.is_stale(staleness), coin(3, gid)
            )
