"""The simulated agent: its exact score function and the episode rules."""

import numpy as np
import pytest

from rescue.sim import SimConfig, env
from rescue.sim import policy as P

DEFAULT = SimConfig()


def initial_policy(cfg: SimConfig = DEFAULT) -> P.Policy:
    return P.Policy(np.array(cfg.initial_logits))


def play(n_groups: int = 400, seed: int = 0, cfg: SimConfig = DEFAULT) -> env.Episodes:
    rng = np.random.default_rng(seed)
    k = np.repeat(env.draw_tasks(rng, n_groups, cfg), 8)
    return env.run_episodes(initial_policy(cfg).probs(), k, rng, cfg)


def test_probabilities_are_a_softmax_over_the_available_choices():
    pol = P.Policy(np.random.default_rng(0).normal(size=(P.ROWS, P.CHOICES)))
    pi = pol.probs()
    assert np.allclose(pi.sum(axis=1), 1.0)
    assert np.all(pi[~P.available()] == 0.0)
    assert pi[P.STRATEGY_ROW, 2] == 0.0 and np.all(pi[1:7, P.TEST] == 0.0)  # fast never tests


def test_the_score_function_is_the_exact_gradient_of_the_log_probabilities():
    rng = np.random.default_rng(1)
    pol = P.Policy(rng.normal(size=(P.ROWS, P.CHOICES)))
    ok = P.available()
    rows = rng.integers(0, P.ROWS, size=50)
    choices = np.array([rng.choice(np.flatnonzero(ok[r])) for r in rows])
    coef = rng.normal(size=50)

    def objective(theta):
        pi = P.Policy(theta).probs()
        return float((coef * np.log(pi[rows, choices])).sum())

    grad = pol.gradient(rows, choices, coef)
    numeric = np.zeros_like(grad)
    h = 1e-6
    for r, c in zip(*np.nonzero(ok), strict=True):
        up, down = pol.theta.copy(), pol.theta.copy()
        up[r, c] += h
        down[r, c] -= h
        numeric[r, c] = (objective(up) - objective(down)) / (2 * h)
    assert np.allclose(grad, numeric, atol=1e-6)


def test_padding_decisions_do_not_count():
    pol = P.Policy(np.zeros((P.ROWS, P.CHOICES)))
    g = pol.gradient(np.array([0, -1]), np.array([1, -1]), np.array([1.0, 5.0]))
    assert g[0].tolist() == pytest.approx([-0.5, 0.5, 0.0])
    assert np.all(g[1:] == 0)


def test_fast_never_runs_tests_and_thorough_does():
    ep = play()
    fast, thorough = ep.strategy == P.FAST, ep.strategy == P.THOROUGH
    assert not ep.ran_tests[fast].any()
    assert ep.ran_tests[thorough].mean() > 0.8
    assert not (ep.choices[fast] == P.TEST).any()


def test_thorough_takes_longer_and_succeeds_more_at_the_start():
    ep = play()
    fast, thorough = ep.strategy == P.FAST, ep.strategy == P.THOROUGH
    assert ep.reward[thorough].mean() > ep.reward[fast].mean() + 0.2
    assert np.median(ep.duration[thorough]) > 2 * np.median(ep.duration[fast])


def test_the_turn_cap_ends_an_episode_as_a_budget_failure():
    cfg = SimConfig(max_turns=6)
    ep = play(cfg=cfg)
    capped = ep.kind == env.CAPPED
    assert capped.any()
    assert np.all(ep.turns[capped] == 6) and np.all(ep.turns <= 6)
    # column ℓ is turn ℓ (column 0 the strategy): reached turns hold a decision, the rest -1
    assert ep.rows.shape == ep.choices.shape == (ep.turns.size, cfg.max_turns + 1)
    after = np.arange(cfg.max_turns + 1)[None, :] > ep.turns[:, None]
    assert after.any()  # most episodes end before the cap
    assert np.all(ep.rows[after] == -1) and np.all(ep.choices[after] == -1)
    assert np.all(ep.rows[~after] >= 0) and np.all(ep.choices[~after] >= 0)
    submitted = (ep.kind == env.SOLVED) | (ep.kind == env.FAILED)
    last = ep.choices[np.arange(ep.turns.size), ep.turns]
    assert np.all(last[submitted] == P.SUBMIT)
    assert np.all(ep.reward[capped] == 0)


def test_wall_clock_grows_with_turns():
    ep = play()
    alive = ep.kind != env.LOST
    corr = np.corrcoef(ep.turns[alive], ep.duration[alive])[0, 1]
    assert corr > 0.9


def test_the_infrastructure_loss_rate_is_the_configured_one():
    rate, n_groups = 0.05, 2000
    ep = play(n_groups=n_groups, cfg=SimConfig(infra_rate=rate))
    n = n_groups * 8
    # Binomial(n, rate): allow 5 standard errors.
    assert abs((ep.kind == env.LOST).mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / n)


def test_tasks_follow_the_difficulty_distribution():
    cfg = SimConfig(difficulty=((1, 0.5), (9, 0.5)))
    k = env.draw_tasks(np.random.default_rng(0), 4000, cfg)
    assert set(np.unique(k)) == {1, 9}
    # Binomial(4000, 0.5): 5 standard errors.
    assert abs((k == 1).mean() - 0.5) < 5 * np.sqrt(0.25 / 4000)


@pytest.mark.parametrize(
    "change, flag",
    [
        ({"steps": 0}, "--steps"),
        ({"max_staleness": -1}, "--max-staleness"),
        ({"infra_rate": 1.0}, "--infra-rate"),
        ({"difficulty": ((1, 0.5),)}, "--difficulty"),
        ({"blind_edit": (0.8, 0.3)}, "--blind-edit"),
    ],
)
def test_bad_settings_are_errors_naming_them(change, flag):
    with pytest.raises(ValueError, match=flag):
        SimConfig().replace(**change)
