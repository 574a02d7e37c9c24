"""``rescue.sim.subsidy`` against references that do not go through its own code.

- The coefficients ``E α − E β`` and ``−E β`` with std normalization on (the module's own
  finite-difference test holds them fixed, so it cannot see them): every one of the
  ``2^(G−1)`` outcomes of the other members enumerated, each advantage computed here from
  the normalizer's definition (``(R − mean) / (σ + eps)``, σ the ddof-1 std, 0 when σ = 0),
  weighted by its probability.
- The logged terms of a two-task grid against a hand-assembled sum over the tasks, each
  task's exact gradient taken alone.
- What is refused, and what a step without terms logs.
- The exact tables of tiny episodes (one to five turns; refused submits, blind edits that
  never progress, edits that regress) against every path of the episode walked here from
  the environment's rules (``rescue.sim.env``: phases, edits with chances q and r, test
  runs, submits, the cap), and their gradients against central finite differences of that
  enumeration; seventeen parameter sets in uneven chunks, each its own paths.
- The logged terms of stacked parameter sets, swept in uneven chunks, with unequal task
  weights, against the same terms assembled from the enumeration, its finite differences
  and the coefficients summed over Bin(G − 1, J) by hand (``task`` below 0 included, where
  the ratio divides by ``|task|``); single-precision logits give the terms of the same
  numbers in double.
- Deterministic policies (saturated logits), worked by hand: no gradient at all gives NaN
  terms; a policy whose objective has no gradient while P(cap) does gives ``task`` = 0, the
  hand-computed ``term`` and an infinite ratio; neither warns.
- The coefficients of single-precision J are those of the same numbers in double (the
  closed form of G = 2 included), and a group of 100 (binomial coefficients beyond a 64-bit
  integer) still gives finite float64 coefficients, the hand-summed ones.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from test_sim_subsidy import SLOTS, perturbed

from rescue.sim import policy as P
from rescue.sim import scenario as sc
from rescue.sim import subsidy
from rescue.sim.config import SimConfig
from rescue.sim.subsidy import KEYS, PREFIX, coefficients, outcome_tables, step_metrics, terms

BUDGET = sc.preset("budget-three-outcome").sim_config(infra_rate=0.0)
TWO = sc.preset("two-outcome").sim_config(infra_rate=0.0)


def _advantage_of_first(rewards: list[float], std_normalize: bool) -> float:
    r = np.array(rewards, dtype=float)
    a = r[0] - r.mean()
    if not std_normalize:
        return float(a)
    sd = r.std(ddof=1)
    return float(a / (sd + 1e-6)) if sd > 0 else 0.0


def _enumerated(j: float, g: int, std_normalize: bool) -> tuple[float, float]:
    e_alpha = e_beta = 0.0
    for others in itertools.product((0.0, 1.0), repeat=g - 1):
        p = j ** sum(others) * (1 - j) ** (g - 1 - sum(others))
        e_alpha += p * _advantage_of_first([1.0, *others], std_normalize)
        e_beta += p * _advantage_of_first([0.0, *others], std_normalize)
    return e_alpha - e_beta, -e_beta


@pytest.mark.parametrize("std_normalize", [True, False])
@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_the_coefficients_are_the_enumerated_expectations(std_normalize, group_size):
    cfg = BUDGET.replace(std_normalize=std_normalize, group_size=group_size)
    j = np.array([0.0, 0.13, 0.5, 0.77, 1.0])
    c_j, c_b = coefficients(j, cfg)
    want = np.array([_enumerated(x, group_size, std_normalize) for x in j])
    np.testing.assert_allclose(c_j, want[:, 0], atol=1e-12)
    np.testing.assert_allclose(c_b, want[:, 1], atol=1e-12)
    assert c_j.shape == c_b.shape == j.shape


def test_the_terms_are_the_weighted_sum_over_the_tasks_of_each_task_alone():
    cfg = BUDGET
    th = np.array(cfg.initial_logits, dtype=np.float64)
    th = th + 0.3 * np.random.default_rng(4).normal(size=th.shape)
    ks = [k for k, _ in cfg.difficulty]
    w = np.array([p for _, p in cfg.difficulty])
    per_task = []
    for k in ks:  # each task's values and gradients computed alone
        v, g = outcome_tables(th[None], cfg, np.array([k]))
        per_task.append((v[0, 0], g[0, 0].reshape(2, -1)))
    j = np.array([v[0] for v, _ in per_task])
    cap = np.array([v[1] for v, _ in per_task])
    c_j, c_b = (np.array([coefficients(np.array([x]), cfg)[i][0] for x in j]) for i in (0, 1))
    g_cap = sum(wk * g[1] for wk, (_, g) in zip(w, per_task, strict=True))
    g_task = sum(wk * cj * g[0] for wk, cj, (_, g) in zip(w, c_j, per_task, strict=True))
    g_sub = sum(wk * cb * g[1] for wk, cb, (_, g) in zip(w, c_b, per_task, strict=True))
    u = g_cap / np.linalg.norm(g_cap)
    got = {k: v[0] for k, v in terms(th[None], cfg).items()}
    assert got["p_cap"] == pytest.approx(float(w @ cap), rel=1e-12)
    assert got["j"] == pytest.approx(float(w @ j), rel=1e-12)
    assert got["grad_p_cap"] == pytest.approx(float(np.linalg.norm(g_cap)), rel=1e-12)
    assert got["task"] == pytest.approx(float(g_task @ u), rel=1e-9)
    assert got["term"] == pytest.approx(float(g_sub @ u), rel=1e-9)
    assert got["ratio"] == pytest.approx(float(g_sub @ u) / abs(float(g_task @ u)), rel=1e-9)
    assert set(got) == set(KEYS)


def test_parameter_sets_are_swept_in_chunks_that_give_the_same_tables(monkeypatch):
    cfg = TWO
    rng = np.random.default_rng(9)
    th = np.array(cfg.initial_logits)[None] + 0.5 * rng.normal(
        size=(5, *np.shape(cfg.initial_logits))
    )
    ks = np.array([k for k, _ in cfg.difficulty])
    whole = outcome_tables(th, cfg, ks)
    per = len(ks) * 2 * 6 * (cfg.max_turns + 1) * 2 * cfg.max_turns
    monkeypatch.setattr(subsidy, "CHUNK_FLOATS", 2 * per)  # two parameter sets a chunk
    chunked = outcome_tables(th, cfg, ks)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=0)
        assert a.shape[0] == 5


def test_the_cap_is_a_probability_and_the_outcomes_never_exceed_one():
    for cfg in (BUDGET, TWO):
        th = np.array(cfg.initial_logits)[None]
        ks = np.array([k for k, _ in cfg.difficulty])
        v, _ = outcome_tables(th, cfg, ks)
        assert np.all(v >= 0) and np.all(v.sum(-1) <= 1 + 1e-12)
        assert np.all(v[..., 1] > 0)  # the cap cuts some episodes at the start


def test_what_has_no_terms_says_why_and_logs_nothing():
    table = SimConfig(episodes="table")
    batch = SimConfig(baseline_scope="batch")
    assert subsidy.supported(table) == "the strategy table has no turn cap"
    assert subsidy.supported(batch) == "a batch-wide baseline mixes tasks; the terms are per group"
    assert subsidy.supported(BUDGET) is None
    th = np.array(BUDGET.initial_logits)
    assert step_metrics([th, th], table) == [{}, {}]
    assert step_metrics([], BUDGET) == []
    moved = th.copy()
    moved[1, 0] += 0.5  # a step that changed the policy
    rows = step_metrics([th, moved], BUDGET)
    assert [sorted(r) for r in rows] == [sorted(PREFIX + k for k in KEYS)] * 2
    for row, t in zip(rows, (th, moved), strict=True):
        want = terms(t[None], BUDGET)
        assert row == {PREFIX + k: pytest.approx(float(want[k][0])) for k in KEYS}
    assert rows[1][PREFIX + "term"] != rows[0][PREFIX + "term"]
    assert all(type(v) is float for r in rows for v in r.values())


def test_the_policy_of_stacked_logits_is_a_softmax_over_the_available_choices():
    rng = np.random.default_rng(1)
    th = rng.normal(size=(3, P.ROWS, P.CHOICES))
    pi = subsidy.probs_of(th)
    for i in range(3):
        np.testing.assert_allclose(pi[i], P.Policy(th[i]).probs(), atol=1e-15)
    assert np.all(pi[:, ~P.available()] == 0)
    np.testing.assert_allclose(pi.sum(-1), 1.0)


# ── references written from the rules, not from the module ─────────────────────────────

AVAILABLE = P.available()
EDITED = (P.EDITED1, P.EDITED2, P.EDITED3)
#: Central finite differences: the step, and their error on the enumerated values, which
#: are sums of up to ~10^3 path products (round-off ~ 10^3 · ε / h ~ 1e-8; O(h²) ~ 1e-10).
H, FD_TOL = 1e-5, 1e-8
#: Tiny episodes (every path enumerable): one turn; a 3-turn cap with refused submits; a
#: 4-turn cap where blind edits never progress; a 5-turn cap where every edit may regress.
TINY = {
    "one-turn": SimConfig(max_turns=1, difficulty=((1, 0.6), (2, 0.4))),
    "refused-submits": SimConfig(
        max_turns=3, submit_failure=False, blind_edit=(0.5, 0.2), informed_edit=(0.8, 0.1),
        difficulty=((1, 0.5), (2, 0.3), (4, 0.2)),
    ),
    "blind-edits-stall": SimConfig(
        max_turns=4, submit_failure=False, blind_edit=(0.0, 0.3), informed_edit=(0.9, 0.05),
        difficulty=((1, 0.7), (3, 0.3)),
    ),
    "five-turns": SimConfig(
        max_turns=5, blind_edit=(0.45, 0.25), informed_edit=(0.75, 0.15),
        difficulty=((1, 0.2), (2, 0.5), (4, 0.3)),
    ),
}  # fmt: skip


def _softmax(theta: np.ndarray) -> np.ndarray:
    """π of the policy's definition: each row's softmax over its available choices."""
    e = np.where(AVAILABLE, np.exp(theta - theta.max(axis=-1, keepdims=True)), 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def _played_out(theta: np.ndarray, cfg: SimConfig, k: int) -> np.ndarray:
    """``[N, (P(solved), P(cap))]`` of logits ``[N, ROWS, CHOICES]``: every path of an
    episode walked from the environment's rules (``rescue.sim.env``), its probability the
    product of its decisions' and its edits' chances."""
    pi = _softmax(np.asarray(theta, dtype=np.float64))
    solved, capped = np.zeros(pi.shape[0]), np.zeros(pi.shape[0])

    def turn(n: int, s: int, phase: int, progress: int, chance: np.ndarray) -> None:
        nonlocal solved, capped
        if n > cfg.max_turns:  # not submitted after the last turn: the cap
            capped = capped + chance
            return
        row = 1 + P.PHASES * s + phase
        for a in (P.EDIT, P.TEST, P.SUBMIT):
            if not AVAILABLE[row, a]:
                continue
            c = chance * pi[:, row, a]
            if a == P.EDIT:  # informed right after a failing test run, else blind
                q, r = cfg.informed_edit if phase == P.TESTS_FAIL else cfg.blind_edit
                after = min(phase + 1, P.EDITED3) if phase in EDITED else P.EDITED1
                for step, p in ((1, q), (-1, r), (0, 1 - q - r)):
                    if p > 0:
                        turn(n + 1, s, after, max(progress + step, 0), c * p)
            elif a == P.TEST:
                turn(n + 1, s, P.TESTS_PASS if progress >= k else P.TESTS_FAIL, progress, c)
            elif progress >= k:
                solved = solved + c
            elif not cfg.submit_failure:  # refused: the same state, the turn spent
                turn(n + 1, s, phase, progress, c)

    for s in (P.FAST, P.THOROUGH):
        turn(1, s, P.START, 0, pi[:, P.STRATEGY_ROW, s])
    return np.stack([solved, capped], axis=-1)


def _fd_gradient(theta: np.ndarray, cfg: SimConfig, k: int) -> np.ndarray:
    """``[2, ROWS, CHOICES]``: central differences of ``_played_out`` in each available logit."""
    v = _played_out(perturbed(theta, H), cfg, k)
    out = np.zeros((2, P.ROWS, P.CHOICES))
    for i, (r, c) in enumerate(SLOTS):
        out[:, r, c] = (v[2 * i] - v[2 * i + 1]) / (2 * H)
    return out


def _coefficients_by_hand(j: float, g: int, std_normalize: bool) -> tuple[float, float]:
    """``(E α − E β, −E β)``: S ~ Bin(G − 1, J) the others' successes, summed over S."""
    c_j = c_b = 0.0
    for s in range(g):
        p = math.comb(g - 1, s) * j**s * (1 - j) ** (g - 1 - s)
        alpha = _advantage_of_first([1.0] + [1.0] * s + [0.0] * (g - 1 - s), std_normalize)
        beta = _advantage_of_first([0.0] + [1.0] * s + [0.0] * (g - 1 - s), std_normalize)
        c_j += p * (alpha - beta)
        c_b += p * -beta
    return c_j, c_b


def _theta(seed: int, n: int = 1) -> np.ndarray:
    """``n`` sets of logits around the untrained policy's, every choice likely."""
    base = np.array(SimConfig().initial_logits)
    return base + 0.6 * np.random.default_rng(seed).normal(size=(n, *base.shape))


# ── the exact tables against every path of a tiny episode ───────────────────────────────


@pytest.mark.parametrize("name", list(TINY))
def test_the_tables_are_every_path_of_a_tiny_episode_and_its_finite_difference(name):
    cfg = TINY[name]
    th = _theta(seed=len(name), n=2)  # two parameter sets swept at once
    ks = np.array([k for k, _ in cfg.difficulty])
    value, grad = outcome_tables(th, cfg, ks)
    assert value.shape == (2, len(ks), 2) and grad.shape == (2, len(ks), 2, P.ROWS, P.CHOICES)
    for i, k in enumerate(ks):
        np.testing.assert_allclose(value[:, i], _played_out(th, cfg, k), rtol=0, atol=1e-12)
        for n in range(2):
            np.testing.assert_allclose(grad[n, i], _fd_gradient(th[n], cfg, k), rtol=0, atol=FD_TOL)
    assert np.abs(grad).max() > 1e-3  # gradients well above the differences' error


def test_many_parameter_sets_in_uneven_chunks_are_each_sets_paths(monkeypatch):
    cfg = TINY["refused-submits"]
    ks = np.array([k for k, _ in cfg.difficulty])
    per = len(ks) * 2 * P.PHASES * (cfg.max_turns + 1) * 2 * cfg.max_turns
    monkeypatch.setattr(subsidy, "CHUNK_FLOATS", 3 * per)  # three sets a chunk
    th = _theta(seed=17, n=17)  # more sets than rows, not a multiple of the chunk
    value, grad = outcome_tables(th, cfg, ks)
    assert value.shape[0] == grad.shape[0] == 17
    for i, k in enumerate(ks):
        np.testing.assert_allclose(value[:, i], _played_out(th, cfg, k), rtol=0, atol=1e-12)


# ── the logged terms against the paths, the finite differences and the hand coefficients ─


def _terms_by_hand(theta: np.ndarray, cfg: SimConfig) -> dict[str, float]:
    """The module docstring's terms of one parameter set, each piece from a reference."""
    ks = [k for k, _ in cfg.difficulty]
    w = np.array([p for _, p in cfg.difficulty])
    v = np.array([_played_out(theta[None], cfg, k)[0] for k in ks])  # [K, (J, P(cap))]
    g = np.array([_fd_gradient(theta, cfg, k).reshape(2, -1) for k in ks])  # [K, o, D]
    c = np.array([_coefficients_by_hand(j, cfg.group_size, cfg.std_normalize) for j in v[:, 0]])
    g_cap = (w[:, None] * g[:, 1]).sum(0)
    g_task = (w[:, None] * c[:, :1] * g[:, 0]).sum(0)
    g_sub = (w[:, None] * c[:, 1:] * g[:, 1]).sum(0)
    u = g_cap / np.linalg.norm(g_cap)
    term, task = float(g_sub @ u), float(g_task @ u)
    return {
        "term": term,
        "task": task,
        "ratio": term / abs(task),
        "p_cap": float(w @ v[:, 1]),
        "j": float(w @ v[:, 0]),
        "grad_p_cap": float(np.linalg.norm(g_cap)),
    }


@pytest.mark.parametrize(
    ("name", "std_normalize", "group_size"),
    [("five-turns", True, 4), ("refused-submits", False, 3)],
)
def test_the_terms_of_stacked_parameter_sets_in_chunks_are_the_hand_assembled_ones(
    monkeypatch, name, std_normalize, group_size
):
    cfg = TINY[name].replace(std_normalize=std_normalize, group_size=group_size)
    assert len({p for _, p in cfg.difficulty}) > 1  # the weights are not all equal
    ks = [k for k, _ in cfg.difficulty]
    per = len(ks) * 2 * P.PHASES * (cfg.max_turns + 1) * 2 * cfg.max_turns
    monkeypatch.setattr(subsidy, "CHUNK_FLOATS", 2 * per)  # chunks of two sets, then one
    th = _theta(seed=group_size, n=3)
    got = terms(th, cfg)
    assert set(got) == set(KEYS) and all(got[k].shape == (3,) for k in KEYS)
    for i in range(3):
        want = _terms_by_hand(th[i], cfg)
        for key in ("p_cap", "j"):  # sums of the exact path probabilities
            assert got[key][i] == pytest.approx(want[key], rel=1e-12)
        err = len(SLOTS) * FD_TOL  # a projection sums one difference per available logit
        for key in ("term", "task", "grad_p_cap"):
            assert got[key][i] == pytest.approx(want[key], abs=err)
        rel = err / abs(want["term"]) + err / abs(want["task"])
        assert got["ratio"][i] == pytest.approx(want["ratio"], rel=rel)
    assert np.any(got["task"] < 0)  # ratio divides by |task|, not task
    assert len(set(np.round(got["term"], 6))) == 3  # three different policies


def test_single_precision_logits_give_the_terms_of_the_same_numbers_in_double():
    cfg = TINY["five-turns"]
    th32 = _theta(seed=8, n=2).astype(np.float32)
    got = terms(th32, cfg)
    want = terms(th32.astype(np.float64), cfg)  # the same numbers, exactly
    for key in KEYS:
        np.testing.assert_array_equal(got[key], want[key])
    w = np.array([p for _, p in cfg.difficulty])
    cap = np.array([_played_out(th32.astype(np.float64), cfg, k)[:, 1] for k, _ in cfg.difficulty])
    np.testing.assert_allclose(got["p_cap"], w @ cap, rtol=1e-12)


# ── deterministic policies: saturated logits, exact zeros ───────────────────────────────

#: A logit that makes a choice certain: exp(−2·800) is 0 in double precision.
SURE = 800.0


def _sure(choice_by_row: dict[int, int]) -> np.ndarray:
    """Logits where each named row takes its choice with probability exactly 1."""
    th = np.zeros((P.ROWS, P.CHOICES))
    for row, c in choice_by_row.items():
        th[row] = -SURE
        th[row, c] = SURE
    return th


def test_a_policy_without_gradient_logs_no_direction_and_warns_nothing():
    """Every row certain, always edit: capped surely, every gradient exactly 0, so ∇P(cap)
    has no direction: term, task and ratio are NaN (0/0), quietly."""
    th = _sure({P.STRATEGY_ROW: P.FAST} | {row: P.EDIT for row in range(1, P.ROWS)})
    cfg = TINY["five-turns"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = terms(th[None], cfg)
    assert got["p_cap"][0] == 1.0 and got["j"][0] == 0.0 and got["grad_p_cap"][0] == 0.0
    for key in ("term", "task", "ratio"):
        assert np.isnan(got[key][0])


def test_where_the_objective_has_no_gradient_the_ratio_is_infinite_quietly():
    """Thorough surely; edit, run the tests; on a pass submit (solved), on a failure the
    last turn's row chooses edit (capped) or submit (failed) with π_e, π_s. By hand:
    J = q, P(cap) = (1 − q) π_e, ∇P(cap) = (1 − q) π_e π_s (e_edit − e_submit) on that row,
    ∇J = 0 exactly; without std normalization −E β = (G − 1)/G · J: term = −E β ‖∇P(cap)‖,
    task = 0, ratio = +inf."""
    thorough = 1 + P.PHASES * P.THOROUGH
    th = _sure(
        {
            P.STRATEGY_ROW: P.THOROUGH,
            thorough + P.START: P.EDIT,
            thorough + P.EDITED1: P.TEST,
            thorough + P.TESTS_PASS: P.SUBMIT,
        }
    )
    th[thorough + P.TESTS_FAIL] = (0.4, -SURE, -0.3)  # edit or submit, never test
    q, G = 0.35, 4
    cfg = SimConfig(
        max_turns=3, blind_edit=(q, 0.0), difficulty=((1, 1.0),), group_size=G, std_normalize=False
    )
    pe = 1 / (1 + np.exp(-0.3 - 0.4))
    ps = 1 - pe
    grad_cap = np.sqrt(2) * (1 - q) * pe * ps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = {k: float(v[0]) for k, v in terms(th[None], cfg).items()}
    assert got["j"] == pytest.approx(q, rel=1e-12)
    assert got["p_cap"] == pytest.approx((1 - q) * pe, rel=1e-12)
    assert got["grad_p_cap"] == pytest.approx(grad_cap, rel=1e-12)
    assert got["task"] == 0.0
    assert got["term"] == pytest.approx((G - 1) / G * q * grad_cap, rel=1e-12)
    assert got["ratio"] == np.inf


# ── the coefficients: any precision of J, any group size ────────────────────────────────


def test_single_precision_j_gives_the_coefficients_of_the_same_numbers_in_double():
    cfg = TWO.replace(group_size=8, std_normalize=True)
    j32 = np.array([0.1, 0.37, 0.9], dtype=np.float32)
    c_j, c_b = coefficients(j32, cfg)
    want = np.array([_enumerated(float(x), 8, True) for x in j32])
    np.testing.assert_allclose(c_j, want[:, 0], rtol=1e-12)
    np.testing.assert_allclose(c_b, want[:, 1], rtol=1e-12)
    # G = 2: the pair differs or not; σ of {0, 1} is 1/√2, so α_0 = −β_1 = (1/2) / (1/√2 + eps)
    a = 0.5 / (1 / np.sqrt(2) + 1e-6)
    c_j, c_b = coefficients(j32, cfg.replace(group_size=2))
    np.testing.assert_allclose(c_j, a, rtol=1e-12)
    np.testing.assert_allclose(c_b, a * j32.astype(np.float64), rtol=1e-12)


def test_the_coefficients_of_a_large_group_are_finite_floats():
    """G = 100: C(99, s) exceeds a 64-bit integer; the coefficients are still float64."""
    for std_normalize in (True, False):
        cfg = TWO.replace(group_size=100, std_normalize=std_normalize)
        j = np.array([0.05, 0.5, 0.93])
        c_j, c_b = coefficients(j, cfg)
        assert c_j.dtype == c_b.dtype == np.float64
        assert np.all(np.isfinite(c_j)) and np.all(np.isfinite(c_b))
        want = np.array([_coefficients_by_hand(float(x), 100, std_normalize) for x in j])
        np.testing.assert_allclose(c_j, want[:, 0], rtol=1e-10)
        np.testing.assert_allclose(c_b, want[:, 1], rtol=1e-10)
    np.testing.assert_allclose(c_b, 99 / 100 * j, rtol=1e-10)  # without std normalization
