"""The two constructions show what they are built to show, with Monte Carlo tolerances.

``fast-thorough`` (regime B): at the initial policy (p = P(thorough) = ½, learning rate 0,
so every step's gradient is a first step's) the gradients the trainer computes agree with
the exact enumeration of ``rescue identity fast-thorough``: never-drop ∇J = +0.075, drop
the survivors' −0.017, protect the IPW +0.075; trained, drop moves the strategy share
toward Fast relative to never-drop.

``two-outcome`` (the control): per prompt, the mask arm's expected gradient is (1 − J_x)
times R = 0's, and the survivors' baseline gives exactly nothing. The same statistic,
computed on ``budget-three-outcome``, sees the direction change there (it can fail).

Tolerances are ``Z`` standard errors of the mean of independent replicates (steps of a
stationary run, or groups), two-sided: the seeds are fixed, so each check is deterministic
and ``Z`` sets how surprising a failure would be if the construction were right.
"""

import numpy as np
import pytest
from scipy import stats

from rescue import identity as I
from rescue.mask import mask_decision
from rescue.sim import ArmSpec, Simulation, env, update
from rescue.sim import policy as P
from rescue.sim import scenario as sc

Z = 3.5
FT = sc.preset("fast-thorough")
WARM = 20  # steps before the pipeline is stationary (the first late rollouts return)


def first_steps(arm: str, seeds=(0, 1, 2, 3), steps: int = 120):
    """Per-step (gradient on the thorough logit, loss normalizer) at θ0, after warm-up."""
    cfg = FT.sim_config(lr=0.0, steps=steps)
    g, n = [], []
    for s in seeds:
        for m in Simulation(cfg, ArmSpec.parse(arm), s).run()[WARM:]:
            g.append(m["sim/grad_thorough"])
            n.append(m["sim/loss_normalizer"])
    N = cfg.groups_per_step * cfg.group_size
    # The baseline is the batch's mean reward, the rollout's own included: exactly
    # (1 − 1/N) times the population baseline's expectation.
    return np.array(g) * N / (N - 1), np.array(n), N


def mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size))


def construction(a: float) -> I.Table:
    """The scenario's table: 10% of Thorough's successes early (kept), 90% late (kept with a)."""
    rows = [
        ("fast", 0.6, 1, 1.0),
        ("fast", 0.4, 0, 1.0),
        ("thorough", 0.9 * 0.1, 1, 1.0),
        ("thorough", 0.9 * 0.9, 1, a),
        ("thorough", 0.1, 0, 1.0),
    ]
    return I.Table.from_dict(
        {
            "actions": ["fast", "thorough"],
            "theta": [0.0, 0.0],
            "rows": [{"action": x, "q": q, "reward": r, "keep": k} for x, q, r, k in rows],
        }
    )


ENUM = I.report(I.fast_thorough())


def test_the_enumeration_is_the_plans():
    assert ENUM["grad_J"][1] == pytest.approx(0.075)
    assert ENUM["survivor_estimate"][1] == pytest.approx(-0.017, abs=5e-4)
    assert ENUM["ipw"][1] == pytest.approx(0.075)
    # The scenario's own table (early/late successes) has the same survivors and IPW.
    assert I.survivor_estimate(construction(1e-12))[1] == pytest.approx(
        ENUM["survivor_estimate"][1]
    )
    assert I.ipw_estimate(construction(0.5))[1] == pytest.approx(0.075)


def test_drop_excludes_exactly_the_late_successes():
    cfg = FT.sim_config(lr=0.0, steps=80)
    steps = Simulation(cfg, ArmSpec.parse("drop"), 0).run()[WARM:]
    dropped = {o: sum(m[f"rollout/census/dropped/outcome/{o}"] for m in steps)
               for o in ("solved", "submitted_failure")}  # fmt: skip
    generated = sum(m["rollout/census/generated/rollouts"] for m in steps)
    late = 0.5 * 0.9 * 0.9  # P(thorough) × success × late share
    assert dropped["submitted_failure"] == 0
    share = dropped["solved"] / generated
    assert share == pytest.approx(late, abs=Z * np.sqrt(late * (1 - late) / generated))
    trained_late = [m.get("rollout/census/turns_p90/solved") for m in steps]
    assert max(t for t in trained_late if t is not None) < cfg.table_late_turns


def test_never_drop_first_step_gradient_is_the_full_gradient():
    g, _, _ = first_steps("never-drop")
    m, se = mean_se(g)
    assert abs(m - ENUM["grad_J"][1]) < Z * se


def test_drop_first_step_gradient_is_the_survivors_and_has_the_opposite_sign():
    g, _, _ = first_steps("drop")
    m, se = mean_se(g)
    assert abs(m - ENUM["survivor_estimate"][1]) < Z * se
    assert m + Z * se < 0


def test_protect_first_step_gradient_is_the_ipw_estimate():
    # As is, the loss is a mean over the kept rollouts: E = ∇J / P(kept).
    g, _, _ = first_steps("protect:0.5")
    P_kept = I.kept_mass(construction(0.5))
    m, se = mean_se(g * P_kept)
    assert abs(m - ENUM["ipw"][1]) < Z * se


def test_protects_expected_gradient_equals_never_drops():
    # Normalized by the sum of its weights the protect loss follows E[S] / E[Σw] = ∇J: the
    # ratio of the sums over every step (delta-method standard error).
    g, n, _ = first_steps("protect:0.5:wnorm")
    S = g * n  # the step's weighted sum, back from the mean
    ratio = S.sum() / n.sum()
    resid = (S - ratio * n) / n.mean()
    se = float(resid.std(ddof=1) / np.sqrt(resid.size))
    assert abs(ratio - ENUM["ipw"][1]) < Z * se
    nd, _, _ = first_steps("never-drop")
    m, se_nd = mean_se(nd)
    assert abs(ratio - m) < Z * np.hypot(se, se_nd)


def test_training_with_drop_moves_the_strategy_share_toward_fast():
    seeds = (0, 1, 2)
    final = {}
    for arm in ("drop", "never-drop"):
        final[arm] = np.array(
            [Simulation(FT.sim_config(), ArmSpec.parse(arm), s).run()[-1]["sim/p_thorough"]
             for s in seeds]
        )  # fmt: skip
    d = final["drop"] - final["never-drop"]
    hi = d.mean() + stats.t.ppf(0.995, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
    assert hi < 0  # the 99% t interval of drop − never-drop lies below 0
    assert (final["drop"] < 0.5).all() and (final["never-drop"] > 0.5).all()


# ---------------------------------------------------------------- two outcomes


def prompt_gradients(scenario: str, arm: str, k: int, n: int, seed: int):
    """Per-group gradients (summed over the group's decisions) of ``n`` groups of prompt k
    under the scenario's settings at the initial policy; and each group's mean reward."""
    cfg = sc.preset(scenario).sim_config()
    G = cfg.group_size
    rng = np.random.default_rng(seed)
    probs = P.Policy(np.array(cfg.initial_logits)).probs()
    ep = env.play(probs, np.full(n * G, k), rng, cfg)
    spec = ArmSpec.parse(arm)
    masked = [
        spec.mask and mask_decision(env.CLASSIFICATIONS[int(kind)], f"{i}", 1.0, seed)
        for i, kind in enumerate(ep.kind)
    ]
    groups = [env.Episodes(*(getattr(ep, f)[j * G : (j + 1) * G]
                             for f in env.Episodes.__dataclass_fields__)) for j in range(n)]  # fmt: skip
    # A group with a rollout lost to infrastructure is aborted, never trained (as the engine).
    whole = [j for j, g in enumerate(groups) if not (g.kind == env.LOST).any()]
    n = len(whole)
    masked = np.reshape(masked, (-1, G))[whole]
    batch = update.Batch.of([groups[j] for j in whole], masked, np.ones(n))
    coef, _ = update.coefficients(batch, spec, cfg, probs)
    coef *= update.normalizer(batch, spec)  # per group: the sum, not the batch mean
    pol = P.Policy(np.array(cfg.initial_logits))
    grads = np.stack([pol.gradient(batch.rows[j], batch.choices[j], coef[j]).ravel()
                      for j in range(n)])  # fmt: skip
    return grads[:, P.available().ravel()], batch.reward.mean(axis=1)


def rescaling_z(scenario: str, k: int, n: int = 4000, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Per parameter, (mean of mask − (1 − J)·zero) / its SE, on the same groups (delta method
    for the estimated J). ``n`` groups give the easiest prompt (3% capped) about a thousand
    capped rollouts, the events the mask acts on: enough for the normal approximation."""
    gz, r = prompt_gradients(scenario, "zero", k, n, seed)
    gm, r2 = prompt_gradients(scenario, "mask", k, n, seed)
    assert np.array_equal(r, r2)  # the same episodes: common random numbers
    J = r.mean()
    mz = gz.mean(axis=0)
    u = gm - (1 - J) * gz + (r - J)[:, None] * mz[None, :]
    n = r.size
    z = u.mean(axis=0) / (u.std(axis=0, ddof=1) / np.sqrt(n) + 1e-300)
    return z, {"J": J, "zero_z": mz / (gz.std(axis=0, ddof=1) / np.sqrt(n) + 1e-300)}


#: Two-sided normal quantile for 0.001 spread over every parameter of every prompt.
Z_ALL = float(stats.norm.ppf(1 - 0.001 / (2 * 4 * int(P.available().sum()))))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_two_outcomes_the_mask_only_rescales_each_prompt_by_one_minus_j(k):
    z, info = rescaling_z("two-outcome", k)
    assert np.abs(z).max() < Z_ALL
    assert np.abs(info["zero_z"]).max() > 5  # there is a gradient to rescale


def test_the_rescaling_differs_across_prompts():
    Js = [rescaling_z("two-outcome", k, n=300)[1]["J"] for k in (1, 5)]
    assert Js[0] > 0.8 and Js[1] < 0.3  # easy prompts are scaled down, hard ones kept


def test_two_outcomes_the_survivors_baseline_has_no_signal():
    g, _ = prompt_gradients("two-outcome", "survivor", 3, 200, 0)
    assert np.abs(g).max() < 1e-12


def test_with_a_third_outcome_the_same_statistic_sees_the_direction_change():
    z, _ = rescaling_z("budget-three-outcome", 3)
    assert np.abs(z).max() > Z_ALL
