"""The family-wise rule: Holm's step-down over the deciding checks of one report.

Specification
-------------
A report (``rescue report``'s, or the summaries of one ``rescue sim`` run, every scenario
of ``make demo`` together) makes a claim with each deciding check of each prediction
(``as predicted``, ``opposite`` or ``no difference``; ``stats.CLAIMS``), each at
``LEVEL``. Judged alone, each check is wrong about 5% of the time when the arms do not
differ, so a report of K such checks makes about 0.05 × K false claims even when no
effect is real. The family is every deciding check of a prediction that tested something
(an interval on enough replicates, whatever its verdict; a check that is ``not
judgeable``, lacks a key or has too few seeds tested nothing); reported comparisons and the
checks judged beside a prediction (``decides`` false) are not in it and stay unadjusted.

Rule (Holm 1979): order the family's K checks by the p-value of the claim each makes
(``stats.claim_p``; a check that claims nothing has p = 1), smallest first; the i-th
(from 0) keeps its claim while its p is at most ``α / (K − i)``, ``α = 1 − LEVEL``; from
the first that fails, no later claim is kept. A claim that is not kept becomes
``inconclusive``, its reason saying so; ``Check.alone`` keeps the verdict it had alone,
and each prediction's verdict is recombined from its adjusted checks (``Result.alone``
keeps the one before). Replicates that do not vary (an exact value) and P1's identity
have p = 0 and always keep their claim.

What it guarantees: when no effect is real, the chance that the report makes any false
claim is at most α whatever the dependence between the checks, and the expected number
of false claims is at most ``expected_bound(K)`` (α · Σ_j min(1, K / (j (K − j + 1))),
from Markov's inequality on the j-th smallest null p-value; about α for independent
checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rescue.judge.checks import Check
from rescue.judge.evaluation import Result, verdict_of
from rescue.judge.stats import CLAIMS, INCONCLUSIVE, LEVEL

ALPHA = 1 - LEVEL
RULE = "Holm's step-down over the deciding checks of the report"


@dataclass
class Family:
    """What the family-wise rule did to one report.

    Attributes:
        size: K, the deciding checks in the family.
        claims: checks that made a claim alone.
        kept: claims kept by the rule.
        withdrawn: the names of the checks whose claim was withdrawn.
    """

    size: int
    claims: int
    kept: int
    withdrawn: list[str]

    @property
    def expected_alone(self) -> float:
        """False claims expected with no real effect if each check were judged alone."""
        return ALPHA * self.size

    def lines(self) -> list[str]:
        """The rule and what it did, for the top of a report."""
        if not self.size:
            return [f"Family-wise rule: {RULE} (α = {ALPHA:g}); no deciding check tested anything."]
        out = (
            f"Family-wise rule: {RULE}, α = {ALPHA:g}: the {self.size} deciding checks "
            "that tested something are one family; each claim (as predicted, opposite, no "
            "difference) is kept only while its p-value, smallest first, is at most "
            f"α / (checks left). If no effect were real, judged alone at {LEVEL:.0%} they "
            f"would make {self.expected_alone:.2g} false claims on average; under the rule "
            f"the chance of any is at most {ALPHA:g} and the expected number at most "
            f"{expected_bound(self.size):.2g} (about {ALPHA:g} for independent checks). "
            f"Here {self.claims} checks made a claim alone and {self.kept} keep it"
        )
        if self.withdrawn:
            out += "; withdrawn: " + "; ".join(self.withdrawn)
        return [out + "."]


def expected_bound(k: int, alpha: float = ALPHA) -> float:
    """Bound on the expected number of false claims under Holm with ``k`` true nulls."""
    j = np.arange(1, k + 1)
    return float(alpha * np.minimum(1.0, k / (j * (k - j + 1))).sum()) if k else 0.0


def members(results: Sequence[Result]) -> list[Check]:
    """The deciding checks of the predictions in ``results`` that tested something."""
    out = []
    for r in results:
        if not r.prediction.prediction:
            continue
        for c in r.checks:
            if c.decides and c.expects is not None and _tested(c):
                out.append(c)
    return out


def _tested(c: Check) -> bool:
    e = c.estimate
    if e is None:
        return False
    return c.alone in CLAIMS or (e.finite and e.n >= 2)


def holm(results: Sequence[Result]) -> Family:
    """Apply the rule to every deciding check of ``results`` (in place); see the module."""
    family = members(results)
    for c in family:
        if c.alone is None:
            c.alone = c.verdict
    order = sorted(family, key=lambda c: _p(c))
    k = len(order)
    withdrawn: list[str] = []
    failed = False
    for i, c in enumerate(order):
        if c.alone not in CLAIMS:
            failed = True  # p = 1: nothing after it is kept
            continue
        bar = ALPHA / (k - i)
        if not failed and _p(c) <= bar:
            continue
        failed = True
        c.verdict = INCONCLUSIVE
        c.reason = (
            f"{c.alone} alone (p = {_p(c):.3g}); not kept by the family-wise rule: "
            f"p > α / {k - i} = {bar:.3g}"
            if _p(c) > bar
            else f"{c.alone} alone (p = {_p(c):.3g}); not kept by the family-wise rule: an "
            "earlier check in the order was not kept"
        )
        withdrawn.append(f"{c.name} ({c.alone}, p = {_p(c):.3g})")
    for r in results:
        if r.prediction.prediction and r.checks:
            r.verdict = verdict_of(r.prediction, r.checks)
    claims = sum(c.alone in CLAIMS for c in family)
    return Family(k, claims, claims - len(withdrawn), withdrawn)


def _p(c: Check) -> float:
    if c.alone not in CLAIMS:
        return 1.0
    return float(c.p) if np.isfinite(c.p) else 0.0
