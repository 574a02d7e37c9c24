"""Benchmark: the drift left in the expected update, TIS alone against TIS + score centering.

A tiny softmax policy over V = 64 tokens at one prefix (peaked logits): the trainer's ``p``, a sampler ``q``
that is not ``p`` (stale or quantized weights: the logits plus noise), per-token advantages
with ``E_q[A] != 0``. The expected update ``E_{y~q}[-∇L_t]`` is summed exactly over the
vocabulary (no sampling). It splits into the covariance ``E_q[(A - E_q A) f ∇log p]``, the
reward signal, and the drift ``E_q[A] E_q[f ∇log p]``, which carries no reward information
(``f = min(p/q, C)``). Printed side by side, per mismatch level and head size K: the norm
of the drift without the correction, and the norm of what is left of it with
``rescue.score_centering`` (0 with a head covering the vocabulary; with a top-K head, what
the tail model ``q = ρ p`` misses). Averaged over 200 random prefixes per row.

Run: .venv/bin/python bench/score_centering.py
"""

from __future__ import annotations

import numpy as np

from rescue.score_centering import DEFAULT_CAP, head_terms, weight

V, PREFIXES = 64, 200
#: Logit scale: a peaked distribution, most of the mass in a few tokens, as an LLM's.
SCALE = 3.0


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def expected_updates(theta, sampler_logits, A, k, cap):
    """(TIS alone, TIS + SC, covariance) expected updates at one prefix."""
    p, q = softmax(theta), softmax(sampler_logits)
    scores = np.eye(V) - p  # row y: ∇_θ log p_y
    f = weight(p / q, cap)
    tis = ((q * A * f)[:, None] * scores).sum(0)
    head = np.argsort(-q)[:k]
    c = head_terms(np.log(p[head]), np.log(q[head]), cap).coef
    centring = c @ scores[head]  # Σ_H c_v ∇log p_v, the same for every sampled y
    sc = tis - (q @ A) * centring
    cov = ((q * (A - q @ A) * f)[:, None] * scores).sum(0)
    return tis, sc, cov


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"V={V}, C={DEFAULT_CAP}, {PREFIXES} prefixes per row; norms are means over prefixes")
    print(
        f"{'mismatch':>8} {'K':>3} {'head mass':>9} {'|drift| TIS':>12} {'|drift| TIS+SC':>15} {'ratio':>9}"
    )
    for sigma in (0.1, 0.5, 1.0):
        cases = [
            (SCALE * rng.normal(size=V), SCALE * rng.normal(size=V), rng.normal(size=V) + 0.5)
            for _ in range(PREFIXES)
        ]
        for k in (V, 16, 4):
            drift, left, mass = [], [], []
            for theta, noise, A in cases:
                sampler = theta + sigma * noise
                tis, sc, cov = expected_updates(theta, sampler, A, k, DEFAULT_CAP)
                drift.append(np.linalg.norm(tis - cov))
                left.append(np.linalg.norm(sc - cov))
                mass.append(np.sort(softmax(sampler))[::-1][:k].sum())
            d, r, m = float(np.mean(drift)), float(np.mean(left)), float(np.mean(mass))
            print(f"{sigma:>8} {k:>3} {m:>9.4f} {d:>12.3e} {r:>15.3e} {r / d:>9.2e}")


if __name__ == "__main__":
    main()
