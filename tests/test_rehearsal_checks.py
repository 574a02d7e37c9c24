"""Each check of a trained rehearsal passes on a sound run and fails on the defect it exists
to catch (synthetic ``RunFiles``: no Miles, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from rescue.advantages import group_advantages
from rescue.rehearsal.verdict import checks
from rescue.rehearsal.verdict.checks import BUCKETS, GROUPS, RunFiles


def census_row(flush: int, entered: float, buffered: float = 0.0, **buckets: float) -> dict:
    groups = {f"{GROUPS}entered": entered, f"{GROUPS}buffered": buffered}
    groups.update({GROUPS + b: float(buckets.get(b, 0)) for b in BUCKETS})
    return {"flush": flush, "groups": groups}


def samples(weights: list[float | None], channel: float = 0.0) -> list[dict]:
    """Two groups of four; rewards after the hook are each group's advantage x weight."""
    raw = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    w = np.array([x or 1.0 for x in weights])
    adv = group_advantages(raw, ids) * w
    return [
        {
            "group_index": int(g),
            "raw_reward": float(r),
            "reward": float(v),
            "rescue_weight": x,
            "outcome": "solved" if r else "submitted_failure",
            "loss_mask_sum": 5,
            "channel_sum": channel,
        }
        for g, r, v, x in zip(ids, raw, adv, weights, strict=True)
    ]


def train_row(step: int, data: list[dict], **extra: float) -> dict:
    total = sum(s["reward"] * s["loss_mask_sum"] + s["channel_sum"] for s in data)
    tokens = sum(s["loss_mask_sum"] for s in data)
    row = {
        "train/step": step,
        "train/loss": 0.5,
        "train/rescue/update_norm": 0.1,
        "train/rescue/adv_mean": total / tokens,
        "train/rescue/adv_var": 1.0,
        "train/rescue/adv_tokens": tokens,
    }
    row.update(
        {f"train/rescue/sc/{k}": float(tokens if k == "tokens" else 0.5) for k in checks.SC_KEYS}
    )
    row.update(extra)
    return row


def run(arm: str = "never-drop", rollouts: int = 3, **over) -> RunFiles:
    data = [samples([None] * 8) for _ in range(rollouts)]
    f = RunFiles(
        arm=arm,
        a=None,
        offpolicy="tis-sc",
        steps_checked=rollouts - 1,
        max_response_len=1024,
        history=[train_row(i, d) for i, d in enumerate(data)],
        census=[
            census_row(0, 3, 0, trained_fresh=2, aborted=1),
            census_row(1, 2, 1, trained_stale=1),
        ],
        unused=[{"flush": 0, "samples": []}],
        train_data=data,
        trainer_weights=[{"version": str(v), "digest": f"d{v}"} for v in range(1, rollouts + 1)],
        engine_weights=[{"version": str(v), "digest": f"d{v}"} for v in range(1, rollouts + 1)],
    )
    for k, v in over.items():
        setattr(f, k, v)
    return f


def test_a_sound_run_passes_every_check():
    f = run()
    for rule in (checks.trained_steps, checks.weights, checks.finite, checks.census,
                 checks.unused, checks.stale, checks.protect, checks.advantages,
                 checks.matched, checks.drgrpo):  # fmt: skip
        ok, detail = rule(f)
        assert ok, (rule.__name__, detail)


def test_steps_needs_as_many_trained_steps_as_checked():
    ok, detail = checks.trained_steps(run(steps_checked=3))
    assert not ok and "2 steps trained" in detail


def test_weights_fail_when_the_engine_got_other_weights_or_a_step_changed_nothing():
    f = run()
    f.engine_weights[1]["digest"] = "other"
    ok, detail = checks.weights(f)
    assert not ok and "versions ['2']" in detail
    f = run()
    f.trainer_weights[2]["digest"] = f.engine_weights[2]["digest"] = "d2"
    ok, detail = checks.weights(f)
    assert not ok and "equal the previous version" in detail
    assert not checks.weights(run(trainer_weights=[]))[0]


def test_finite_fails_on_a_nan_a_missing_key_and_a_missing_head():
    f = run()
    f.history[1]["train/grad_norm"] = float("nan")
    ok, detail = checks.finite(f)
    assert not ok and "train/grad_norm" in detail
    f = run()
    del f.history[0]["train/rescue/sc/correction_l1"]
    ok, detail = checks.finite(f)
    assert not ok and "train/rescue/sc/correction_l1" in detail
    f = run()
    f.history[2]["train/rescue/sc/tokens"] -= 1
    ok, detail = checks.finite(f)
    assert not ok and "fewer score-centering heads" in detail
    f = run(offpolicy="tis")
    for row in f.history:
        for k in checks.SC_KEYS:
            del row[f"train/rescue/sc/{k}"]
    assert checks.finite(f)[0]


def test_a_step_that_trained_no_token_logs_adv_tokens_0_alone_and_passes():
    """The mask arm's step whose every sample was capped trains no token: Miles' optimizer
    step runs, rescue logs adv_tokens = 0 (no mean, no variance, no head); the advantages
    check compares 0 with 0. A step with tokens still needs every key."""
    f = run("mask", offpolicy="tis")
    for s in f.train_data[1]:
        s["loss_mask_sum"] = 0
    row = f.history[1]
    for k in ("adv_mean", "adv_var"):
        del row[f"train/rescue/{k}"]
    for k in checks.SC_KEYS:
        del row[f"train/rescue/sc/{k}"]
    row["train/rescue/adv_tokens"] = 0
    assert checks.finite(f)[0], checks.finite(f)
    assert checks.advantages(f)[0], checks.advantages(f)
    del f.history[0]["train/rescue/adv_var"]
    assert not checks.finite(f)[0]
    del row["train/rescue/adv_tokens"]  # a step that says nothing of its tokens
    assert "train/rescue/adv_tokens" in checks.finite(f)[1]


def test_an_empty_step_reduces_to_zero_tokens_alone():
    import torch

    from rescue.miles.train_step import AdvantageMoments

    moments = AdvantageMoments()
    assert moments.reduce() == {}  # nothing recorded: rescue's loss did not run
    advantages = [torch.ones(3)]
    moments.record(advantages, advantages, [torch.zeros(3)])  # every token loss-masked
    assert moments.reduce() == {"adv_tokens": 0.0}


def test_census_fails_where_a_group_is_in_no_bucket():
    f = run()
    f.census[1] = census_row(1, 3, 1, trained_stale=1)
    ok, detail = checks.census(f)
    assert not ok and "flushes [1]" in detail


def test_unused_must_match_the_census_step_by_step():
    f = run()
    f.unused = [{"flush": 1, "samples": []}]  # the aborted group of step 0, seen in step 1
    ok, detail = checks.unused(f)
    assert not ok and "census flush 0" in detail
    f = run()
    f.unused.append({"flush": 2, "samples": []})  # after the last census: in flight
    ok, detail = checks.unused(f)
    assert ok and "1 more after the last census" in detail


@pytest.mark.parametrize(
    ("arm", "buckets", "ok"),
    [
        ("drop", {"dropped_stale": 1}, True),
        ("drop", {"trained_stale": 1}, False),
        ("drop", {}, False),
        ("protect", {"dropped_stale": 1, "trained_protected": 1}, True),
        ("protect", {"dropped_stale": 2}, True),  # 0.5^2: the coins may keep none
        ("protect", {"dropped_stale": 20}, False),  # 0.5^20: they keep some
        ("protect", {"trained_protected": 20}, False),  # ... and drop some
        ("protect", {"dropped_stale": 10, "trained_protected": 10, "trained_stale": 1}, False),
        ("protect", {}, False),  # no stale group met a coin
        ("never-drop", {"trained_stale": 1}, True),
        ("never-drop", {}, False),
        ("turn", {"trained_stale": 2}, True),
        ("pace", {}, True),
        ("pace", {"trained_stale": 1}, False),
    ],
)
def test_stale_groups_are_handled_as_the_arm_says(arm, buckets, ok):
    f = run(arm)
    f.census = [census_row(0, 1 + sum(buckets.values()), 1, **buckets)]
    assert checks.stale(f)[0] is ok


def test_a_handful_of_coins_may_keep_no_stale_group_but_many_may_not():
    """The binomial test behind the protect checks: a known case, and its threshold."""
    assert checks.kept_as_a(0, 3, 0.25) == (True, "0 of 3 stale groups kept at a = 0.25 "
                                               "(binomial test p = 1)")  # fmt: skip
    assert not checks.kept_as_a(0, 20, 0.5)[0]  # p = 2 x 0.5^20
    assert checks.kept_as_a(5, 20, 0.25)[0]
    assert not checks.kept_as_a(0, 0, 0.5)[0]


def test_protect_needs_1_over_a_in_the_trained_reward():
    f = run("protect", a=0.5)
    f.train_data = [samples([2.0] * 4 + [None] * 4)]
    assert checks.protect(f)[0]
    f.train_data = [samples([None] * 8)]
    f.census = [census_row(0, 20, 0, dropped_stale=20)]  # twenty coins at 1/2, none kept
    assert not checks.protect(f)[0] and "no protected sample" in checks.protect(f)[1]
    f.census = [census_row(0, 3, 0, dropped_stale=3)]  # three coins at 1/2: (1/2)^3 = 1/8
    ok, detail = checks.protect(f)
    assert ok and detail.startswith("no protected sample to check the weight 1/a on: 0 of 3")
    unweighted = samples([None] * 8)
    for s in unweighted[:4]:
        s["rescue_weight"] = 2.0  # on the sample, never in the reward
    f.train_data = [unweighted]
    assert "not weight x group advantage" in checks.protect(f)[1]
    f.train_data = [samples([4.0] * 4 + [None] * 4)]
    assert "other than 1/a" in checks.protect(f)[1]
    g = run("drop")
    g.train_data = [samples([2.0] * 4 + [None] * 4)]
    assert not checks.protect(g)[0]


def test_advantages_catch_a_loss_that_ignores_the_turn_channel():
    f = run("turn")
    f.train_data = [samples([None] * 8, channel=0.25) for _ in range(3)]
    f.history = [train_row(i, d) for i, d in enumerate(f.train_data)]
    assert checks.advantages(f)[0]
    # the loss trained the scalar part only: its recorded sum lacks the channel
    f.history = [
        train_row(i, [{**s, "channel_sum": 0.0} for s in d]) for i, d in enumerate(f.train_data)
    ]
    ok, detail = checks.advantages(f)
    assert not ok and "rollout 0" in detail
    g = run("turn")  # a turn run whose channel never arrived, in groups of mixed rewards
    ok, detail = checks.advantages(g)
    assert not ok and "channel is zero" in detail and "in 6 groups" in detail
    # no group of mixed rewards (every episode of a text-game step capped, or all won): the
    # channel is zero by construction, and the check says so
    for step in g.train_data:
        for sample in step:
            sample["raw_reward"], sample["reward"] = 0.0, 0.0
    g.history = [train_row(i, d) for i, d in enumerate(g.train_data)]
    ok, detail = checks.advantages(g)
    assert ok and detail.endswith("no group's members had different rewards"), detail


def test_matched_needs_copy_a_measured_and_copy_b_at_its_norm():
    data = [samples([None] * 8) for _ in range(4)]
    rows = []
    for i, d in enumerate(data):
        copy = i % 2
        rows.append(
            train_row(
                i,
                d,
                **{
                    "train/rescue/matched_copy": copy,
                    "train/rescue/update_norm": 0.0 if copy == 0 else 0.3,
                    "train/rescue/update_norm_ref": 0.3,
                },
            )
        )
    f = run("matched", train_data=data, history=rows)
    assert checks.matched(f)[0], checks.matched(f)
    rows[2]["train/rescue/update_norm"] = 0.2
    assert "copy A's update was applied" in checks.matched(f)[1]
    rows[2]["train/rescue/update_norm"] = 0.0
    rows[3]["train/rescue/update_norm"] = 0.31
    assert "update norm 0.31" in checks.matched(f)[1]
    assert checks.matched(run())[1] == "does not apply to this arm"


def test_drgrpo_needs_the_constant_divisor():
    f = run("drgrpo-mask", reducer=[{"ones": 300 / 1024, "tokens": 300.0, "divisor": 1024.0}])
    assert checks.drgrpo(f)[0]
    f.reducer = [{"ones": 1.0, "tokens": 300.0, "divisor": 1024.0}]  # divided by its tokens
    ok, detail = checks.drgrpo(f)
    assert not ok and "divisor 300" in detail
    assert not checks.drgrpo(run("drgrpo-mask"))[0]  # never ran
    assert not checks.drgrpo(run("mask", reducer=f.reducer))[0]  # ran where it should not


def test_judged_keys_name_what_rescue_report_cannot_read():
    ok, detail = checks.judged_keys(run())
    assert not ok and "rescue report cannot read" in detail and "success" in detail


def test_advantages_compare_the_rollouts_whose_steps_were_all_logged():
    f = run(steps_checked=2)
    del f.history[2]  # Miles lost the last step's row at exit
    ok, detail = checks.advantages(f)
    assert ok and detail.startswith("2 rollouts")
    f.steps_checked = 3
    ok, detail = checks.advantages(f)
    assert not ok and "2 rollouts with every optimizer step logged" in detail
    g = run(steps_per_rollout=2)  # rows 0 and 1 are both rollout 0's: twice its tokens
    ok, detail = checks.advantages(g)
    assert not ok and detail.startswith("rollout 0:") and "over 80 tokens" in detail


def sync_run(arm: str = "zero", versions: tuple[int, ...] = (1, 2, 3), **over) -> RunFiles:
    """A synchronous (single-turn) run: no buffer census, each rollout generated by one
    weight version; two budget failures per rollout."""
    f = run(arm, rollouts=len(versions), census=[], unused=[], launcher="rlvr")
    for v, step in zip(versions, f.train_data, strict=True):
        for i, s in enumerate(step):
            s["weight_versions"] = [str(v)]
            if i in (2, 3):
                s.update(outcome="budget_failure", outcome_reason="truncated", raw_reward=0.0)
    for k, v in over.items():
        setattr(f, k, v)
    return f


def test_a_synchronous_run_has_no_buffer_and_says_so():
    f = sync_run()
    for rule in (checks.census, checks.unused):
        ok, detail = rule(f)
        assert ok and detail.startswith("does not apply"), detail
    f.census = [census_row(0, 1, 0, trained_fresh=1)]
    assert not checks.census(f)[0]  # a buffer census where none can be is a defect


def test_a_synchronous_step_is_on_policy_one_version_after_the_last():
    ok, detail = checks.stale(sync_run())
    assert ok and detail.startswith("on-policy: 3 rollouts") and "(1..3)" in detail
    ok, detail = checks.stale(sync_run(versions=(1, 1, 2)))
    assert not ok and "do not follow each other" in detail
    f = sync_run()
    f.train_data[1][0]["weight_versions"] = ["1"]  # one sample from an older version
    ok, detail = checks.stale(f)
    assert not ok and detail.startswith("rollout 1: samples generated by weight versions")


@pytest.mark.parametrize(
    ("arm", "mask", "raw", "ok"),
    [
        ("zero", 5, 0.0, True),
        ("turn", 5, 0.0, True),
        ("zero", 0, 0.0, False),  # a zero arm that masked its budget failures
        ("zero", 5, 1.0, False),  # a budget failure scored with its reward
        ("mask", 0, 0.0, True),
        ("survivor", 0, 0.0, True),
        ("mask", 5, 0.0, False),  # a mask arm that trained its budget failures
    ],
)
def test_capped_budget_failures_are_handled_as_the_arm_says(arm, mask, raw, ok):
    f = sync_run(arm)
    for step in f.train_data:
        for s in step:
            if s["outcome"] == "budget_failure":
                s.update(loss_mask_sum=mask, raw_reward=raw)
    got, detail = checks.capped(f)
    assert got is ok, detail


def test_capped_needs_a_budget_failure_and_skips_the_stale_arms():
    f = sync_run()
    for step in f.train_data:
        for s in step:
            s["outcome"] = "solved"
    ok, detail = checks.capped(f)
    assert not ok and "no budget failure" in detail
    ok, detail = checks.capped(run("protect"))
    assert ok and detail == "does not apply to this arm"


def test_judged_keys_of_a_synchronous_run_are_its_sample_census():
    keys = {"rollouts": 8.0, "outcome/solved": 2.0, "outcome/submitted_failure": 4.0,
            "outcome/budget_failure": 2.0, "cap_hit_rate": 0.25, "b_all": 0.25,
            "b_realized": 0.3, "masked_frac": 0.0}  # fmt: skip
    row = {"rollout/step": 0, **{f"rollout/census/samples/{k}": v for k, v in keys.items()}}
    f = sync_run(history=[*sync_run().history, row])
    ok, detail = checks.judged_keys(f)
    assert ok, detail
    f = sync_run()
    ok, detail = checks.judged_keys(f)
    assert not ok and "rollout/census" in detail


def test_capped_under_the_matched_control_trains_copy_a_and_masks_copy_b():
    f = sync_run("matched", versions=(1, 1, 2, 2))  # two copies a rollout
    for k, step in enumerate(f.train_data):
        for s in step:
            if s["outcome"] == "budget_failure":
                s["loss_mask_sum"] = 5 if k % 2 == 0 else 0
    ok, detail = checks.capped(f)
    assert ok and "copy A: trained at R = 0" in detail and "copy B: loss-masked" in detail
    f.train_data[1][2]["loss_mask_sum"] = 5  # copy B trained a budget failure
    ok, detail = checks.capped(f)
    assert not ok and "not copy B: loss-masked" in detail


def test_an_unchanged_update_is_a_defect_unless_its_step_had_no_learning_signal():
    f = run(rollouts=3)
    f.trainer_weights[1]["digest"] = f.engine_weights[1]["digest"] = "d1"  # version 2 == 1
    ok, detail = checks.weights(f)
    assert not ok and "versions ['2']: the weights equal the previous version's" in detail
    for s in f.train_data[0]:  # rollout 0, trained into version 2: every advantage 0
        s["reward"] = 0.0
    ok, detail = checks.weights(f)
    assert ok and "versions ['2'] equal the previous: their step had no learning signal" in detail
