"""``rescue.sim.subsidy`` against references that do not go through its own code.

- The coefficients ``E α − E β`` and ``−E β`` with std normalization on (the module's own
  finite-difference test holds them fixed, so it cannot see them): every one of the
  ``2^(G−1)`` outcomes of the other members enumerated, each advantage computed here from
  the normalizer's definition (``(R − mean) / (σ + eps)``, σ the ddof-1 std, 0 when σ = 0),
  weighted by its probability.
- The logged terms of a two-task grid against a hand-assembled sum over the tasks, each
  task's exact gradient taken alone.
- What is refused, and what a step without terms logs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

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
    from rescue.sim import policy as P

    rng = np.random.default_rng(1)
    th = rng.normal(size=(3, P.ROWS, P.CHOICES))
    pi = subsidy.probs_of(th)
    for i in range(3):
        np.testing.assert_allclose(pi[i], P.Policy(th[i]).probs(), atol=1e-15)
    assert np.all(pi[:, ~P.available()] == 0)
    np.testing.assert_allclose(pi.sum(-1), 1.0)
