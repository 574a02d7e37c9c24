"""Group baselines, the turn-reached baseline and per-token advantages (rescue.advantages)."""

from __future__ import annotations

import ast
import math
import os
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rescue.advantages import (
    group_advantages,
    group_baseline,
    per_token_advantages,
    std_scale,
    turn_reached_baseline,
)
from rescue.turns import TurnSpans, turn_spans

# ----------------------------------------------------------------- references, written as loops


def reference_group(rewards, group_ids, *, voters=None, loo=False, std=True, eps=1e-6):
    """GRPO normalization, one group at a time, written from the specification."""
    R = [float(r) for r in rewards]
    voters = [True] * len(R) if voters is None else list(voters)
    out = [0.0] * len(R)
    for g in dict.fromkeys(group_ids):
        members = [i for i, x in enumerate(group_ids) if x == g]
        pop = [R[i] for i in members if voters[i]]
        n = len(pop)
        mean = sum(pop) / n if n else 0.0
        sigma = math.sqrt(sum((r - mean) ** 2 for r in pop) / (n - 1)) if n > 1 else 0.0
        for i in members:
            if loo:
                rest = [R[j] for j in members if j != i]
                b = sum(rest) / len(rest) if rest else 0.0
            else:
                b = mean
            a = R[i] - b
            if std and n > 1 and sigma > 0:
                a /= sigma + eps
            out[i] = a if n else 0.0
    return np.array(out)


def reference_turn_reached(rewards, lengths, kappa=2.0):
    """b[i, ℓ-1] with explicit loops over i, ℓ, j."""
    G, L_max = len(rewards), max(lengths, default=0)
    b = np.zeros((G, L_max))
    for i in range(G):
        rest = [rewards[j] for j in range(G) if j != i]
        b_bar = sum(rest) / len(rest) if rest else 0.0
        for ell in range(1, L_max + 1):
            reached = [rewards[j] for j in range(G) if j != i and lengths[j] >= ell]
            n = len(reached)
            if n == 0 or n + kappa == 0:
                b[i, ell - 1] = b_bar
                continue
            w = n / (n + kappa)
            b[i, ell - 1] = w * (sum(reached) / n) + (1 - w) * b_bar
    return b


RNG = np.random.default_rng(7)

# ----------------------------------------------------------------- group_advantages


def test_all_members_matches_grpo_on_ragged_interleaved_groups():
    rewards = RNG.normal(size=23)
    gids = RNG.integers(0, 5, size=23)  # ragged, interleaved
    got = group_advantages(rewards, gids)
    assert np.allclose(got, reference_group(rewards, list(gids)), rtol=1e-12, atol=1e-12)


def test_string_group_ids_and_input_order_are_kept():
    got = group_advantages([1.0, 0.0, 0.0, 1.0], ["b", "a", "b", "a"], std_normalize=False)
    assert got.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_std_normalize_off_is_mean_subtraction():
    r = np.array([1.0, 0.0, 0.0, 0.0])
    assert np.allclose(group_advantages(r, [0] * 4, std_normalize=False), r - 0.25)
    on = group_advantages(r, [0] * 4)
    assert np.allclose(on, (r - 0.25) / (np.std(r, ddof=1) + 1e-6))  # unbiased std


def test_eps_is_added_to_sigma():
    r, g = [1.0, 0.0], [0, 0]
    sigma = np.std(r, ddof=1)
    assert np.allclose(group_advantages(r, g, eps=1.0), (np.array(r) - 0.5) / (sigma + 1.0))


@pytest.mark.parametrize("population", ["all", "survivors"])
def test_group_of_one_gets_zero_advantage(population):
    got = group_advantages([3.0], [0], population=population, kept=[True])
    assert got.tolist() == [0.0]


def test_loo_group_of_one_has_baseline_zero():
    assert group_advantages([3.0], [0], population="loo").tolist() == [3.0]


@pytest.mark.parametrize("population", ["all", "survivors", "loo"])
@pytest.mark.parametrize("std", [True, False])
def test_all_rewards_equal_gives_zero(population, std):
    got = group_advantages(
        [0.7] * 4, [1] * 4, population=population, kept=[True, False, True, True], std_normalize=std
    )
    assert np.all(got == 0.0)


def test_survivors_baseline_uses_kept_members_and_applies_to_all():
    r = np.array([1.0, 0.0, 1.0, 0.0])
    kept = np.array([True, True, True, False])  # the last is loss-masked
    got = group_advantages(r, [0] * 4, population="survivors", kept=kept, std_normalize=False)
    assert np.allclose(got, r - 2 / 3)
    assert not np.allclose(got, group_advantages(r, [0] * 4, kept=kept, std_normalize=False))
    got_std = group_advantages(r, [0] * 4, population="survivors", kept=kept)
    assert np.allclose(got_std, reference_group(r, [0] * 4, voters=kept))


def test_all_members_population_ignores_kept():
    r, g = [1.0, 0.0, 0.0], [0, 0, 0]
    assert np.array_equal(group_advantages(r, g, kept=[True, False, False]), group_advantages(r, g))


def test_survivors_group_without_survivor_gets_zero_and_others_untouched():
    r = [1.0, 0.0, 5.0, 1.0, 0.0]
    g = [0, 0, 1, 1, 1]
    kept = [False, False, True, True, False]
    got = group_advantages(r, g, population="survivors", kept=kept, std_normalize=False)
    assert got[:2].tolist() == [0.0, 0.0]
    assert np.allclose(got[2:], np.array([5.0, 1.0, 0.0]) - 3.0)


def test_survivors_needs_kept():
    with pytest.raises(ValueError, match="kept"):
        group_advantages([1.0, 0.0], [0, 0], population="survivors")


def test_loo_baseline_is_mean_of_the_others():
    r = np.array([1.0, 0.0, 0.0, 1.0, 3.0])
    g = [0, 0, 0, 1, 1]
    got = group_advantages(r, g, population="loo", std_normalize=False)
    assert np.allclose(got, [1.0, -0.5, -0.5, -2.0, 2.0])
    with_std = group_advantages(r, g, population="loo")
    assert np.allclose(with_std, reference_group(r, g, loo=True))


def test_weights_multiply_after_normalization():
    r = RNG.normal(size=12)
    g = np.repeat([0, 1, 2], 4)
    w = np.repeat([1.0, 4.0, 0.5], 4)  # a whole-group weight, as the protect arm sets 1/a
    base = group_advantages(r, g)
    assert np.allclose(group_advantages(r, g, weights=w), w * base)
    # folding the weight into the rewards instead is undone by the std normalization
    assert np.allclose(group_advantages(r * w, g), base, atol=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_reward_names_the_sample(bad):
    r = [0.0, 1.0, 0.0, bad, 1.0]
    with pytest.raises(ValueError, match=r"rewards\[3\]"):
        group_advantages(r, [0, 0, 1, 1, 1])


def test_bad_population_lists_the_allowed_values():
    with pytest.raises(ValueError, match="all, survivors, loo"):
        group_advantages([1.0], [0], population="kept")  # type: ignore[arg-type]


def test_shape_mismatches_are_errors():
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages([1.0, 2.0], [0])
    with pytest.raises(ValueError, match="weights"):
        group_advantages([1.0, 2.0], [0, 0], weights=[1.0])
    with pytest.raises(ValueError, match="kept"):
        group_advantages([1.0, 2.0], [0, 0], population="survivors", kept=[True])


def test_empty_input_gives_empty_output():
    assert group_advantages([], []).shape == (0,)


def test_matches_miles_normalize_rewards_by_rollout():
    """Parity with Miles' own function, loaded from its source file (needs torch)."""
    src = os.environ.get("MILES_SRC")
    if not src:
        pytest.skip("parity with Miles: set MILES_SRC=/path/to/miles to run")
    torch = pytest.importorskip("torch")
    from typing import Any

    path = os.path.join(src, "miles/ray/rollout/train_data_conversion.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    wanted = {"_reward_group_segments", "_normalize_rewards_by_rollout"}
    module = ast.Module([n for n in tree.body if getattr(n, "name", None) in wanted], [])
    ns: dict = {"torch": torch, "Any": Any, "Sample": object}
    exec(compile(module, path, "exec"), ns)

    r = RNG.integers(0, 3, size=20).astype(float)
    gids = RNG.integers(0, 4, size=20)
    samples = [
        types.SimpleNamespace(group_index=int(g), rollout_id=None, index=i)
        for i, g in enumerate(gids)
    ]
    for std in (True, False):
        args = types.SimpleNamespace(advantage_estimator="grpo", grpo_std_normalization=std)
        theirs = np.array(ns["_normalize_rewards_by_rollout"](args, samples, list(r), None))
        ours = group_advantages(r, gids, std_normalize=std)
        assert np.allclose(ours, theirs, atol=1e-6)  # Miles computes in float32


# ----------------------------------------------------------------- turn-reached baseline


def test_turn_reached_baseline_by_hand():
    # G=3: R = (1, 0, 1), turns reached = (3, 1, 2), κ = 2.
    b = turn_reached_baseline([1.0, 0.0, 1.0], [3, 1, 2])
    # rollout 0, turn 1: others (0, 1) both reached; mean 0.5, n=2, w=1/2, LOO mean 0.5 -> 0.5
    # rollout 0, turn 2: only rollout 2 (R=1): n=1, w=1/3 -> 1/3*1 + 2/3*0.5 = 2/3
    # rollout 0, turn 3: nobody else -> LOO mean 0.5
    assert np.allclose(b[0], [0.5, 2 / 3, 0.5])
    # rollout 1: LOO mean 1; every other member reached turn 1 with R=1 -> 1 everywhere
    assert np.allclose(b[1], [1.0, 1.0, 1.0])
    assert b.shape == (3, 3)
    assert np.allclose(b, reference_turn_reached([1.0, 0.0, 1.0], [3, 1, 2]))


@pytest.mark.parametrize("kappa", [0.0, 0.5, 2.0, 10.0])
def test_turn_reached_matches_loops_on_ragged_groups(kappa):
    for G in (1, 2, 5, 8):
        r = RNG.normal(size=G)
        lengths = RNG.integers(0, 7, size=G)
        got = turn_reached_baseline(r, lengths, kappa=kappa)
        assert np.allclose(got, reference_turn_reached(list(r), list(lengths), kappa), atol=1e-12)


def test_nobody_else_reached_the_turn_gives_loo_group_mean():
    b = turn_reached_baseline([1.0, 0.0, 0.5], [9, 2, 2])
    assert np.allclose(b[0, 2:], 0.25)


def test_group_of_one_turn_baseline_is_zero():
    assert np.all(turn_reached_baseline([3.0], [4]) == 0.0)


def test_kappa_extremes():
    r, lengths = [1.0, 0.0, 0.0, 1.0], [1, 3, 3, 2]
    no_shrink = turn_reached_baseline(r, lengths, kappa=0.0)
    assert np.allclose(no_shrink[3], [1 / 3, 0.0, 0.0])  # pure mean of others who reached ℓ
    plain_loo = turn_reached_baseline(r, lengths, kappa=math.inf)
    loo = (np.sum(r) - np.array(r)) / 3
    assert np.allclose(plain_loo, loo[:, None] * np.ones(3))


@pytest.mark.parametrize("kappa", [-1.0, float("nan")])
def test_bad_kappa_is_an_error(kappa):
    with pytest.raises(ValueError, match="kappa"):
        turn_reached_baseline([1.0, 0.0], [1, 2], kappa=kappa)


def test_turn_baseline_non_finite_reward_names_the_sample():
    with pytest.raises(ValueError, match=r"rewards\[\(1, 0\)\]"):
        turn_reached_baseline([[1.0, 0.0], [float("nan"), 0.0]], [[1, 1], [1, 1]])


def test_bad_lengths_are_errors():
    with pytest.raises(ValueError, match="lengths"):
        turn_reached_baseline([1.0, 0.0], [1, -1])
    with pytest.raises(ValueError, match="lengths"):
        turn_reached_baseline([1.0, 0.0], [1.5, 2])
    with pytest.raises(ValueError, match="lengths"):
        turn_reached_baseline([1.0, 0.0], [1])


def test_batch_equals_groups_one_by_one_with_padding():
    r = RNG.normal(size=(3, 5))
    lengths = RNG.integers(1, 6, size=(3, 5))
    present = np.ones((3, 5), dtype=bool)
    present[1, 3:] = False  # group 1 has 3 members
    r[1, 3:] = np.nan  # padding is never read
    got = turn_reached_baseline(r, lengths, present=present)
    for g in range(3):
        m = present[g]
        one = turn_reached_baseline(r[g, m], lengths[g, m])
        assert np.allclose(got[g, m, : one.shape[1]], one)
        assert np.all(got[g, ~m] == 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-10, 10), st.integers(0, 6)), min_size=1, max_size=8),
    st.integers(0, 7),
    st.floats(-1e6, 1e6),
    st.floats(0, 20),
)
def test_property_rollout_baseline_never_depends_on_its_own_reward(members, i, new_r, kappa):
    """(i) b_{i,ℓ} is a function of the other members only: changing R_i changes nothing."""
    r = np.array([m[0] for m in members])
    lengths = np.array([m[1] for m in members])
    i = i % len(r)
    before = turn_reached_baseline(r, lengths, kappa=kappa)
    r2 = r.copy()
    r2[i] = new_r
    after = turn_reached_baseline(r2, lengths, kappa=kappa)
    assert np.array_equal(before[i], after[i])


# ----------------------------------------------------------------- per-token advantages


def test_per_token_is_reward_minus_baseline_of_the_tokens_turn():
    r, lengths = np.array([1.0, 0.0, 1.0]), np.array([3, 1, 2])
    turns = np.array([[0, 1, 1, 0, 2, 0, 3], [0, 1, 1, 0, 0, 0, 0], [0, 1, 0, 2, 2, 0, 0]])
    b = turn_reached_baseline(r, lengths)
    got = per_token_advantages(r, lengths, turns, dtype=np.float64)
    for i in range(3):
        for t, ell in enumerate(turns[i]):
            want = 0.0 if ell == 0 else r[i] - b[i, ell - 1]
            assert got[i, t] == pytest.approx(want, abs=1e-12)
    assert got.dtype == np.float64
    assert per_token_advantages(r, lengths, turns).dtype == np.float32  # default


def test_per_token_list_form_equals_dense_form():
    r = RNG.normal(size=(2, 3))
    lengths = np.array([[2, 1, 3], [1, 1, 2]])
    dense = np.zeros((2, 3, 6), dtype=np.int64)
    seqs = []
    for k in range(6):
        t = RNG.integers(0, lengths.flat[k] + 1, size=6)
        dense.reshape(6, 6)[k] = t
        seqs.append(t[: 3 + k % 3])  # ragged
    got_dense = per_token_advantages(r, lengths, dense)
    got_list = per_token_advantages(r, lengths, seqs)
    for k in range(6):
        assert np.array_equal(got_list[k], got_dense.reshape(6, 6)[k, : len(seqs[k])])


@pytest.mark.parametrize("bad_turn", [3, -1])
def test_per_token_turn_outside_the_rollout_is_an_error(bad_turn):
    turns = np.array([[0, 1, 2], [0, 1, bad_turn]])
    with pytest.raises(ValueError, match=f"rollout 1 holds turn {bad_turn}"):
        per_token_advantages([1.0, 0.0], [2, 2], turns)


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_a_negative_turn_in_a_small_integer_type_is_an_error_at_any_length(dtype):
    """-1 as uint8/uint16 is 255/65535: with longer rollouts it must not pass as a turn."""
    length = int(np.iinfo(dtype).max) * 2 + 10  # the unsigned -1 lies inside 0..length
    turns = np.array([[0, 1, 2], [0, 1, -1]], dtype=dtype)
    with pytest.raises(ValueError, match="rollout 1 holds turn -1"):
        per_token_advantages([1.0, 0.0], [length, length], turns)
    with pytest.raises(ValueError, match="rollout 1 holds turn -1"):
        per_token_advantages([1.0, 0.0], [length, length], list(turns))


def test_per_token_turns_must_be_integers_of_the_right_shape():
    with pytest.raises(ValueError, match="integers"):
        per_token_advantages([1.0, 0.0], [1, 1], np.zeros((2, 3)))
    with pytest.raises(ValueError, match="token_turns"):
        per_token_advantages([1.0, 0.0], [1, 1], np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="rollouts"):
        per_token_advantages([1.0, 0.0], [1, 1], [np.array([0, 1])])
    with pytest.raises(ValueError, match="weights"):
        per_token_advantages([1.0, 0.0], [1, 1], np.ones((2, 1), np.int64), weights=[1.0])


def test_per_token_std_normalize_and_weights():
    r, lengths = np.array([1.0, 0.0, 0.0, 1.0]), np.array([2, 2, 1, 1])
    turns = np.array([[1, 2], [1, 2], [1, 0], [1, 0]])
    plain = per_token_advantages(r, lengths, turns, dtype=np.float64)
    sigma = np.std(r, ddof=1)
    normed = per_token_advantages(r, lengths, turns, std_normalize=True, dtype=np.float64)
    assert np.allclose(normed, plain / (sigma + 1e-6))
    w = np.array([1.0, 2.0, 10.0, 0.5])
    weighted = per_token_advantages(
        r, lengths, turns, std_normalize=True, weights=w, dtype=np.float64
    )
    assert np.allclose(weighted, normed * w[:, None])
    # a group of one or all-equal rewards is not divided (σ = 0), exactly as group_advantages
    same = per_token_advantages([0.5, 0.5], [1, 1], np.array([[1], [1]]), std_normalize=True)
    assert np.all(same == 0.0)


def test_per_token_batch_with_absent_members_gives_them_zero():
    r = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    lengths = np.array([[2, 1, 1], [1, 1, 9]])
    present = np.array([[True, True, True], [True, True, False]])
    turns = np.array([[[1, 2], [1, 0], [0, 1]], [[1, 1], [0, 1], [0, 0]]])
    got = per_token_advantages(r, lengths, turns, present=present)
    assert np.all(got[1, 2] == 0.0)
    one = per_token_advantages(r[1, :2], lengths[1, :2], turns[1, :2])
    assert np.array_equal(got[1, :2], one)


# ----------------------------------------------------------------- the span form (rescue.turns)


def reference_token_turns(mask):
    """Each token's turn index from a 0/1 loss mask, with a loop: runs of 1s numbered 1, 2, ..."""
    turns, ell, prev = [], 0, 0
    for x in mask:
        ell += int(x == 1 and prev == 0)
        turns.append(ell if x == 1 else 0)
        prev = x
    return np.array(turns, dtype=np.int64)


def test_turn_spans_are_the_runs_of_the_loss_mask():
    spans = turn_spans([0, 1, 1, 0, 0, 1, 0, 1])
    assert spans.starts.tolist() == [1, 5, 7]
    assert spans.stops.tolist() == [3, 6, 8]
    assert spans.n_tokens == 8
    leading = turn_spans(np.array([True, True, False]))
    assert (leading.starts.tolist(), leading.stops.tolist()) == ([0], [2])
    for none in ([0, 0, 0], []):
        s = turn_spans(none)
        assert s.starts.size == s.stops.size == 0
        assert s.n_tokens == len(none)


def test_turn_spans_of_a_batch_are_the_rollouts_in_row_major_order():
    masks = RNG.integers(0, 2, size=(3, 4, 9))
    masks[1, 2] = 0  # a rollout without a turn
    got = turn_spans(masks)
    assert len(got) == 12
    for k, m in enumerate(masks.reshape(12, 9)):
        one = turn_spans(m)
        assert got[k].starts.tolist() == one.starts.tolist()
        assert got[k].stops.tolist() == one.stops.tolist()
        assert got[k].n_tokens == 9
    assert got[6].starts.size == 0


def test_turn_spans_rejects_a_mask_that_is_not_0_1():
    with pytest.raises(ValueError, match=r"rollout 1 holds 2 at token 1; allowed: 0"):
        turn_spans([[0, 1, 1], [1, 2, 0]])
    with pytest.raises(ValueError, match="loss_mask"):
        turn_spans(1)


def test_turn_spans_fields_are_checked():
    with pytest.raises(ValueError, match="starts must be a 1-D integer"):
        TurnSpans([0.5], [1], 2)
    with pytest.raises(ValueError, match="one entry per turn"):
        TurnSpans([0, 2], [1], 4)
    with pytest.raises(ValueError, match="n_tokens"):
        TurnSpans([0], [1], -1)


@pytest.mark.parametrize("std_normalize", [False, True])
def test_span_form_equals_dense_form_on_a_batch(std_normalize):
    B, G, T = 3, 4, 23
    masks = RNG.integers(0, 2, size=(B, G, T))
    masks[0, 1] = 0  # zero turns
    masks[1, 0] = 1  # one turn over every token
    masks[2, 3, :4], masks[2, 3, -3:] = 0, 0  # leading and trailing observation tokens
    masks[2, 2, :2], masks[2, 2, -2:] = 1, 1  # a turn at each end
    dense = np.stack([reference_token_turns(m) for m in masks.reshape(-1, T)]).reshape(B, G, T)
    lengths = dense.max(axis=2) + RNG.integers(0, 3, size=(B, G))  # turns past the last span
    rewards = RNG.integers(0, 3, size=(B, G)).astype(float)
    weights = RNG.uniform(0.5, 4.0, size=(B, G))
    present = np.ones((B, G), dtype=bool)
    present[1, 3] = False  # padding: no turns, advantage 0
    dense[1, 3], masks[1, 3] = 0, 0
    kw = dict(std_normalize=std_normalize, weights=weights, present=present, kappa=1.5)
    want = per_token_advantages(rewards, lengths, dense, **kw)
    got = per_token_advantages(rewards, lengths, turn_spans(masks), **kw)
    assert len(got) == B * G
    assert all(g.shape == (T,) and g.dtype == np.float32 for g in got)
    assert np.array_equal(np.stack(got).reshape(B, G, T), want)  # exactly, bit for bit
    assert np.all(want[0, 1] == 0.0) and np.all(want[1, 3] == 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-5, 5),
            st.lists(st.booleans(), max_size=12),
            st.integers(0, 2),
            st.floats(0.1, 3),
        ),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_property_span_form_equals_list_form_on_ragged_rollouts(rollouts, std_normalize):
    rewards = np.array([r for r, _, _, _ in rollouts])
    masks = [np.array(m, dtype=np.int64) for _, m, _, _ in rollouts]
    turns = [reference_token_turns(m) for m in masks]
    lengths = np.array(
        [t.max(initial=0) + extra for t, (_, _, extra, _) in zip(turns, rollouts, strict=True)]
    )
    weights = np.array([w for _, _, _, w in rollouts])
    kw = dict(std_normalize=std_normalize, weights=weights, dtype=np.float64)
    want = per_token_advantages(rewards, lengths, turns, **kw)
    got = per_token_advantages(rewards, lengths, [turn_spans(m) for m in masks], **kw)
    for g, w, m in zip(got, want, masks, strict=True):
        assert g.shape == (len(m),)
        assert np.array_equal(g, w)


@pytest.mark.parametrize(
    ("starts", "stops", "n_tokens", "message"),
    [
        ([0, 3], [4, 6], 8, r"turn 2 = \[3, 6\) after turn 1 = \[0, 4\)"),  # overlap
        ([5, 0], [6, 2], 8, r"turn 2 = \[0, 2\) after turn 1"),  # unordered
        ([2], [1], 8, r"turn 1 = \[2, 1\)"),  # stops before it starts
        ([0, 6], [2, 9], 8, r"n_tokens=8; got turn 2 = \[6, 9\)"),  # past n_tokens
        ([-1], [2], 8, r"turn 1 = \[-1, 2\)"),
    ],
)
def test_invalid_spans_are_errors_naming_the_rollout(starts, stops, n_tokens, message):
    spans = [TurnSpans([0], [1], 4), TurnSpans(starts, stops, n_tokens)]
    with pytest.raises(ValueError, match=rf"turn spans of rollout 1 must satisfy .*{message}"):
        per_token_advantages([1.0, 0.0], [2, 2], spans)


def test_more_spans_than_the_rollout_length_is_an_error():
    spans = [TurnSpans([0], [1], 4), TurnSpans([0, 2, 4], [1, 3, 5], 6)]
    with pytest.raises(ValueError, match="rollout 1 hold 3 turns; its length is 2"):
        per_token_advantages([1.0, 0.0], [2, 2], spans)
    no_turns = [spans[0], TurnSpans([], [], 3)]
    absent = per_token_advantages([1.0, 0.0], [2, 2], no_turns, present=[True, False])
    assert absent[1].tolist() == [0.0, 0.0, 0.0]


def test_spans_and_turn_index_arrays_do_not_mix():
    with pytest.raises(ValueError, match=r"token_turns\[1\] is not TurnSpans"):
        per_token_advantages([1.0, 0.0], [1, 1], [TurnSpans([0], [1], 2), np.array([1, 0])])


def test_adjacent_and_empty_spans_equal_their_turn_indices():
    # turn 2 starts where turn 1 stops; turn 3 is empty; turn 4 runs to the end
    spans = [TurnSpans([1, 3, 5, 5], [3, 5, 5, 7], 7), TurnSpans([0], [0], 2)]
    dense = np.array([[0, 1, 1, 2, 2, 4, 4], [0, 0, 0, 0, 0, 0, 0]])
    r, lengths = [1.0, 0.0], [4, 1]
    want = per_token_advantages(r, lengths, dense, dtype=np.float64)
    got = per_token_advantages(r, lengths, spans, dtype=np.float64)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1, :2])


def test_std_scale_is_the_factor_group_advantages_divides_by():
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(6), [1, 2, 4, 4, 8, 3])
    rewards = rng.integers(0, 2, groups.size).astype(float)
    rewards[groups == 2] = 0.7  # all equal: sigma = 0, no division
    scale = std_scale(rewards, groups)
    centred = group_advantages(rewards, groups, std_normalize=False)
    np.testing.assert_allclose(centred * scale, group_advantages(rewards, groups), atol=1e-12)
    assert np.all(scale[groups == 0] == 1.0) and np.all(scale[groups == 2] == 1.0)


def test_per_token_std_is_the_rule_std_scale_applies_on_a_padded_batch():
    """One std rule: per-token normalization divides by std_scale's factor over the members."""
    rng = np.random.default_rng(11)
    r = rng.integers(0, 3, (4, 5)).astype(float)
    r[1] = 0.25  # all equal: sigma = 0, not divided
    present = np.ones((4, 5), dtype=bool)
    present[2, 1:] = False  # a group of one
    present[3, 3:] = False
    lengths = np.ones((4, 5), np.int64)
    turns = present[..., None].astype(np.int64)  # absent members reach no turn
    kw = dict(present=present, dtype=np.float64)
    plain = per_token_advantages(r, lengths, turns, **kw)[..., 0]
    normed = per_token_advantages(r, lengths, turns, std_normalize=True, **kw)[..., 0]
    scale = std_scale(r[present], np.nonzero(present)[0])
    np.testing.assert_allclose(normed[present], plain[present] * scale, rtol=1e-12, atol=0)
    assert np.all(scale[np.nonzero(present)[0] == 1] == 1.0)


@pytest.mark.parametrize("population", ["all", "survivors", "loo"])
def test_group_baseline_is_what_the_advantage_subtracts(population):
    rng = np.random.default_rng(5)
    g = np.repeat(np.arange(5), [1, 3, 4, 4, 2])
    r = rng.normal(size=g.size)
    kept = rng.random(g.size) < 0.6
    kept[g == 3] = False  # a group without survivor
    b = group_baseline(r, g, population=population, kept=kept)
    A = group_advantages(r, g, population=population, kept=kept, std_normalize=False)
    if population == "survivors":
        none = ~np.isin(g, g[kept])  # groups without survivor: 3, and any other
        assert none[g == 3].all() and np.all(A[none] == 0.0) and np.all(b[none] == 0.0)
        np.testing.assert_array_equal(A[~none], (r - b)[~none])
    else:
        np.testing.assert_array_equal(A, r - b)
    for x in range(5):
        members = r[g == x]
        if population == "all":
            want = np.full(members.size, members.mean())
        elif population == "loo":
            want = (members.sum() - members) / max(members.size - 1, 1)
            want = want if members.size > 1 else np.zeros(1)
        else:
            voters = members[kept[g == x]]
            want = np.full(members.size, voters.mean() if voters.size else 0.0)
        np.testing.assert_allclose(b[g == x], want, rtol=1e-12, atol=1e-15)
