"""``rescue.rehearsal.verdict.checks``: each check's verdict and its whole sentence on a sound run
(the sentences a rehearsal's report prints, worked out by hand from the fixture), and the
cases where a wrong rule would agree with the right one on the other tests' fixtures: a
keep probability other than 1/2 (where kept and dropped coins are not symmetric, and 1/a is
not 2), more than one check failing, a default a.
"""

from __future__ import annotations

import pytest
from test_rehearsal_checks import census_row, run, samples, sync_run, train_row

from rescue.rehearsal.verdict import checks


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
