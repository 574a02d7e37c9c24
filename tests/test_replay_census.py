"""`rescue replay census` and `advantages`: per-step and total outcome counts, the regime."""

import json
import math
import statistics

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_advantages import reference_turn_reached  # noqa: E402

from rescue.cli import main  # noqa: E402
from rescue.replay.census import census_report, dominant_regime, regime_line  # noqa: E402
from rescue.replay.dumps import load_dumps  # noqa: E402
from rescue.replay.synthetic import synthetic_step  # noqa: E402


@pytest.fixture
def dumps(tmp_path):
    for step in range(3):
        payload = synthetic_step(
            rollout_id=step, seed=10 + step, p_abort=0.1, first_group=10 * step
        )
        torch.save(payload, tmp_path / f"rollout_{step}.pt")
    return str(tmp_path / "rollout_*.pt")


def test_census_counts_every_rollout_per_step_and_in_total(dumps):
    loaded = load_dumps([dumps])
    report = census_report(loaded)
    total = report["total"]["metrics"]
    assert total["rollouts"] == 48
    by_status = {"completed": 0, "truncated": 0, "aborted": 0}
    for d in loaded:
        for s in d.samples:
            by_status[s["status"]] += 1
    assert total["outcome/budget_failure"] == by_status["truncated"]
    assert total["outcome/infra_no_result"] == by_status["aborted"]
    assert total["outcome/solved"] + total["outcome/submitted_failure"] == by_status["completed"]
    assert [s["metrics"]["rollouts"] for s in report["steps"]] == [16, 16, 16]
    for key in ("outcome/solved", "outcome/budget_failure"):
        assert sum(s["metrics"][key] for s in report["steps"]) == total[key]


def test_regime_names_the_larger_of_budget_and_infra():
    m = {"rollouts": 10, "outcome/solved": 4, "outcome/submitted_failure": 1,
         "outcome/budget_failure": 4, "outcome/infra_no_result": 1}  # fmt: skip
    r = dominant_regime(m)
    assert r["regime"] == "budget" and r["budget_share"] == pytest.approx(4 / 6)
    m["outcome/infra_no_result"] = 5
    m["outcome/budget_failure"] = 0
    assert dominant_regime(m)["regime"] == "infrastructure"
    m["outcome/infra_no_result"] = 0
    assert dominant_regime(m)["regime"] == "none"


def _regime(solved, submitted, budget, infra):
    m = {"rollouts": solved + submitted + budget + infra, "outcome/solved": solved,
         "outcome/submitted_failure": submitted, "outcome/budget_failure": budget,
         "outcome/infra_no_result": infra}  # fmt: skip
    return dominant_regime(m)


def test_the_regime_line_says_dominates_only_when_it_is_more_than_half():
    """24% budget failures outnumber 5% no-results but do not dominate the non-solved mass."""
    line = regime_line(_regime(solved=10, submitted=71, budget=24, infra=5))
    assert "dominate" not in line
    assert line == (
        "regime: budget; budget failures outnumber infrastructure no-results but are 24.0% of "
        "the non-solved mass (100 rollouts), whose largest part is submitted failures: budget "
        "failures 24.0%, infrastructure no-results 5.0%, submitted failures 71.0%"
    )
    line = regime_line(_regime(solved=10, submitted=30, budget=60, infra=10))
    assert line.startswith("regime: budget; budget failures dominate the non-solved mass (100")
    line = regime_line(_regime(solved=0, submitted=1, budget=2, infra=7))
    assert line.startswith("regime: infrastructure; infrastructure no-results dominate")
    line = regime_line(_regime(solved=0, submitted=50, budget=50, infra=0))
    assert line.startswith("regime: budget; budget failures outnumber")  # exactly half
    assert regime_line(_regime(solved=0, submitted=4, budget=3, infra=3)).startswith(
        "regime: tie; budget failures and infrastructure no-results are equal"
    )
    assert regime_line(_regime(solved=3, submitted=2, budget=0, infra=0)).startswith("regime: none")


def test_cli_census_prints_table_and_regime(dumps, capsys):
    assert main(["replay", "census", dumps]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "regime:" in out
    total = census_report(load_dumps([dumps]))["total"]["regime"]
    assert regime_line(total) in out
    assert main(["replay", "census", dumps, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["metrics"]["rollouts"] == 48


def arm_variances_by_hand(pattern: str, kappa: float = 2.0, eps: float = 1e-6):
    """Var over loss tokens of arm (a) and arm (e), GRPO std on, written as loops."""
    a_values, e_values = [], []
    for d in load_dumps([pattern]):
        groups: dict = {}
        for t in d.trajectories:
            if t.reward is not None and math.isfinite(t.reward):
                groups.setdefault(t.group, []).append(t)
        for members in groups.values():
            R0 = [0.0 if t.capped else t.reward for t in members]
            sigma = statistics.stdev(R0) if len(R0) > 1 else 0.0
            c = 1.0 / (sigma + eps) if sigma > 0 else 1.0
            mean = sum(R0) / len(R0)
            b = reference_turn_reached(R0, [t.turns for t in members], kappa)
            for i, t in enumerate(members):
                for ell in np.concatenate(t.token_turns):
                    if ell > 0:
                        a_values.append((R0[i] - mean) * c)
                        e_values.append((R0[i] - b[i, ell - 1]) * c)
    return float(np.var(a_values)), float(np.var(e_values))


def test_cli_advantages_prints_verdict_and_honours_flags(dumps, capsys):
    assert main(["replay", "advantages", dumps, "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    total = default["total"]
    var_a, var_e = arm_variances_by_hand(dumps)
    assert total["var_a"] == pytest.approx(var_a, rel=1e-6)
    assert total["var_e"] == pytest.approx(var_e, rel=1e-6)
    assert total["reduction"] == pytest.approx(1 - var_e / var_a, rel=1e-6)
    # On these dumps the turn-reached baseline raises the variance: P7 is falsified.
    assert 1 - var_e / var_a < 0 and total["verdict"] == "opposite"
    assert set(default["arms"]) == {"a", "b", "c", "d0.3", "d0.6", "d1", "e"}
    assert main(["replay", "advantages", dumps, "--json", "--no-std-normalize", "--kappa", "0",
                 "--rho", "0.5", "--seed", "3"]) == 0  # fmt: skip
    other = json.loads(capsys.readouterr().out)
    assert set(other["arms"]) == {"a", "b", "c", "d0.5", "e"}
    assert other["total"]["var_a"] != default["total"]["var_a"]  # std normalization off
    assert other["total"]["var_e"] != default["total"]["var_e"]
    assert main(["replay", "advantages", dumps]) == 0
    assert "P7" in capsys.readouterr().out


def test_cli_bad_input_is_one_clear_error(tmp_path, capsys):
    assert main(["replay", "census", str(tmp_path / "nothing_*.pt")]) == 2
    assert "matches no file" in capsys.readouterr().err
