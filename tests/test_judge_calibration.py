"""Calibration of the judge: A/A comparisons and a planted effect.

- A/A on simulated runs: one arm (never-drop) run on disjoint blocks of seeds, each block
  compared with the next as if they were two arms (paired by position), through the
  judge's own ``compare`` on the quantities P5 and P6 read. A difference (``as
  predicted`` or ``opposite``) may be declared in at most the nominal 5% of comparisons;
  the tolerance is the 99.9% quantile of Binomial(K, 0.05) for the K comparisons of one
  quantity (its blocks are disjoint, so its comparisons are independent).
- The same rule on synthetic per-seed values (the statistic only needs per-seed numbers,
  so these are plain normal draws): the declared-difference rate of 4000 A/A comparisons
  lies inside the two-sided 99.9% binomial interval around 5%, and a planted effect of
  1.5 σ with 5 seeds (2 σ with 3) is found at the power the noncentral t gives, within the
  same binomial interval.
"""

import numpy as np
import pytest
from scipy import stats as sps

from rescue.judge.checks import compare
from rescue.judge.stats import AS_PREDICTED, LEVEL, OPPOSITE, decide, t_interval
from rescue.judge.windows import final, whole
from rescue.sim import ArmSpec, SimConfig
from rescue.sim.runner import run_arms
from rescue.sim.summary import to_run

ALPHA = 1 - LEVEL
DECLARED = (AS_PREDICTED, OPPOSITE)


def binomial_band(n: int, p: float, q: float = 0.999) -> tuple[int, int]:
    """Two-sided ``q`` interval of Binomial(n, p) counts."""
    return int(sps.binom.ppf((1 - q) / 2, n, p)), int(sps.binom.ppf(1 - (1 - q) / 2, n, p))


# ---------------------------------------------------------------- synthetic per-seed values


@pytest.mark.parametrize("n", [3, 5])
def test_aa_on_per_seed_values_declares_a_difference_at_the_nominal_rate(n):
    rng = np.random.default_rng(20 + n)
    trials = 4000
    d = rng.normal(0.0, 1.0, (trials, n)) - rng.normal(0.0, 1.0, (trials, n))
    declared = sum(decide(t_interval(row), "higher", margin=0.1)[0] in DECLARED for row in d)
    lo, hi = binomial_band(trials, ALPHA)
    assert lo <= declared <= hi, f"{declared}/{trials} A/A comparisons declared a difference"


@pytest.mark.parametrize("n, effect", [(5, 1.5), (3, 2.0)])
def test_a_planted_effect_is_found_at_the_power_of_the_noncentral_t(n, effect):
    rng = np.random.default_rng(100 + n)
    trials = 2000
    d = rng.normal(effect, 1.0, (trials, n))  # paired differences, SD 1, mean `effect`
    found = sum(decide(t_interval(row), "higher")[0] == AS_PREDICTED for row in d)
    crit = sps.t.ppf(1 - ALPHA / 2, n - 1)
    power = sps.nct.sf(crit, n - 1, effect * np.sqrt(n))
    lo, hi = binomial_band(trials, power)
    assert lo <= found <= hi, f"found {found}/{trials}, expected power {power:.3f}"


# ---------------------------------------------------------------- simulated runs


BLOCK = 3  # seeds per side, the plan's three seeds
K = 16  # A/A comparisons per quantity
QUANTITIES = (
    ("final success", final("success")),
    ("final cap-hit rate", final("cap_hit")),
    ("turns of successes", whole("turns_solved")),
    ("turns of failures", whole("turns_failed")),
)


@pytest.fixture(scope="module")
def never_drop_runs():
    cfg = SimConfig(steps=20, groups_per_step=4, group_size=4, concurrency=4, max_turns=12)
    results = run_arms(
        cfg, [ArmSpec.parse("never-drop")], list(range(2 * K * BLOCK)), progress=False
    )
    return {r.seed: to_run(r) for r in results["never-drop"]}


def aa_pairs(runs):
    """K pairs of disjoint seed blocks, the second relabelled onto the first's seeds."""
    for k in range(K):
        a0, b0 = 2 * k * BLOCK, (2 * k + 1) * BLOCK
        yield (
            {i: runs[a0 + i] for i in range(BLOCK)},
            {i: runs[b0 + i] for i in range(BLOCK)},
        )


def test_aa_on_simulated_runs_declares_a_difference_at_most_at_the_nominal_rate(never_drop_runs):
    _, hi = binomial_band(K, ALPHA)
    total = 0
    for name, value in QUANTITIES:
        verdicts = [
            compare(a, b, name=name, expects="higher", window="", value=value).verdict
            for a, b in aa_pairs(never_drop_runs)
        ]
        declared = sum(v in DECLARED for v in verdicts)
        assert declared <= hi, f"{name}: {declared}/{K} A/A comparisons declared a difference"
        total += declared
    # Pooled over the quantities (correlated within a block pair): reported, same bound scaled.
    assert total <= binomial_band(K * len(QUANTITIES), ALPHA)[1]
