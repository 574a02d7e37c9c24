"""The score-centering estimator against the paper's formula, written here independently.

The reference (``reference_loss``) is App. A of Marek & Ryabinin (arXiv:2609.20807) typed
in literally with torch autograd: ``f(r) = min(r, C)`` applied to the ratios themselves
(divisions included), ``α = ρ f(1/ρ)``. The expected updates are exact sums over a tiny
vocabulary, with the score ``∇_θ log p_y = e_y - p`` of a softmax over logits ``θ``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rescue.score_centering import DEFAULT_CAP, TAIL_FLOOR, head_terms, token_terms  # noqa: E402


def reference_loss(theta, q, y, head, advantage, cap):
    """``L = -A [sg(f(p_y/q_y)) log p_y - Σ_H sg(q_v f(p_v/q_v) - α p_v) log p_v]``, with
    ``ρ = (1 - Σ_H q) / (1 - Σ_H p)`` (each floored at 1e-6) and ``α = ρ f(1/ρ)``."""

    def f(r):  # TIS + SC: min(r, C); SC alone (cap None): 1
        return torch.ones_like(r) if cap is None else torch.clamp(r, max=cap)

    logp = torch.log_softmax(theta, dim=-1)
    p = logp.exp()
    head = torch.as_tensor(head)
    q = torch.as_tensor(q, dtype=theta.dtype)
    rho = torch.clamp(1 - q[head].sum(), min=TAIL_FLOOR) / torch.clamp(
        1 - p[head].sum(), min=TAIL_FLOOR
    )
    alpha = rho * f(1 / rho)
    coef = (q[head] * f(p[head] / q[head]) - alpha * p[head]).detach()
    w = f(p[y] / q[y]).detach()
    return -advantage * (w * logp[y] - (coef * logp[head]).sum())


def ours_loss(theta, q, y, head, advantage, cap):
    logp = torch.log_softmax(theta, dim=-1)
    lq = torch.log(torch.as_tensor(q, dtype=theta.dtype))
    head = torch.as_tensor(head)
    terms = token_terms(logp[y], logp[head], lq[y], lq[head], cap)
    return -advantage * terms.surrogate


def grad_of(loss_fn, theta0, *args):
    theta = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
    loss_fn(theta, *args).backward()
    return theta.grad.numpy()


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def case(seed, V=7, shift=0.8):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=V)
    q = softmax(theta + shift * rng.normal(size=V))  # a sampler that is not the trainer
    A = rng.normal(size=V) + 0.7  # E_q[A] != 0: the drift has something to multiply
    return theta, q, A


@pytest.mark.parametrize("cap", [DEFAULT_CAP, 1.5, None])
@pytest.mark.parametrize("K", [1, 3, 7])
def test_token_gradient_equals_the_papers_formula(cap, K):
    for seed in range(5):
        theta, q, A = case(seed)
        head = np.argsort(-q)[:K]
        for y in range(len(q)):  # in the head and out of it
            ref = grad_of(reference_loss, theta, q, y, head, A[y], cap)
            got = grad_of(ours_loss, theta, q, y, head, A[y], cap)
            np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_numpy_and_torch_give_the_same_terms():
    theta, q, _ = case(3)
    logp = np.log(softmax(theta))
    lq = np.log(q)
    head = np.argsort(-q)[:4]
    a = token_terms(logp[2], logp[head], lq[2], lq[head], 2.0)
    b = token_terms(*(torch.tensor(x) for x in (logp[2], logp[head], lq[2], lq[head])), 2.0)
    for x, z in [
        (a.surrogate, b.surrogate), (a.w, b.w), (a.head.coef, b.head.coef),
        (a.head.rho, b.head.rho), (a.correction_l1, b.correction_l1),
    ]:  # fmt: skip
        np.testing.assert_allclose(np.asarray(x), z.numpy(), rtol=1e-12)


@pytest.mark.parametrize("cap", [DEFAULT_CAP, None])
def test_p_equal_q_is_plain_reinforce_with_no_correction(cap):
    theta, _, A = case(1)
    p = softmax(theta)
    head = np.argsort(-p)[:3]
    for y in range(len(p)):
        got = grad_of(ours_loss, theta, p, y, head, A[y], cap)
        score = np.eye(len(p))[y] - p
        np.testing.assert_allclose(got, -A[y] * score, atol=1e-12)
    logp = np.log(p)
    terms = token_terms(logp[0], logp[head], logp[0], logp[head], cap)
    np.testing.assert_allclose(terms.head.coef, 0.0, atol=1e-15)
    assert terms.correction_l1 == pytest.approx(0.0, abs=1e-15)


def expected_update(theta, q, A, head, cap, centred):
    """``-E_{y~q}[∇L]`` by exact enumeration (the update direction of gradient descent)."""
    total = np.zeros_like(theta)
    for y, qy in enumerate(q):
        fn = ours_loss if centred else tis_only_loss
        total -= qy * grad_of(fn, theta, q, y, head, A[y], cap)
    return total


def tis_only_loss(theta, q, y, head, advantage, cap):
    logp = torch.log_softmax(theta, dim=-1)
    w = torch.exp(logp[y] - np.log(q[y])).detach()
    w = torch.ones_like(w) if cap is None else torch.clamp(w, max=cap)  # SC alone: plain PG
    return -advantage * w * logp[y]


def decomposition(theta, q, A, cap):
    """``(covariance, drift)``: ``E_q[(A - E_q A) f ∇log p]`` and ``E_q[A] E_q[f ∇log p]``."""
    p = softmax(theta)
    r = p / q
    f = np.ones_like(r) if cap is None else np.minimum(r, cap)
    scores = np.eye(len(p)) - p  # row y: ∇ log p_y
    weighted = (q * f)[:, None] * scores
    mean_a = float(q @ A)
    return ((A - mean_a)[:, None] * weighted).sum(0), mean_a * weighted.sum(0)


#: A cap that truncates often at these mismatches (at C = 2 few ratios exceed C, and an
#: untruncated ratio leaves no drift: E_q[(p/q) ∇log p] = 0).
TIGHT = 1.2


@pytest.mark.parametrize("cap", [TIGHT, None])
def test_full_head_removes_the_drift_exactly(cap):
    for seed in range(4):
        theta, q, A = case(seed)
        cov, drift = decomposition(theta, q, A, cap)
        assert np.linalg.norm(drift) > 0.01  # the drift is there to remove (it is 1e-12 below)
        head = np.arange(len(q))
        np.testing.assert_allclose(
            expected_update(theta, q, A, head, cap, centred=False), cov + drift, atol=1e-12
        )
        np.testing.assert_allclose(
            expected_update(theta, q, A, head, cap, centred=True), cov, atol=1e-12
        )


@pytest.mark.parametrize("cap", [TIGHT, None])
def test_top_k_head_is_exact_when_the_tail_follows_the_model(cap):
    """Outside the head the sampler is ``ρ p``: then the top-K form is exact too."""
    rng = np.random.default_rng(7)
    V, K = 8, 3
    theta = rng.normal(size=V)
    p = softmax(theta)
    head = np.argsort(-p)[:K]
    q = p.copy()
    q[head] = p[head] * np.array([1.6, 0.5, 1.2])
    tail = np.setdiff1d(np.arange(V), head)
    q[tail] = p[tail] * (1 - q[head].sum()) / p[tail].sum()  # q = ρ p on the tail
    A = rng.normal(size=V) + 0.5
    cov, drift = decomposition(theta, q, A, cap)
    assert np.linalg.norm(drift) > 0.05
    np.testing.assert_allclose(
        expected_update(theta, q, A, head, cap, centred=True), cov, atol=1e-12
    )


def test_top_k_head_leaves_a_drift_bounded_by_the_tail_mass():
    """A general tail: what is left of the drift is small beside the drift itself."""
    theta, q, A = case(11, V=9, shift=0.5)
    theta, q = 3 * theta, softmax(3 * np.log(q))  # peaked, as an LLM's: a head holds most
    cov, drift = decomposition(theta, q, A, TIGHT)
    head = np.argsort(-q)[:5]
    assert q[head].sum() > 0.95 and np.linalg.norm(drift) > 0.05
    left = expected_update(theta, q, A, head, TIGHT, centred=True) - cov
    assert np.linalg.norm(left) < 0.2 * np.linalg.norm(drift)
    full = expected_update(theta, q, A, np.arange(9), TIGHT, centred=True) - cov
    assert np.linalg.norm(full) < 1e-10


def test_linear_in_the_advantage_so_weights_and_divisors_compose():
    """The protect arm's 1/a, R = 0 and a constant divisor scale score and centering alike."""
    theta, q, A = case(5)
    head = np.argsort(-q)[:3]
    for y in (0, 4):
        g = grad_of(ours_loss, theta, q, y, head, A[y], 2.0)
        np.testing.assert_allclose(grad_of(ours_loss, theta, q, y, head, 4.0 * A[y], 2.0), 4 * g)
        np.testing.assert_allclose(grad_of(ours_loss, theta, q, y, head, 0.0, 2.0), 0 * g)


def test_padded_head_entries_contribute_nothing():
    theta, q, _ = case(2)
    logp, lq = np.log(softmax(theta)), np.log(q)
    head = np.argsort(-q)[:3]
    base = head_terms(logp[head], lq[head], 2.0)
    padded = head_terms(
        np.append(logp[head], 0.0), np.append(lq[head], 0.0), 2.0,
        valid=np.array([True, True, True, False]),
    )  # fmt: skip
    np.testing.assert_allclose(padded.coef[:3], base.coef)
    assert padded.coef[3] == 0.0 and padded.rho == pytest.approx(base.rho)


def test_rho_alpha_and_tail_floor():
    # head holding all the mass: both tails floored, ρ = 1, α = min(1, C)
    h = head_terms(np.log([0.5, 0.5]), np.log([0.3, 0.7]), 2.0)
    assert h.rho == pytest.approx(1.0) and h.alpha == pytest.approx(1.0)
    # tails 0.4 (q) and 0.8 (p): ρ = 0.5, TIS α = min(1, 2 · 0.5) = 1, SC alone α = ρ
    h = head_terms(np.log([0.2]), np.log([0.6]), 2.0)
    assert h.rho == pytest.approx(0.5) and h.alpha == pytest.approx(1.0)
    assert head_terms(np.log([0.2]), np.log([0.6]), None).alpha == pytest.approx(0.5)
    # c = min(p, C q) - α p
    assert h.coef[0] == pytest.approx(min(0.2, 2 * 0.6) - 1.0 * 0.2)


def test_truncated_flags_ratios_above_the_cap():
    t = token_terms(np.log(0.9), np.log([0.9]), np.log(0.3), np.log([0.3]), 2.0)
    assert bool(t.truncated) and t.w == pytest.approx(2.0)
    t = token_terms(np.log(0.5), np.log([0.5]), np.log(0.3), np.log([0.3]), 2.0)
    assert not bool(t.truncated) and t.w == pytest.approx(0.5 / 0.3)
