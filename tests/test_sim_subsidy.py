"""The exact subsidy terms (``rescue.sim.subsidy``): what the mask pays, measured where it acts.

- The exact tables are the episodes the simulator plays: J and P(cap) per task against
  the outcome shares of many played episodes (binomial error), with and without the
  third outcome.
- Their gradients are the finite difference of the exact values (central, h = 1e-5).
- The logged terms are the expected masked update's components along ∇P(cap): the finite
  difference of ``c_J J + c_b P(cap)`` with the coefficients held, projected on ``u``.
- The simulator's own arms, on average over on-policy batches, take those steps: the
  R = 0 arm's gradient along ``u`` is ``task``, the mask arm's ``task + term`` (their
  difference ``term``), within four standard errors of the batch mean.
- Known answers: without std normalization the coefficients are the identity's
  ((G − 1)/G and (G − 1)/G · J); without learning every step logs the same terms, and
  every arm the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from rescue.errors import InputError
from rescue.sim import env, update
from rescue.sim import policy as P
from rescue.sim import scenario as sc
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.run import run_one
from rescue.sim.subsidy import KEYS, PREFIX, coefficients, outcome_tables, terms

BUDGET = sc.preset("budget-three-outcome").sim_config(infra_rate=0.0)
TWO = sc.preset("two-outcome").sim_config(infra_rate=0.0)
SLOTS = [(r, c) for r in range(P.ROWS) for c in range(P.CHOICES) if P.available()[r, c]]


def perturbed(theta: np.ndarray, h: float) -> np.ndarray:
    """``theta`` with each available logit (``SLOTS``) moved by +h, then −h: ``[2·slots, ...]``
    for central differences."""
    stack = []
    for r, c in SLOTS:
        for sign in (1, -1):
            t = theta.copy()
            t[r, c] += sign * h
            stack.append(t)
    return np.array(stack)


def _theta(cfg: SimConfig, jitter: float = 0.0, seed: int = 0) -> np.ndarray:
    th = np.array(cfg.initial_logits, dtype=np.float64)
    return th + jitter * np.random.default_rng(seed).normal(size=th.shape)


def _ks_w(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([k for k, _ in cfg.difficulty]),
        np.array([p for _, p in cfg.difficulty]),
    )


@pytest.mark.parametrize("cfg", [BUDGET, TWO], ids=["three-outcome", "two-outcome"])
def test_the_exact_tables_are_the_outcome_shares_of_the_played_episodes(cfg):
    th = _theta(cfg, 0.5, seed=3)
    ks, _ = _ks_w(cfg)
    value, _ = outcome_tables(th[None], cfg, ks)
    rng = np.random.default_rng(7)
    n = 60_000
    for i, k in enumerate(ks):
        ep = env.run_episodes(P.Policy(th).probs(), np.full(n, k), rng, cfg)
        for o, kind in enumerate((env.SOLVED, env.CAPPED)):
            p = value[0, i, o]
            share = float(np.mean(ep.kind == kind))
            assert abs(share - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12, (k, o, share, p)


@pytest.mark.parametrize("cfg", [BUDGET, TWO], ids=["three-outcome", "two-outcome"])
def test_the_gradients_are_the_finite_difference_of_the_exact_values(cfg):
    th = _theta(cfg, 0.7, seed=11)
    ks, _ = _ks_w(cfg)
    h = 1e-5
    values, _ = outcome_tables(perturbed(th, h), cfg, ks)
    fd = (values[0::2] - values[1::2]) / (2 * h)  # [slot, K, o]
    _, grad = outcome_tables(th[None], cfg, ks)
    exact = np.array([grad[0, :, :, r, c] for r, c in SLOTS])
    assert np.abs(exact).max() > 1e-2  # the gradients are not all 0
    np.testing.assert_allclose(exact, fd, atol=1e-8)


def test_the_logged_terms_are_the_finite_difference_of_the_expected_masked_update():
    cfg = BUDGET
    th = _theta(cfg, 0.4, seed=5)
    ks, w = _ks_w(cfg)
    value, _ = outcome_tables(th[None], cfg, ks)
    c_j, c_b = coefficients(value[0, :, 0], cfg)  # held at θ, as the expectation is at θ

    def update_potential(t: np.ndarray) -> np.ndarray:
        """``Σ_k w_k (c_J J_k + c_b P_k(cap))`` and ``Σ_k w_k c_J J_k`` and P(cap)."""
        v, _ = outcome_tables(t, cfg, ks)
        return np.stack([(w * (c_j * v[..., 0] + c_b * v[..., 1])).sum(-1),
                         (w * c_j * v[..., 0]).sum(-1), (w * v[..., 1]).sum(-1)], -1)  # fmt: skip

    h = 1e-5
    stack = []
    for r, c in SLOTS:
        for sign in (1, -1):
            t = th.copy()
            t[r, c] += sign * h
            stack.append(t)
    f = update_potential(np.array(stack))
    fd = (f[0::2] - f[1::2]) / (2 * h)  # [slot, (mask update, R = 0 update, P(cap))]
    u = fd[:, 2] / np.linalg.norm(fd[:, 2])
    logged = terms(th[None], cfg)
    assert logged["task"][0] == pytest.approx(fd[:, 1] @ u, abs=1e-8)
    assert logged["term"][0] == pytest.approx((fd[:, 0] - fd[:, 1]) @ u, abs=1e-8)
    assert logged["term"][0] > 1e-3  # a subsidy that exists
    assert logged["grad_p_cap"][0] == pytest.approx(np.linalg.norm(fd[:, 2]), rel=1e-6)
    assert logged["ratio"][0] == pytest.approx(logged["term"][0] / abs(logged["task"][0]))


def test_the_arms_gradients_average_to_the_logged_terms_on_policy():
    cfg = BUDGET.replace(groups_per_step=64)
    th = _theta(cfg)
    policy = P.Policy(th)
    pi = policy.probs()
    ks, w = _ks_w(cfg)
    _, grad = outcome_tables(th[None], cfg, ks)
    g_cap = np.einsum("k,kd->d", w, grad[0, :, 1].reshape(len(ks), -1))
    u = g_cap / np.linalg.norm(g_cap)
    logged = terms(th[None], cfg)
    rng = np.random.default_rng(2026)
    B, G = cfg.groups_per_step, cfg.group_size
    zero, mask = [], []
    for _ in range(200):
        k = np.repeat(env.draw_tasks(rng, B, cfg), G)
        ep = env.play(pi, k, rng, cfg)
        groups = [
            env.Episodes(*(getattr(ep, f)[j * G : (j + 1) * G] for f in env.Episodes.__dataclass_fields__))
            for j in range(B)
        ]  # fmt: skip
        capped = [list(g.kind == env.CAPPED) for g in groups]
        kept = update.Batch.of(groups, [[False] * G] * B, [1.0] * B)
        masked = update.Batch.of(groups, capped, [1.0] * B)
        zero.append(update.gradient(policy, kept, ArmSpec("zero"), cfg, pi)[0].ravel() @ u)
        mask.append(update.gradient(policy, masked, ArmSpec("mask"), cfg, pi)[0].ravel() @ u)
    zero, mask = np.array(zero), np.array(mask)

    def near(x: np.ndarray, expected: float) -> None:
        se = x.std(ddof=1) / np.sqrt(x.size)
        assert abs(x.mean() - expected) <= 4 * se, (x.mean(), expected, se)

    near(zero, logged["task"][0])
    near(mask, logged["task"][0] + logged["term"][0])
    near(mask - zero, logged["term"][0])


def test_without_std_normalization_the_coefficients_are_the_identitys():
    cfg = BUDGET.replace(std_normalize=False)
    G = cfg.group_size
    j = np.array([0.0, 0.2, 0.55, 1.0])
    c_j, c_b = coefficients(j, cfg)
    np.testing.assert_allclose(c_j, (G - 1) / G)
    np.testing.assert_allclose(c_b, (G - 1) / G * j)


def test_the_engine_logs_the_terms_of_each_step_and_none_when_off():
    small = dict(steps=4, groups_per_step=4, concurrency=4)
    cfg = BUDGET.replace(subsidy=True, **small)
    res = run_one(cfg, ArmSpec("mask"), 0)
    for m in res.steps:
        assert {PREFIX + k for k in KEYS} <= set(m)
        assert np.isfinite(m[PREFIX + "term"]) and m[PREFIX + "term"] > 0
    assert res.steps[0][PREFIX + "term"] == pytest.approx(terms(_theta(cfg)[None], cfg)["term"][0])
    assert res.steps[1][PREFIX + "term"] != res.steps[0][PREFIX + "term"]  # it learned
    off = run_one(BUDGET.replace(subsidy=False, **small), ArmSpec("mask"), 0)
    assert not any(k.startswith(PREFIX) for m in off.steps for k in m)
    # no random draw: with the terms on, every other output is the same
    assert [
        {k: v for k, v in m.items() if not k.startswith(PREFIX)} for m in res.steps
    ] == off.steps


def test_without_learning_every_step_and_every_arm_logs_the_same_terms():
    cfg = BUDGET.replace(subsidy=True, lr=0.0, steps=3, groups_per_step=4, concurrency=4)
    first = terms(_theta(cfg)[None], cfg)
    for arm in ("zero", "mask", "matched"):
        for m in run_one(cfg, ArmSpec(arm), 1).steps:
            for k in KEYS:
                assert m[PREFIX + k] == pytest.approx(first[k][0], rel=1e-12)


@pytest.mark.parametrize(
    "changes", [{"episodes": "table"}, {"baseline_scope": "batch"}], ids=["table", "batch"]
)
def test_subsidy_refuses_settings_it_has_no_terms_for(changes):
    with pytest.raises(InputError, match="--subsidy"):
        SimConfig(subsidy=True, **changes)
