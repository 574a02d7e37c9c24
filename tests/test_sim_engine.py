"""The simulator's trainer loop: determinism, the shared core objects, conservation, arms."""

import json
from collections import Counter

import numpy as np
import pytest

import filters.mask
import rescue.advantages
import rescue.census
import rescue.gate
import rescue.mask
import rescue.outcomes
from rescue.census import Bucket
from rescue.sim import ArmSpec, SimConfig, Simulation, engine, env, update
from rescue.sim.runner import run_arms

TINY = SimConfig(
    steps=20, groups_per_step=4, group_size=4, concurrency=4, buffer_capacity=8, max_turns=12
)


def run(arm: str, seed: int = 0, cfg: SimConfig = TINY) -> tuple[Simulation, list[dict]]:
    sim = Simulation(cfg, ArmSpec.parse(arm), seed)
    return sim, sim.run()


def test_a_seed_gives_the_same_run_twice():
    _, a = run("protect:0.5", seed=3)
    _, b = run("protect:0.5", seed=3)
    assert json.dumps(a) == json.dumps(b)


def test_different_seeds_give_different_runs():
    _, a = run("never-drop", seed=0)
    _, b = run("never-drop", seed=1)
    assert json.dumps(a) != json.dumps(b)


def test_results_do_not_depend_on_the_number_of_worker_processes():
    arms = [ArmSpec.parse("drop"), ArmSpec.parse("mask")]
    one = run_arms(TINY, arms, [0, 1], workers=1, progress=False)
    two = run_arms(TINY, arms, [0, 1], workers=2, progress=False)
    for label in one:
        assert [r.steps for r in one[label]] == [r.steps for r in two[label]]


def test_the_simulator_uses_the_adapters_core_objects_not_copies():
    sim, _ = run("protect:0.5")
    assert type(sim.gate) is rescue.gate.Gate
    assert type(sim.census) is rescue.census.Census
    assert engine.Census is rescue.census.Census
    assert engine.RolloutRecord is rescue.census.RolloutRecord
    assert engine.outcome_metrics is rescue.census.outcome_metrics
    assert update.group_advantages is rescue.advantages.group_advantages
    assert update.per_token_advantages is rescue.advantages.per_token_advantages
    assert engine.mask_decision is rescue.mask.mask_decision is filters.mask.mask_decision
    assert engine.Bucket is rescue.census.Bucket
    assert engine.is_capped is rescue.outcomes.is_capped
    assert env.classify is rescue.outcomes.classify


def test_every_stale_decision_goes_through_the_shared_gate(monkeypatch):
    calls = []
    real = rescue.gate.Gate.decide

    def spy(self, group_id, staleness):
        d = real(self, group_id, staleness)
        calls.append(d)
        return d

    monkeypatch.setattr(rescue.gate.Gate, "decide", spy)
    sim, _ = run("drop")
    t = sim.census.totals()
    assert len(calls) == t["trained_fresh"] + t["dropped_stale"]
    assert sum(not d.keep for d in calls) == t["dropped_stale"] > 0


def test_outcome_classes_come_from_the_one_classifier():
    expected = [
        rescue.outcomes.Outcome.SOLVED,
        rescue.outcomes.Outcome.SUBMITTED_FAILURE,
        rescue.outcomes.Outcome.BUDGET_FAILURE,
        rescue.outcomes.Outcome.INFRA_NO_RESULT,
    ]
    assert [c.outcome for c in env.CLASSIFICATIONS] == expected
    assert [rescue.outcomes.is_capped(c) for c in env.CLASSIFICATIONS] == [
        False,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize(
    "arm", ["drop", "never-drop", "protect:0.3", "mask", "survivor", "turn-baseline"]
)
def test_every_group_that_entered_lands_in_exactly_one_bucket(arm):
    cfg = TINY.replace(infra_rate=0.05)
    sim, steps = run(arm, cfg=cfg)
    t = sim.census.totals()
    settled = sum(v for k, v in t.items() if k not in ("entered", "buffered"))
    assert t["entered"] == settled + t["buffered"]
    assert t["entered"] == sum(m["rollout/census/groups/entered"] for m in steps)
    trained = t["trained_fresh"] + t["trained_stale"] + t["trained_protected"]
    assert trained == cfg.steps * cfg.groups_per_step  # every step trains a full batch
    assert t["aborted"] > 0  # lost rollouts abort their group, counted, never lost silently
    # Rollouts: every generated rollout is in the sample-level census exactly once.
    generated = sum(m["rollout/census/generated/rollouts"] for m in steps)
    assert generated == t["entered"] * cfg.group_size
    per_step = [m["rollout/census/rollouts"] for m in steps]
    assert per_step == [cfg.groups_per_step * cfg.group_size] * cfg.steps


def test_staleness_comes_from_the_timing():
    # More groups in flight per batch means each group spans more weight updates.
    _, few = run("never-drop", cfg=TINY.replace(concurrency=2, steps=30))
    _, many = run("never-drop", cfg=TINY.replace(concurrency=16, steps=30))

    def mean_staleness(steps):
        return np.mean([m.get("rollout/census/staleness_mean", 0.0) for m in steps[5:]])

    assert mean_staleness(many) > mean_staleness(few) + 0.5


def test_the_stale_arms_differ_only_in_what_they_do_with_stale_groups():
    drop, _ = run("drop")
    never, _ = run("never-drop")
    protect, steps = run("protect:0.25")
    assert drop.census.totals()["dropped_stale"] > 0
    assert drop.census.totals()["trained_stale"] == 0
    assert never.census.totals()["dropped_stale"] == 0
    assert never.census.totals()["trained_stale"] > 0
    t = protect.census.totals()
    assert t["trained_protected"] > 0 and t["dropped_stale"] > 0
    weights = [
        m["rollout/census/protected_weight_mean"]
        for m in steps
        if "rollout/census/protected_weight_mean" in m
    ]
    assert weights and all(w == pytest.approx(4.0) for w in weights)


def test_protect_with_a_equal_1_is_never_drop():
    _, never = run("never-drop")
    _, protect1 = run("protect:1")
    assert json.dumps(never) == json.dumps(protect1)


def test_zero_and_never_drop_are_the_same_configuration():
    assert ArmSpec.parse("zero").behaviour == ArmSpec.parse("never-drop").behaviour
    _, zero = run("zero")
    _, never = run("never-drop")
    assert json.dumps(zero) == json.dumps(never)


def test_mask_arms_mask_exactly_the_capped_rollouts():
    for arm in ("mask", "survivor"):
        _, steps = run(arm)
        capped = [m for m in steps if m.get("rollout/census/outcome/budget_failure", 0) > 0]
        assert capped, "the tiny configuration should hit the 12-turn cap"
        for m in capped:
            assert m["rollout/census/masked_frac/budget_failure"] == 1.0
            assert m.get("rollout/census/masked_frac/solved", 0.0) == 0.0
    for arm in ("zero", "turn-baseline", "drop"):
        _, steps = run(arm)
        assert all(m["rollout/census/masked_frac"] == 0.0 for m in steps)


def _spy_advantages(monkeypatch):
    calls = []
    real_group, real_token = update.group_advantages, update.per_token_advantages

    def group(*a, **kw):
        calls.append(("group", kw))
        return real_group(*a, **kw)

    def token(*a, **kw):
        calls.append(("token", kw))
        return real_token(*a, **kw)

    monkeypatch.setattr(update, "group_advantages", group)
    monkeypatch.setattr(update, "per_token_advantages", token)
    return calls


def _update_calls(calls, kind):
    """The update's calls (they pass the loss weights); the P7 statistic's pass none."""
    return [kw for k, kw in calls if k == kind and "weights" in kw]


def test_each_arm_asks_the_normalizer_for_its_baseline(monkeypatch):
    calls = _spy_advantages(monkeypatch)
    run("survivor", cfg=TINY.replace(steps=3))
    group = _update_calls(calls, "group")
    assert len(group) == 3 and all(kw["population"] == "survivors" for kw in group)
    assert any(not np.all(kw["kept"]) for kw in group)  # capped rollouts are not survivors

    calls.clear()
    run("turn-baseline", cfg=TINY.replace(steps=3, kappa=0.7))
    assert not _update_calls(calls, "group")
    token = _update_calls(calls, "token")
    assert len(token) == 3 and all(kw["kappa"] == 0.7 for kw in token)

    calls.clear()
    run("protect:0.25", cfg=TINY.replace(steps=10))
    weights = np.concatenate([kw["weights"] for kw in _update_calls(calls, "group")])
    assert set(np.unique(weights)) <= {1.0, 4.0} and 4.0 in weights  # 1/a, after normalization


def test_p7_statistic_uses_the_normalizers_baselines(monkeypatch):
    calls = _spy_advantages(monkeypatch)
    run("drop", cfg=TINY.replace(steps=2, kappa=0.7))
    p7 = [(k, kw) for k, kw in calls if "weights" not in kw]
    assert sorted(kw["population"] for k, kw in p7 if k == "group") == ["all", "all", "loo", "loo"]
    assert all(kw["std_normalize"] is False for _, kw in p7)
    assert [kw["kappa"] for k, kw in p7 if k == "token"] == [0.7, 0.7]


def test_the_simulator_buckets_groups_by_the_shared_gate_mapping(monkeypatch):
    """Every group the trainer gets is settled in the bucket Bucket.after_gate names."""
    seen = []
    real = Bucket.after_gate.__func__

    def spy(cls, decision):
        seen.append(real(cls, decision))
        return seen[-1]

    monkeypatch.setattr(Bucket, "after_gate", classmethod(spy))
    sim, _ = run("protect:0.5", cfg=TINY.replace(steps=6, max_staleness=0))
    got = Counter(b.value for b in seen)
    totals = sim.census.totals()
    for b in (Bucket.TRAINED_FRESH, Bucket.TRAINED_PROTECTED, Bucket.DROPPED_STALE):
        assert got[b.value] == totals[b.value] > 0


def test_no_update_means_the_policy_stays_put():
    _, steps = run("never-drop", cfg=TINY.replace(lr=0.0))
    assert [m["sim/p_thorough"] for m in steps] == [pytest.approx(0.5)] * len(steps)


def test_the_census_pays_masked_rollouts_under_the_arms_baseline_population(monkeypatch):
    """b_paid/masked of the first step, recomputed by hand from the groups the census
    settled: each masked rollout is paid its group's mean reward (mask, population all) or
    the mean over the group's unmasked members (survivor)."""
    settled = []
    real = rescue.census.Census.settle

    def spy(self, group_id, bucket, rollouts=(), **kw):
        rollouts = list(rollouts)
        settled.append((Bucket(bucket), rollouts))
        return real(self, group_id, bucket, rollouts, **kw)

    monkeypatch.setattr(rescue.census.Census, "settle", spy)
    for arm, population in (("mask", "all"), ("survivor", "survivors"), ("zero", "all")):
        settled.clear()
        sim, [m] = run(arm, cfg=TINY.replace(steps=1, groups_per_step=16, group_size=8))
        assert sim.census.population == population
        paid = []
        for bucket, recs in settled:
            if not bucket.trained:
                continue
            voters = [r.reward for r in recs if population == "all" or not r.masked]
            b = float(np.mean(voters)) if voters else 0.0
            paid += [b for r in recs if r.masked]
        assert m["rollout/census/b_paid/masked_rollouts"] == len(paid)
        if arm == "zero":
            assert not paid and "rollout/census/b_paid/masked" not in m
        else:
            assert paid, "the tiny configuration should mask capped rollouts"
            assert m["rollout/census/b_paid/masked"] == pytest.approx(np.mean(paid))


def test_groups_with_a_lost_rollout_are_aborted_with_their_reason_in_every_arm():
    """The simulator applies the buffer's rule (rescue.census.no_result) at put."""
    for arm in ("drop", "never-drop", "protect:0.5"):
        _, steps = run(arm, cfg=TINY.replace(infra_rate=0.05))
        aborted = sum(m["rollout/census/groups/aborted"] for m in steps)
        by_reason = sum(m.get("rollout/census/aborted/reason/aborted", 0) for m in steps)
        assert aborted == by_reason > 0
        assert all(m["rollout/census/outcome/infra_no_result"] == 0 for m in steps)
