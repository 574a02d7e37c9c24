"""The census: every entry in exactly one bucket, and the per-step metrics."""

from collections import deque

import numpy as np
import pytest

from rescue.census import PREFIX, Bucket, Census, RolloutRecord, outcome_metrics, quantile
from rescue.gate import Gate
from rescue.outcomes import Outcome

P = "rollout/census/"


def _rec(outcome, reward=0.0, turns=5, **kw):
    return RolloutRecord(outcome=Outcome(outcome), reward=reward, turns=turns, **kw)


def test_conservation_under_random_aborts_staleness_and_retries():
    """A toy buffer with aborts, a dynamic filter, stale drops and recycling.

    Whatever the event order, entered == settled + buffered, and the census' open entries
    equal the toy queue's length at every step.
    """
    rng = np.random.default_rng(1)
    gate = Gate(arm="protect", a=0.4, seed=2, max_staleness=1)
    census = Census()
    queue: deque = deque()
    version, next_id, recycled = 0, 0, deque()
    seen_buckets = set()
    for _step in range(300):
        for _ in range(rng.integers(0, 6)):  # puts
            if recycled and rng.random() < 0.5:
                gid = recycled.popleft()
            else:
                gid, next_id = next_id, next_id + 1
            census.enter(gid)
            u = rng.random()
            if u < 0.1:
                requeued = rng.random() < 0.5
                census.settle(gid, Bucket.ABORTED, requeued=requeued)
                if requeued:
                    recycled.append(gid)  # retry handler
            elif u < 0.13:
                census.settle(gid, Bucket.LOST, reason="RuntimeError")  # generation raised
            elif u < 0.2:
                census.settle(gid, Bucket.FILTERED)
            else:
                queue.append((gid, version))
        for _ in range(rng.integers(0, 5)):  # gets
            if not queue:
                break
            gid, born = queue.popleft()
            d = gate.decide(gid, version - born)
            bucket = (
                Bucket.DROPPED_STALE
                if not d.keep
                else Bucket.TRAINED_PROTECTED
                if d.protected
                else Bucket.TRAINED_STALE
                if d.stale
                else Bucket.TRAINED_FRESH
            )
            census.settle(
                gid, bucket, [_rec("solved", 1.0)], staleness=version - born, weight=d.weight
            )
            if bucket is Bucket.DROPPED_STALE:
                recycled.append(gid)
        version += int(rng.random() < 0.5)
        m = census.step_metrics(queue_size=len(queue))
        seen_buckets |= {b for b in Bucket if m[f"{P}groups/{b.value}"] > 0}
        assert m[f"{P}groups/requeued"] <= m[f"{P}groups/aborted"]
        assert m.get(f"{P}lost/reason/RuntimeError", 0.0) == m[f"{P}groups/lost"]
    t = census.totals()
    assert t["entered"] == sum(t[b.value] for b in Bucket) + t["buffered"]
    assert t["buffered"] == len(queue)
    # protect with a<1 never keeps at weight 1; only a restart loses groups (its own test)
    assert seen_buckets == set(Bucket) - {Bucket.TRAINED_STALE, Bucket.LOST_AT_RESTART}


def test_a_queue_that_disagrees_with_the_census_is_caught():
    census = Census()
    census.enter(1)
    census.enter(2)
    census.settle(1, Bucket.TRAINED_FRESH)
    census.check(queue_size=1)
    with pytest.raises(AssertionError, match="holds 0 groups but 1 entries are open"):
        census.step_metrics(queue_size=0)


def test_settling_an_entry_that_is_not_open_is_an_error():
    census = Census()
    census.enter("g")
    census.settle("g", Bucket.DROPPED_STALE)
    with pytest.raises(
        ValueError, match="group 'g' settled as trained_fresh but has no open entry"
    ):
        census.settle("g", Bucket.TRAINED_FRESH)
    with pytest.raises(ValueError, match="never entered"):
        census.settle("h", Bucket.ABORTED)
    census.check()


def test_step_metrics_values_and_window_reset():
    census = Census()
    for g in range(4):
        census.enter(g)
    census.settle(
        0,
        Bucket.TRAINED_FRESH,
        [_rec("solved", 1.0, 3, ran_tests=True), _rec("budget_failure", 0.0, 40, capped=True)],
        staleness=0,
    )
    census.settle(
        1,
        Bucket.TRAINED_PROTECTED,
        [_rec("solved", 1.0, 9, ran_tests=False), _rec("submitted_failure", 0.0, 7)],
        staleness=3,
        weight=2.0,
    )
    census.settle(
        2, Bucket.DROPPED_STALE, [_rec("solved", 1.0, 30), _rec("solved", 1.0, 35)], staleness=4
    )
    m = census.step_metrics()
    assert m[P + "groups/entered"] == 4
    assert m[P + "groups/buffered"] == 1
    assert m[P + "groups/trained_fresh"] == 1 and m[P + "groups/trained_protected"] == 1
    assert m[P + "staleness_mean"] == 1.5 and m[P + "staleness_max"] == 3
    assert m[P + "protected_groups"] == 1 and m[P + "protected_weight_mean"] == 2.0
    assert m[P + "rollouts"] == 4
    assert m[P + "outcome/solved"] == 2 and m[P + "outcome/solved_rate"] == 0.5
    assert m[P + "cap_hit_rate"] == 0.25
    assert m[P + "b_realized"] == 0.5
    assert m[P + "ran_tests_rate/solved"] == 0.5
    assert m[P + "turns_mean/solved"] == 6.0
    assert m[P + "dropped/outcome/solved"] == 2
    nxt = census.step_metrics()
    assert nxt[P + "groups/entered"] == 0 and nxt[P + "rollouts"] == 0
    assert nxt[P + "groups/buffered"] == 1  # the open entry is still there


def test_outcome_metrics_masked_fraction_and_b_excludes_masked():
    recs = [
        _rec("budget_failure", 0.0, 40, capped=True, masked=True),
        _rec("budget_failure", 0.0, 40, capped=True),
        _rec("solved", 1.0, 10),
        _rec("infra_no_result", None, 2),
    ]
    m = outcome_metrics(recs, prefix="")
    assert m["masked_frac/budget_failure"] == 0.5
    assert m["masked_frac"] == 0.25
    assert (
        m["b_realized"] == 0.5
    )  # (0 + 1) / 2: the masked row and the reward-less one do not count
    assert m["turns_p90/budget_failure"] == 40
    assert "turns_mean/submitted_failure" not in m  # no such rollout: no key, no NaN


def test_record_from_sample_fields_uses_the_classifier():
    r = RolloutRecord.from_sample_fields(
        status="completed",
        reward=0.0,
        metadata={
            "exit_status": "LimitsExceeded",
            "agent_metrics": {"turns": 40},
            "ran_repo_tests": True,
        },
        remove_sample=True,
    )
    assert (r.outcome, r.capped, r.masked, r.turns, r.ran_tests, r.reason) == (
        Outcome.BUDGET_FAILURE,
        True,
        True,
        40,
        True,
        "turn_cap",
    )
    infra = RolloutRecord.from_sample_fields(
        status="completed", reward=0.0, metadata={"instance_id": "a"}
    )
    assert infra.outcome is Outcome.INFRA_NO_RESULT and not infra.capped


def test_turn_quantiles_match_numpy_percentile():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 101):
        values = sorted(rng.integers(1, 41, n).tolist())
        for q in (0.5, 0.9):
            assert quantile(values, q) == pytest.approx(np.percentile(values, 100 * q), abs=1e-12)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_reward_is_no_result_and_stays_out_of_b_realized(bad):
    records = [
        RolloutRecord.from_sample_fields(status="completed", reward=r) for r in (1.0, 0.0, bad)
    ]
    assert records[2].outcome is Outcome.INFRA_NO_RESULT and records[2].reward is None
    m = outcome_metrics(records)
    assert m["rollout/census/b_realized"] == 0.5
    census = Census()
    census.enter(1)
    census.settle(1, Bucket.TRAINED_FRESH, records)
    assert census.step_metrics()["rollout/census/b_realized"] == 0.5


def test_the_gate_decision_names_the_bucket():
    from rescue.gate import Decision

    cases = {
        (True, 1.0, False): Bucket.TRAINED_FRESH,
        (True, 1.0, True): Bucket.TRAINED_STALE,
        (True, 2.0, True): Bucket.TRAINED_PROTECTED,
        (False, 0.0, True): Bucket.DROPPED_STALE,
    }
    for (keep, weight, stale), bucket in cases.items():
        assert Bucket.after_gate(Decision(keep=keep, weight=weight, stale=stale)) is bucket


# ── the baseline paid to excluded rollouts ───────────────────────────────────


def _group(rewards, masked):
    out = ["solved" if r == 1 else "budget_failure" for r in rewards]
    return [_rec(o, reward=r, masked=m) for o, r, m in zip(out, rewards, masked, strict=True)]


@pytest.mark.parametrize("population, paid", [("all", 0.5), ("survivors", 1.0)])
def test_masked_rollouts_are_paid_their_groups_baseline_under_the_population(population, paid):
    census = Census(population=population)
    census.enter(1)
    census.settle(1, Bucket.TRAINED_FRESH, _group([1, 0, 0, 1], [False, True, True, False]))
    m = census.step_metrics()
    assert m[f"{P}b_paid/masked"] == pytest.approx(paid)
    assert m[f"{P}b_paid/masked_rollouts"] == 2


def test_b_paid_is_a_mean_over_masked_rollouts_of_every_trained_group():
    census = Census()
    census.enter(1)
    census.enter(2)
    census.enter(3)
    census.settle(1, Bucket.TRAINED_FRESH, _group([1, 0, 0, 1], [False, True, True, False]))
    census.settle(
        2, Bucket.TRAINED_PROTECTED, _group([1, 1, 1, 0], [False] * 3 + [True]), weight=2.0
    )
    census.settle(3, Bucket.TRAINED_FRESH, _group([1, 0], [False, False]))  # nothing masked
    m = census.step_metrics()
    assert m[f"{P}b_paid/masked"] == pytest.approx((0.5 + 0.5 + 0.75) / 3)  # unweighted
    assert m[f"{P}b_paid/masked_rollouts"] == 3


def test_dropped_rollouts_are_paid_their_groups_mean_reward():
    census = Census(population="survivors")  # the population is for masked rollouts only
    census.enter(1)
    census.enter(2)
    census.settle(1, Bucket.DROPPED_STALE, _group([1, 0, 1, 1], [False] * 4))
    census.settle(2, Bucket.DROPPED_STALE, _group([0, 0], [False, False]))
    m = census.step_metrics()
    assert m[f"{P}b_paid/dropped"] == pytest.approx((4 * 0.75 + 2 * 0.0) / 6)
    assert m[f"{P}b_paid/dropped_rollouts"] == 6
    assert m[f"{P}b_paid/masked_rollouts"] == 0 and f"{P}b_paid/masked" not in m


def test_rollouts_without_a_reward_neither_vote_nor_count_and_the_window_resets():
    census = Census()
    census.enter(1)
    recs = [*_group([1, 0], [False, True]), _rec("infra_no_result", reward=None, masked=True)]
    census.settle(1, Bucket.TRAINED_FRESH, recs)
    m = census.step_metrics()
    assert m[f"{P}b_paid/masked"] == pytest.approx(0.5) and m[f"{P}b_paid/masked_rollouts"] == 1
    m = census.step_metrics()
    assert m[f"{P}b_paid/masked_rollouts"] == 0 and f"{P}b_paid/masked" not in m


def test_an_unknown_population_is_an_error_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="population='some'; allowed: all, survivors, loo"):
        Census(population="some")


# ── groups without a result: one rule for the buffer, the drain and the simulator ───────


def _no_result_record(outcome, reason=""):
    return RolloutRecord(outcome=Outcome(outcome), reward=None, reason=reason)


def test_a_group_with_any_no_result_rollout_has_no_result_with_that_reason():
    from rescue.census import no_result

    scored = [
        _no_result_record("solved", "resolved"),
        _no_result_record("budget_failure", "turn_cap"),
    ]
    assert no_result(scored) is None
    assert (
        no_result([*scored, _no_result_record("infra_no_result", "trial_timeout")])
        == "trial_timeout"
    )
    assert no_result(
        [
            _no_result_record("infra_no_result", "container_lost"),
            _no_result_record("infra_no_result", "x"),
        ]
    ) == ("container_lost")
    assert no_result([_no_result_record("infra_no_result")]) == "no_result"


def test_aborted_groups_are_counted_by_reason():
    c = Census()
    for gid, reason in enumerate(["trial_timeout", "trial_timeout", None, "container_lost"]):
        c.enter(gid)
        c.settle(
            gid, Bucket.ABORTED, [_no_result_record("infra_no_result", reason or "")], reason=reason
        )
    m = c.step_metrics()
    assert m[f"{PREFIX}groups/aborted"] == 4
    assert m[f"{PREFIX}aborted/reason/trial_timeout"] == 2
    assert m[f"{PREFIX}aborted/reason/container_lost"] == 1
    assert m[f"{PREFIX}aborted/reason/aborted"] == 1  # no reason given: Miles' ABORTED
    assert not any(k.startswith(f"{PREFIX}aborted/") for k in c.step_metrics())  # new window
    c.enter(9)
    with pytest.raises(ValueError, match="a reason is for aborted or lost groups"):
        c.settle(9, Bucket.DROPPED_STALE, reason="trial_timeout")


def test_groups_dropped_for_no_result_are_a_count_and_a_fraction_of_the_step_by_reason():
    c = Census()
    # a step of 8 groups: 5 trained, 2 without a result (trial timeout), 1 (grader), of
    # which one entered in this step and is still buffered: the fraction is of entries
    for gid in range(8):
        c.enter(gid)
    for gid in range(4):
        c.settle(gid, Bucket.TRAINED_FRESH, [RolloutRecord(Outcome.SOLVED, 1.0)])
    for gid, reason in ((4, "trial_timeout"), (5, "trial_timeout"), (6, "grader_error")):
        c.settle(gid, Bucket.ABORTED, [_no_result_record("infra_no_result", reason)], reason=reason)
    m = c.step_metrics()
    assert m[f"{PREFIX}no_result/groups"] == 3
    assert m[f"{PREFIX}no_result/fraction"] == 3 / 8
    assert m[f"{PREFIX}no_result/fraction/trial_timeout"] == 2 / 8
    assert m[f"{PREFIX}no_result/fraction/grader_error"] == 1 / 8
    # a step where nothing entered: the count is 0, a fraction would be 0/0
    c.settle(7, Bucket.TRAINED_FRESH, [RolloutRecord(Outcome.SOLVED, 1.0)])
    m = c.step_metrics()
    assert m[f"{PREFIX}no_result/groups"] == 0
    assert not any(k.startswith(f"{PREFIX}no_result/fraction") for k in m)


def test_lost_groups_and_requeues_are_counted_and_conserved():
    c = Census()
    for gid in range(5):
        c.enter(gid)
    c.settle(0, Bucket.LOST, reason="ClientResponseError")
    c.settle(1, Bucket.LOST)
    c.settle(2, Bucket.ABORTED, requeued=True)
    c.settle(3, Bucket.ABORTED)
    m = c.step_metrics()
    assert m[f"{PREFIX}groups/lost"] == 2 and m[f"{PREFIX}groups/aborted"] == 2
    assert m[f"{PREFIX}lost/reason/ClientResponseError"] == 1
    assert m[f"{PREFIX}lost/reason/exception"] == 1  # no reason given
    assert m[f"{PREFIX}groups/requeued"] == 1 and m[f"{PREFIX}groups/buffered"] == 1
    # a requeued group is generated again, not dropped for a missing result
    assert m[f"{PREFIX}no_result/groups"] == 1 and m[f"{PREFIX}no_result/fraction"] == 1 / 5
    t = c.totals()
    assert t["entered"] == 5 == t["lost"] + t["aborted"] + t["buffered"]
    m = c.step_metrics()  # a new window: the count is logged, 0
    assert m[f"{PREFIX}groups/requeued"] == 0 and m[f"{PREFIX}groups/lost"] == 0
    assert not any(k.startswith(f"{PREFIX}lost/") for k in m)
    c.enter(9)
    with pytest.raises(ValueError, match="only an aborted group is requeued, not lost"):
        c.settle(9, Bucket.LOST, requeued=True)


def test_the_buffer_the_drain_and_the_simulator_apply_the_same_rule():
    import rescue.census
    import rescue.miles.buffer
    import rescue.sim.engine
    import rescue.slime.drain

    rule = rescue.census.no_result
    assert rescue.miles.buffer.no_result is rule
    assert rescue.slime.drain.no_result is rule
    assert rescue.sim.engine.no_result is rule


def test_outcome_metrics_count_each_reason_of_each_outcome():
    records = [
        RolloutRecord.from_sample_fields(status="completed", reward=r, metadata={"exit_status": e})
        for r, e in ((1.0, "won"), (0.0, "lost"), (0.0, "max_turns"), (0.0, "max_turns"))
    ]
    records.append(RolloutRecord.from_sample_fields(status="aborted"))
    m = outcome_metrics(records, prefix="")
    assert {k: v for k, v in m.items() if k.startswith("reason/")} == {
        "reason/solved/won": 1.0,
        "reason/submitted_failure/lost": 1.0,
        "reason/budget_failure/turn_cap": 2.0,
        "reason/infra_no_result/aborted": 1.0,
    }


def test_a_restart_settles_the_carried_and_the_unseen_groups_once_and_conserves():
    """A resumed life: 3 entries the earlier life left open and 2 groups it drew that never
    entered settle ``lost_at_restart`` in the first window, once; conservation holds with
    the carried entries, and a second window counts none."""
    c = Census()
    c.restart(carried=3, unseen=2)
    c.enter(10)
    c.settle(10, Bucket.TRAINED_FRESH, [_rec("solved", 1.0)])
    c.enter(11)
    m = c.step_metrics(queue_size=1)
    assert m[f"{P}groups/lost_at_restart"] == 5
    assert m[f"{P}groups/entered"] == 2 + 2  # the unseen enter now; the carried entered before
    assert m[f"{P}groups/trained_fresh"] == 1 and m[f"{P}groups/buffered"] == 1
    assert m[f"{P}no_result/groups"] == 0  # not a no-result of the policy: a restart's
    t = c.totals()
    assert t["entered"] + c.carried == sum(t[b.value] for b in Bucket) + t["buffered"]
    assert c.step_metrics(queue_size=1)[f"{P}groups/lost_at_restart"] == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_restart_takes_counts_only(bad):
    with pytest.raises(ValueError, match="allowed: an integer >= 0"):
        Census().restart(carried=bad, unseen=0)
