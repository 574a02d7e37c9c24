"""``rescue.rehearsal.verdict.checks``: each check's verdict and its whole sentence on a sound run
(the sentences a rehearsal's report prints, worked out by hand from the fixture), and the
cases where a wrong rule would agree with the right one on the other tests' fixtures: a
keep probability other than 1/2 (where kept and dropped coins are not symmetric, and 1/a is
not 2), more than one check failing, a default a.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_rehearsal_checks import census_row, run, samples, sync_run, train_row

from rescue.rehearsal.verdict import checks
from rescue.rehearsal.verdict.checks import GROUPS


def test_a_sound_run_s_sentences():
    f = run()
    assert checks.trained_steps(f) == (True, "2 steps trained and followed by a weight update, "
                                             "3 rollouts' optimizer steps logged (need 2)")  # fmt: skip
    assert checks.weights(f) == (True, "versions 1..3: the engine received the trainer's "
                                       "weights (SHA-256 equal), and each update with a learning "
                                       "signal changed them")  # fmt: skip
    assert checks.finite(f) == (True, "3 optimizer steps: train/* finite, train/rescue/* logged "
                                      "and train/rescue/sc/*, a head at every trained token")  # fmt: skip
    assert checks.census(f) == (True, "2 census flushes, conservation exact in each")
    assert checks.unused(f) == (True, "1 dropped-stale or aborted groups, each received by the "
                                      "unused handler in its step (0 more after the last census, "
                                      "in flight at the end)")  # fmt: skip
    assert checks.stale(f) == (True, "never-drop: 0 dropped, 1 trained stale, 0 protected")
    assert checks.protect(f) == (True, "no sample carries a weight")
    assert checks.advantages(f) == (True, "3 rollouts: the loss trained the train data's "
                                          "advantage sum")  # fmt: skip
    assert checks.matched(f) == (True, "does not apply to this arm")
    assert checks.drgrpo(f) == (True, "does not apply to this arm")
    assert checks.capped(f) == (True, "does not apply to this arm")


def test_without_score_centering_the_heads_are_not_asked_for():
    f = run(offpolicy="tis")
    for row in f.history:
        for k in checks.SC_KEYS:
            del row[f"train/rescue/sc/{k}"]
    assert checks.finite(f) == (True, "3 optimizer steps: train/* finite, train/rescue/* logged")


def test_what_a_run_lacks_is_said():
    assert checks.weights(run(trainer_weights=[])) == (
        False, "no weight update was recorded on the trainer's side")  # fmt: skip
    assert checks.finite(run(history=[])) == (False, "no optimizer step in the wandb history")
    assert checks.census(run(census=[])) == (False, "the buffer handed Miles no census")
    sync = sync_run()
    sync.unused = [{"flush": 0}]
    assert checks.unused(sync) == (False, "an unused handler received groups")
    sync.census = [census_row(0, 1, 0, trained_fresh=1)]
    assert checks.census(sync) == (False, "a buffer census was logged")
    assert checks.stale(sync_run(train_data=[])) == (False, "no trained sample")
    assert checks.drgrpo(run("drgrpo-mask")) == (False, "Dr. GRPO's reducer never ran")
    reducer = [{"ones": 1.0, "tokens": 1024.0, "divisor": 1024.0}]
    assert checks.drgrpo(run("mask", reducer=reducer)) == (False, "Dr. GRPO's reducer ran")
    assert checks.kept_as_a(0, 0, 0.5) == (False, "no stale group met the coin")


def test_a_step_without_trained_tokens_needs_only_its_two_keys():
    f = run()
    row = f.history[1]
    for k in list(row):
        if k.startswith("train/rescue/") and k not in ("train/rescue/update_norm",
                                                       "train/rescue/adv_tokens"):  # fmt: skip
            del row[k]
    row["train/rescue/adv_tokens"] = 0
    assert checks.finite(f)[0], checks.finite(f)  # the other keys are not asked of that step
    del row["train/rescue/update_norm"]
    assert checks.finite(f) == (False, "optimizer steps without train/rescue/update_norm")


@pytest.mark.parametrize(
    ("dropped", "protected", "ok"),
    [(15, 5, True), (5, 15, False), (40, 0, False), (12, 8, True)],
)
def test_protect_s_coins_at_a_quarter_keep_a_quarter(dropped, protected, ok):
    """At a = 1/2 keeping 5 of 20 and dropping 5 of 20 look alike; at 1/4 they do not."""
    f = run("protect", a=0.25)
    f.census = [census_row(0, dropped + protected, 0, dropped_stale=dropped,
                           trained_protected=protected)]  # fmt: skip
    got, detail = checks.stale(f)
    assert got is ok, detail
    assert detail.startswith(f"protect: {dropped} dropped, 0 trained stale, {protected} "
                             f"protected; {protected} of {dropped + protected} stale groups "
                             "kept at a = 0.25 (binomial test p = ")  # fmt: skip


def test_protect_s_weight_is_1_over_a_at_a_quarter_and_a_half_by_default():
    f = run("protect", a=0.25)
    f.train_data = [samples([4.0] * 4 + [None] * 4)]
    assert checks.protect(f) == (True, "4 protected samples trained with weight 1/a = 4, each "
                                       "reward = weight x its group's advantage")  # fmt: skip
    f.train_data = [samples([2.0] * 4 + [None] * 4)]
    assert checks.protect(f) == (False, "4 protected samples with a weight other than 1/a")
    f.a = None  # the arm's default keep probability, 1/2
    assert checks.protect(f)[0]
    f.census = [census_row(0, 4, 0, dropped_stale=2, trained_protected=2)]
    assert checks.stale(f)[1].endswith(
        "2 of 4 stale groups kept at a = 0.5 (binomial test p = 1)")  # fmt: skip


def test_a_protect_run_without_protected_samples_says_what_its_coins_did():
    f = run("protect", a=0.25)
    f.census = [census_row(0, 4, 0, dropped_stale=4)]
    assert checks.protect(f) == (True, "no protected sample to check the weight 1/a on: 0 of 4 "
                                       "stale groups kept at a = 0.25 (binomial test p = 0.58)")  # fmt: skip
    f.census = [census_row(0, 4, 0, dropped_stale=2, trained_protected=2)]  # kept, not seen
    ok, detail = checks.protect(f)
    assert not ok and detail.startswith("no protected sample was trained (2 of 4 stale groups")


def test_the_coin_threshold_is_one_in_a_thousand():
    assert checks.COIN_ALPHA == 1e-3
    # 0 of 10 at a = 1/2: p = 2 / 1024 ≈ 0.00195 (kept); 0 of 11: p ≈ 0.00098 (refused)
    assert checks.kept_as_a(0, 10, 0.5)[0] and not checks.kept_as_a(0, 11, 0.5)[0]
    assert checks.kept_as_a(0.4, 10.4, 0.5) == checks.kept_as_a(0, 10, 0.5)  # counts rounded


def test_capped_s_sentences():
    f = sync_run("zero")
    assert checks.capped(f) == (True, "zero: 6 budget-failure samples, every one trained with "
                                      "raw reward 0 ({'truncated': 6})")  # fmt: skip
    m = sync_run("mask")
    for step in m.train_data:
        for s in step:
            if s["outcome"] == "budget_failure":
                s["loss_mask_sum"] = 0
    assert checks.capped(m) == (True, "mask: 6 budget-failure samples, every one loss-masked "
                                      "({'truncated': 6})")  # fmt: skip
    m.train_data[0][2]["loss_mask_sum"] = 3
    assert checks.capped(m) == (False, "1 of 6 budget-failure samples not loss-masked")


def test_a_synchronous_run_s_sentences():
    assert checks.stale(sync_run()) == (True, "on-policy: 3 rollouts, each generated by one "
                                              "weight version (1..3), the one its step trained "
                                              "from")  # fmt: skip
    assert checks.census(sync_run()) == (True, checks.NO_BUFFER)
    assert checks.unused(sync_run()) == (True, checks.NO_BUFFER)


def test_the_matched_control_s_sentence_and_its_tolerance():
    data = [samples([None] * 8) for _ in range(4)]
    rows = [train_row(i, d, **{"train/rescue/matched_copy": i % 2,
                               "train/rescue/update_norm": 0.0 if i % 2 == 0 else 0.3,
                               "train/rescue/update_norm_ref": 0.3})
            for i, d in enumerate(data)]  # fmt: skip
    f = run("matched", train_data=data, history=rows)
    assert checks.matched(f) == (True, "2 rollouts: copy A measured, copy B applied at its "
                                       "update norm (the realized norm equals update_norm_ref "
                                       "within 0.001)")  # fmt: skip
    rows[3]["train/rescue/update_norm"] = 0.3 * (1 + 0.9e-3)  # within REL of copy A's
    assert checks.matched(f)[0]
    rows[3]["train/rescue/update_norm"] = 0.3 * (1 + 1.1e-3)
    assert not checks.matched(f)[0]
    rows[1]["train/rescue/matched_copy"] = 0
    assert checks.matched(f)[1].startswith("optimizer steps' copies [0, 0, 0, 1]: expected 0, 1")


def _silence(step: list[dict]) -> None:
    """Every advantage of a step's train data 0: no learning signal."""
    for s in step:
        s["reward"] = 0.0


def test_an_unchanged_update_of_the_matched_control_reads_both_copies_of_its_rollout():
    """Version 3 follows rollout 1, whose copies are train data 2 and 3: a signal in copy 2
    makes an unchanged version 3 a defect, though train data 1 and 3 have none."""
    f = run("matched", rollouts=4)
    f.trainer_weights = [{"version": "1", "digest": "d1"}, {"version": "2", "digest": "d2"},
                         {"version": "3", "digest": "d2"}]  # fmt: skip
    f.engine_weights = [dict(w) for w in f.trainer_weights]
    _silence(f.train_data[1])
    _silence(f.train_data[3])
    assert checks.weights(f) == (False, "versions ['3']: the weights equal the previous version's")
    _silence(f.train_data[2])
    assert checks.weights(f) == (True, "versions 1..3: the engine received the trainer's weights "
                                       "(SHA-256 equal), and each update with a learning signal "
                                       "changed them (versions ['3'] equal the previous: their "
                                       "step had no learning signal)")  # fmt: skip


def test_the_turn_channel_and_the_loss_mask_decide_whether_a_step_had_a_signal():
    f = run()
    f.trainer_weights[1]["digest"] = f.engine_weights[1]["digest"] = "d1"  # version 2 == 1
    unchanged = (False, "versions ['2']: the weights equal the previous version's")
    _silence(f.train_data[0])
    for s in f.train_data[0]:
        s["channel_sum"] = 0.25  # the scalar part is 0, the turn channel is not
    assert checks.weights(f) == unchanged
    for s in f.train_data[0]:
        del s["channel_sum"]  # a run without the channel: no key, no signal
    assert checks.weights(f)[0], checks.weights(f)
    f.train_data[0] = samples([None] * 8)  # rewards that differ, but no token trained
    for s in f.train_data[0]:
        s["loss_mask_sum"] = 0
    assert checks.weights(f)[0], checks.weights(f)
    f.train_data[0][3]["loss_mask_sum"] = 1
    assert checks.weights(f) == unchanged


def test_weight_versions_are_ordered_as_numbers():
    f = run(rollouts=10)
    assert checks.weights(f) == (True, "versions 1..10: the engine received the trainer's "
                                       "weights (SHA-256 equal), and each update with a learning "
                                       "signal changed them")  # fmt: skip


def test_finite_names_every_missing_key_and_every_infinite_one():
    f = run()  # score centering: rescue's keys are asked for besides the heads
    del f.history[0]["train/rescue/adv_var"]
    assert checks.finite(f) == (False, "optimizer steps without train/rescue/adv_var")
    f = run()
    del f.history[1]["train/rescue/adv_tokens"]  # a step silent on its tokens needs every key
    del f.history[1]["train/rescue/adv_var"]
    assert checks.finite(f) == (False, "optimizer steps without train/rescue/adv_tokens, "
                                       "train/rescue/adv_var")  # fmt: skip
    f = run()
    f.history[0]["train/grad_norm"] = float("nan")
    f.history[2]["train/loss"] = float("inf")
    assert checks.finite(f) == (False, "not finite: train/grad_norm, train/loss")


def _sparse_census() -> list[dict]:
    """A census that logs only the counts a flush has (a key absent is 0): 3 groups entered
    and settled, then 3 more (2 dropped stale, 1 buffered), then the buffered one dropped."""
    return [
        {"flush": 0, "groups": {GROUPS + "entered": 3.0, GROUPS + "trained_fresh": 2.0,
                                GROUPS + "aborted": 1.0}},
        {"flush": 1, "groups": {GROUPS + "entered": 3.0, GROUPS + "dropped_stale": 2.0,
                                GROUPS + "buffered": 1.0}},
        {"flush": 2, "groups": {GROUPS + "dropped_stale": 1.0}},
    ]  # fmt: skip


def test_a_census_key_a_flush_did_not_log_counts_zero():
    f = run("drop", census=_sparse_census())
    f.unused = [{"flush": 0}, {"flush": 1}, {"flush": 1}, {"flush": 2}]
    assert checks.census(f) == (True, "3 census flushes, conservation exact in each")
    assert checks.unused(f) == (True, "4 dropped-stale or aborted groups, each received by the "
                                      "unused handler in its step (0 more after the last census, "
                                      "in flight at the end)")  # fmt: skip
    assert checks.stale(f) == (True, "drop: 3 dropped, 0 trained stale, 0 protected")


def test_unused_names_what_the_handler_received_in_the_first_wrong_flush():
    f = run()  # the census counts 1 aborted group at flush 0, none at flush 1
    f.unused = [{"flush": 0}, {"flush": 1}, {"flush": 1}]
    assert checks.unused(f) == (False, "census flush 1: the unused handler received 2 groups, "
                                       "the census counted 0 dropped stale or aborted")  # fmt: skip
    f.unused = []
    assert checks.unused(f) == (False, "census flush 0: the unused handler received 0 groups, "
                                       "the census counted 1 dropped stale or aborted")  # fmt: skip


def test_advantages_of_the_matched_control_sum_both_copies_of_a_rollout():
    f = run("matched", rollouts=4, steps_per_rollout=2, steps_checked=2)
    assert checks.advantages(f) == (True, "2 rollouts: the loss trained the train data's "
                                          "advantage sum")  # fmt: skip


def test_advantages_skip_a_rollout_whose_step_was_not_logged_and_go_on():
    f = run()
    del f.history[0]
    assert checks.advantages(f) == (True, "2 rollouts: the loss trained the train data's "
                                          "advantage sum")  # fmt: skip
    f = run()
    del f.history[0]["train/rescue/adv_mean"]  # read as a zero sum: the groups' sum is 0
    assert checks.advantages(f)[0], checks.advantages(f)


def test_train_data_without_the_turn_channel_has_none():
    f = run()
    for step in f.train_data:
        for s in step:
            del s["channel_sum"]
    assert checks.advantages(f) == (True, "3 rollouts: the loss trained the train data's "
                                          "advantage sum")  # fmt: skip
    f.arm = "turn"
    assert checks.advantages(f) == (False, "the turn arm's per-token channel is zero on every "
                                           "trained token, in 6 groups whose members' rewards "
                                           "differ")  # fmt: skip


def test_the_turn_channel_of_any_rollout_counts():
    f = run("turn")
    f.train_data[0] = samples([None] * 8, channel=0.25)  # rollouts 1 and 2: channel 0
    f.history = [train_row(i, d) for i, d in enumerate(f.train_data)]
    assert checks.advantages(f) == (True, "3 rollouts: the loss trained the train data's "
                                          "advantage sum (the turn channel included)")  # fmt: skip


def _one_token(reward: float, adv_mean: float):
    sample = {"reward": reward, "loss_mask_sum": 1, "channel_sum": 0.0}
    row = {"train/step": 0, "train/rescue/adv_mean": adv_mean, "train/rescue/adv_tokens": 1}
    return run(rollouts=1, train_data=[[sample]], history=[row])


def test_advantages_tolerance_is_rel_of_the_sum_or_of_one():
    assert checks.advantages(_one_token(0.0, 0.001)) == (True, "1 rollouts: the loss trained "
                                                               "the train data's advantage sum")  # fmt: skip
    assert checks.advantages(_one_token(0.0, 0.0015)) == (False, "rollout 0: advantage sum "
                                                                 "trained 0.0015 over 1 tokens, "
                                                                 "train data 0 over 1 tokens")  # fmt: skip
    assert checks.advantages(_one_token(100.0, 100.09))[0]  # 0.09 within 1e-3 x 100
    assert not checks.advantages(_one_token(100.0, 100.11))[0]


def test_capped_s_sentences_of_the_matched_control_and_of_a_one_token_failure():
    f = sync_run("zero")
    for step in f.train_data:
        for s in step:
            if s["outcome"] == "budget_failure":
                s["loss_mask_sum"] = 1  # one trained token is trained
    assert checks.capped(f) == (True, "zero: 6 budget-failure samples, every one trained with "
                                      "raw reward 0 ({'truncated': 6})")  # fmt: skip
    m = sync_run("matched", versions=(1, 1, 2, 2))
    for k, step in enumerate(m.train_data):
        for s in step:
            if s["outcome"] == "budget_failure":
                s["loss_mask_sum"] = 5 if k % 2 == 0 else 0
    assert checks.capped(m) == (True, "matched: 4 budget-failure samples, every one copy A: "
                                      "trained at R = 0 ({'truncated': 4}); 4 budget-failure "
                                      "samples, every one copy B: loss-masked "
                                      "({'truncated': 4})")  # fmt: skip
    m.train_data[3][2]["loss_mask_sum"] = 5  # the second rollout's copy B
    assert checks.capped(m) == (False, "1 of 4 budget-failure samples not copy B: loss-masked")
    for step in f.train_data:
        for s in step:
            s["outcome"] = "solved"
    assert checks.capped(f) == (False, "no budget failure was trained: the cap never cut a "
                                       "rollout")  # fmt: skip


def test_protect_s_weight_and_reward_failures_are_counted_over_every_step():
    g = run("drop", train_data=[samples([2.0] * 4 + [None] * 4)])
    assert checks.protect(g) == (False, "4 weighted samples")
    f = run("protect", a=0.5, train_data=[samples([2.5] * 4 + [None] * 4)])
    assert checks.protect(f) == (False, "4 protected samples with a weight other than 1/a")
    bad, good = samples([2.0] * 4 + [None] * 4), samples([2.0] * 4 + [None] * 4)
    bad[5]["reward"] += 1.0
    wrong = (False, "1 samples whose trained reward is not weight x group advantage")
    f.train_data = [[], bad]  # a step without samples, then one with a wrong reward
    assert checks.protect(f) == wrong
    f.train_data = [bad, good]
    assert checks.protect(f) == wrong


def test_protect_s_reward_tolerance_is_1e_4_of_the_reward_or_of_one():
    f = run("protect", a=0.5)
    step = samples([2.0] * 4 + [None] * 4)
    for s in step[4:]:  # group 1 all lost: every advantage exactly 0
        s["raw_reward"], s["reward"] = 0.0, 0.0
    f.train_data = [step]
    step[4]["reward"] = 1e-4
    assert checks.protect(f)[0], checks.protect(f)
    step[4]["reward"] = 1.5e-4
    assert not checks.protect(f)[0]
    step[4]["reward"] = 0.0
    step[0]["reward"] += 1.5e-4  # about 3 (advantage 1.5 x weight 2): within 3e-4
    assert checks.protect(f)[0], checks.protect(f)


def test_trained_steps_counts_from_zero_and_needs_exactly_steps_checked():
    f = run(steps_checked=3)
    f.trainer_weights.append({"version": "4", "digest": "d4"})
    assert checks.trained_steps(f) == (True, "3 steps trained and followed by a weight update, "
                                             "3 rollouts' optimizer steps logged (need 3)")  # fmt: skip
    assert checks.trained_steps(run(trainer_weights=[])) == (
        False, "0 steps trained and followed by a weight update, 3 rollouts' optimizer steps "
               "logged (need 2)")  # fmt: skip


def test_a_synchronous_matched_run_is_on_policy_per_rollout_not_per_copy():
    f = sync_run("matched", versions=(1, 1, 2, 2, 3, 3))
    assert checks.stale(f) == (True, "on-policy: 3 rollouts, each generated by one weight "
                                     "version (1..3), the one its step trained from")  # fmt: skip


def test_a_p_value_at_the_coin_threshold_is_consistent(monkeypatch):
    import scipy.stats

    monkeypatch.setattr(scipy.stats, "binomtest", lambda k, n, p: SimpleNamespace(pvalue=1e-3))
    assert checks.kept_as_a(3, 10, 0.5) == (True, "3 of 10 stale groups kept at a = 0.5 "
                                                  "(binomial test p = 0.001)")  # fmt: skip


def _two_copies(norm_key: str, steps: int = 4) -> list[dict]:
    data = [samples([None] * 8) for _ in range(steps)]
    return [train_row(i, d, **{"train/rescue/matched_copy": i % 2,
                               "train/rescue/update_norm": 0.0 if i % 2 == 0 else 0.3,
                               norm_key: 0.3})
            for i, d in enumerate(data)]  # fmt: skip


def test_the_step_size_control_applies_the_mask_s_norm():
    rows = _two_copies("train/rescue/update_norm_mask")  # no update_norm_ref logged
    f = run("step-control", history=rows)
    assert checks.matched(f) == (True, "2 rollouts: the mask copy measured, the R = 0 copy "
                                       "applied at its update norm (the realized norm equals "
                                       "update_norm_mask within 0.001)")  # fmt: skip
    rows[2]["train/rescue/update_norm"] = 0.2
    assert checks.matched(f) == (False, "step 2: the mask copy's update was applied")


def test_matched_refuses_misordered_copies_and_no_step_and_forgives_a_lost_last_row():
    rows = _two_copies("train/rescue/update_norm_ref")
    f = run("matched", history=rows)
    rows[0]["train/rescue/matched_copy"] = 1  # copy B tags right, copy A's first is wrong
    assert checks.matched(f) == (False, "optimizer steps' copies [1, 1, 0, 1]: expected 0, 1 "
                                        "alternating")  # fmt: skip
    f.history = []
    assert checks.matched(f) == (False, "optimizer steps' copies []: expected 0, 1 alternating")
    f.history = _two_copies("train/rescue/update_norm_ref", steps=3)  # the last copy B lost
    assert checks.matched(f)[1].startswith("1 rollouts: copy A measured"), checks.matched(f)


def test_matched_s_tolerance_is_rel_of_the_reference_norm_inclusive():
    rows = _two_copies("train/rescue/update_norm_ref", steps=2)
    f = run("matched", history=rows)
    rows[1].update({"train/rescue/update_norm": 1001.0, "train/rescue/update_norm_ref": 1000.0})
    assert checks.matched(f)[0], checks.matched(f)  # 1 = 1e-3 x 1000 exactly


def test_drgrpo_s_tolerance_and_its_sentence_of_a_wrong_divisor():
    f = run("drgrpo-mask", reducer=[{"ones": 1001 / 1024, "tokens": 1000.0, "divisor": 1024.0}])
    assert checks.drgrpo(f) == (True, "1 micro-batches reduced by the constant divisor 1024")
    f.reducer = [{"ones": 0.0, "tokens": 300.0, "divisor": 1024.0}]
    assert checks.drgrpo(f) == (False, "reducer of all-ones 0 over 300 tokens: divisor inf, not "
                                       "1024")  # fmt: skip
    f.reducer = [{"ones": 0.5, "tokens": 300.0, "divisor": 1024.0}]
    assert checks.drgrpo(f) == (False, "reducer of all-ones 0.5 over 300 tokens: divisor 600, "
                                       "not 1024")  # fmt: skip


def test_judged_keys_of_a_swe_run_and_what_it_lacks():
    keys = {"rollouts": 8.0, "outcome/solved": 2.0, "outcome/submitted_failure": 4.0,
            "outcome/budget_failure": 2.0, "cap_hit_rate": 0.25, "turns_mean/solved": 5.0,
            "b_all": 0.25, "b_realized": 0.3, "groups/dropped_stale": 1.0}  # fmt: skip
    row = {"rollout/step": 0, **{f"rollout/census/{k}": v for k, v in keys.items()}}
    f = run(history=[*run().history, row])
    assert checks.judged_keys(f) == (True, "the wandb run holds what rescue report reads "
                                           "(success, cap_hit, submitted_failure, turns, b, "
                                           "b_realized, dropped, update_norm)")  # fmt: skip
    del row["rollout/census/b_realized"], row["rollout/census/groups/dropped_stale"]
    f = run(history=[*run().history, row])  # what a synchronous run's judge reads is there
    assert checks.judged_keys(f) == (False, "rescue report cannot read: b_realized (missing key "
                                            "rollout/census/b_realized (never-drop seed 0)); "
                                            "dropped (missing key rollout/census/groups/"
                                            "dropped_stale (never-drop seed 0))")  # fmt: skip


def test_a_nan_reward_in_the_train_data_fails_protect_and_advantages():
    f = run("protect", a=0.5, train_data=[samples([2.0] * 4 + [None] * 4)])
    f.train_data[0][5]["reward"] = float("nan")  # not weight x its group's advantage
    g = run()
    g.train_data[1][5]["reward"] = float("nan")  # the train data's sum is not the loss's
    assert not checks.protect(f)[0] and not checks.advantages(g)[0]
    h = run("protect", a=0.5, train_data=[samples([2.0] * 4 + [None] * 4)])
    weighted = [s for s in h.train_data[0] if s.get("rescue_weight")]
    weighted[0]["rescue_weight"] = float("nan")
    assert checks.protect(h) == (False, "1 protected samples with a weight other than 1/a")
