"""The masked-update identity by exact enumeration (rescue.identity) and `rescue identity`."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rescue import identity as idn
from rescue.cli import main as cli

# ----------------------------------------------------------------- the worked examples


def test_fast_thorough_numbers():
    t = idn.fast_thorough()
    # the ∂/∂θ_thorough column is d/dθ with p = sigmoid(θ); ∂/∂θ_fast is its negative
    assert idn.gradient(t)[1] == pytest.approx(0.075, abs=1e-12)
    assert idn.ipw_estimate(t)[1] == pytest.approx(0.075, abs=1e-12)
    assert round(idn.survivor_estimate(t)[1], 3) == -0.017
    assert np.allclose(idn.gradient(t), [-0.075, 0.075])


def test_fast_thorough_survivor_estimate_in_exact_arithmetic():
    """The same number from fractions: rows (π, R, κ, dlogπ/dθ) at p = 1/2."""
    h = Fraction(1, 2)
    rows = [
        (h * Fraction(6, 10), 1, 1, -h),
        (h * Fraction(4, 10), 0, 1, -h),
        (h * Fraction(9, 10), 1, Fraction(1, 10), h),
        (h * Fraction(1, 10), 0, 1, h),
    ]
    P = sum(p * k for p, _, k, _ in rows)
    b_s = sum(p * k * r for p, r, k, _ in rows) / P
    est = sum(p * k * (r - b_s) * s for p, r, k, s in rows) / P
    assert float(est) == pytest.approx(idn.survivor_estimate(idn.fast_thorough())[1], abs=1e-15)
    assert float(est) == pytest.approx(-0.016948, abs=1e-6)


def test_fast_thorough_without_the_drop_has_no_sign_flip():
    t = idn.fast_thorough(keep_late=1.0)
    assert np.allclose(idn.survivor_estimate(t), idn.gradient(t))


def test_two_outcome_masked_all_is_one_minus_J_times_grad_J_and_survivors_is_zero():
    for t in idn.two_outcome():
        J = idn.objective(t)
        assert np.allclose(
            idn.masked_update(t, "all"), (1 - J) * idn.gradient(t), atol=1e-12, rtol=0
        )
        assert np.all(idn.masked_update(t, "survivors") == 0.0)


def test_gradient_matches_finite_differences():
    t = idn.Table.from_dict(
        {
            "theta": [0.3, -0.2, 1.1],
            "rows": [
                {"action": 0, "q": 0.5, "reward": 2.0},
                {"action": 0, "q": 0.5, "reward": -1.0},
                {"action": 1, "reward": 0.5},
                {"action": 2, "q": 0.25, "reward": 3.0},
                {"action": 2, "q": 0.75, "reward": 0.0},
            ],
        }
    )
    h = 1e-6
    fd = []
    for a in range(3):
        up, down = t.theta.copy(), t.theta.copy()
        up[a] += h
        down[a] -= h
        J = [idn.objective(idn.Table(**{**t.__dict__, "theta": th})) for th in (up, down)]
        fd.append((J[0] - J[1]) / (2 * h))
    assert np.allclose(idn.gradient(t), fd, atol=1e-8)


# ----------------------------------------------------------------- the estimators' edges


def _table(rows, theta=None):
    theta = [0.0] * len(rows) if theta is None else theta
    return idn.Table.from_dict({"theta": theta, "rows": rows})


def test_ipw_refuses_a_never_kept_row_with_mass_and_names_it():
    t = _table([{"reward": 1, "name": "solved"}, {"reward": 0, "keep": 0, "name": "capped"}])
    with pytest.raises(ValueError, match="'capped' has keep probability 0"):
        idn.ipw_estimate(t)
    r = idn.report(t)
    assert r["ipw"] is None and "capped" in r["ipw_error"]


def test_ipw_accepts_a_never_kept_row_without_mass():
    t = idn.Table.from_dict(
        {
            "theta": [0.0, 0.0],
            "rows": [
                {"action": 0, "q": 1.0, "reward": 1},
                {"action": 0, "q": 0.0, "reward": 5, "keep": 0},
                {"action": 1, "reward": 0, "keep": 0.5},
            ],
        }
    )
    assert np.allclose(idn.ipw_estimate(t), idn.gradient(t))


def test_nothing_kept_gives_zero_survivor_estimate():
    t = _table([{"reward": 1, "keep": 0}, {"reward": 0, "keep": 0}])
    assert idn.kept_mass(t) == 0.0
    assert np.all(idn.survivor_estimate(t) == 0.0)


def test_masked_update_baseline_choice_is_checked():
    with pytest.raises(ValueError, match="all, survivors"):
        idn.masked_update(idn.fast_thorough(), "loo")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"rows": []}, "theta"),
        ({"theta": [0.0], "rows": []}, "at least one row"),
        ({"theta": [0.0], "rows": [{"q": 0.5, "reward": 1}]}, "summing to 0.5"),
        ({"theta": [0.0, 0.0], "rows": [{"action": 0, "reward": 1}]}, "action '1'"),
        ({"theta": [0.0], "rows": [{"action": "x", "reward": 1}]}, "action='x'"),
        ({"theta": [0.0], "rows": [{"keep": 1}]}, 'needs "reward"'),
        ({"theta": [0.0], "rows": [{"reward": "a lot"}]}, "reward='a lot'"),
        ({"theta": [0.0], "rows": [{"reward": 1, "keep": 1.5}]}, "keep must be"),
        ({"theta": [float("nan")], "rows": [{"reward": 1}]}, "theta"),
        ({"theta": [0.0], "actions": ["a", "b"], "rows": [{"reward": 1}]}, "actions"),
        ({"theta": [0.0], "rows": [3]}, "rows\\[0\\]"),
    ],
)
def test_bad_tables_are_refused_with_the_field_named(table, message):
    with pytest.raises(ValueError, match=message):
        idn.Table.from_dict(table)


# ----------------------------------------------------------------- properties


@st.composite
def tables(draw, keep_min=0.0, excluded_score_zero=False):
    A = draw(st.integers(1, 4))
    theta = draw(st.lists(st.floats(-3, 3), min_size=A, max_size=A))
    rows = []
    for a in range(A):
        m = draw(st.integers(1, 3))
        q = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=m, max_size=m)))
        q = q / q.sum()
        for k in range(m):
            keep = draw(st.floats(keep_min, 1.0))
            reward = draw(st.floats(-5, 5))
            if excluded_score_zero:
                keep = draw(st.sampled_from([0.0, 0.3, 1.0]))
                reward = reward if keep == 1.0 else 0.0
            rows.append({"action": a, "q": float(q[k]), "reward": reward, "keep": keep})
    return idn.Table.from_dict({"theta": theta, "rows": rows})


@settings(max_examples=80, deadline=None)
@given(tables(keep_min=1e-3))
def test_property_ipw_equals_the_true_gradient(t):
    """(ii) with every keep probability > 0, IPW is ∇J exactly (up to rounding)."""
    assert np.allclose(idn.ipw_estimate(t), idn.gradient(t), atol=1e-9, rtol=1e-9)


def _fd(t: idn.Table, per_row, h: float = 1e-6) -> np.ndarray:
    """∇θ Σ_k π_k(θ) · per_row_k by central differences, π written out here: it shares no
    code with rescue.identity's score or expectation."""

    def total(theta: np.ndarray) -> float:
        p = np.exp(theta - theta.max())
        return float((p[t.action] / p.sum() * t.q) @ per_row)

    out = []
    for a in range(t.theta.size):
        up, down = t.theta.copy(), t.theta.copy()
        up[a] += h
        down[a] -= h
        out.append((total(up) - total(down)) / (2 * h))
    return np.array(out)


@settings(max_examples=80, deadline=None)
@given(tables(excluded_score_zero=True))
def test_property_masked_update_pays_excluded_rows_the_baseline(t):
    """(iii) excluded rows score 0 ⇒ masked(b = J) = ∇J + b·∇P(¬X), right side by differences."""
    b = idn.objective(t)
    want = _fd(t, t.reward) + b * _fd(t, 1.0 - t.keep)
    assert np.allclose(idn.masked_update(t, "all"), want, atol=1e-7, rtol=0)


@settings(max_examples=40, deadline=None)
@given(tables())
def test_property_general_identity_holds_on_any_table(t):
    """masked(b) = ∇E[R·1{X}] − b·∇P(X) for any keep probabilities and rewards, b = J; the
    right side by differences of E[R·1{X}] and P(X)."""
    b = idn.objective(t)
    want = _fd(t, t.keep * t.reward) - b * _fd(t, t.keep)
    assert np.allclose(idn.masked_update(t, "all"), want, atol=1e-7, rtol=0)
    assert idn.report(t)["identity_residual"] < 1e-12


# ----------------------------------------------------------------- the command


def test_plain_command_prints_both_examples(capsys):
    assert cli(["identity"]) == 0
    out = capsys.readouterr().out
    assert "#### two-outcome" in out and "#### fast-thorough" in out
    assert "∇J = +0.075, survivor estimate = -0.017, IPW = +0.075" in out


def test_named_example_json(capsys):
    assert cli(["identity", "fast-thorough", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["fast-thorough"]
    d = data["fast-thorough"]["d_dtheta"]
    assert round(d["grad_J"], 3) == 0.075
    assert round(d["survivor_estimate"], 3) == -0.017
    assert round(d["ipw"], 3) == 0.075


def test_two_outcome_json_checks(capsys):
    assert cli(["identity", "two-outcome", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["two-outcome"]
    assert len(data["tables"]) == 3
    for r in data["tables"]:
        assert r["two_outcome_residual"] < 1e-12
        assert max(abs(x) for x in r["masked_survivors"]) == 0.0
    assert all(r["ipw"] is None for r in data["tables"])  # deterministic masks: refused


def test_table_file(tmp_path, capsys):
    tables = [
        {"name": "p1", "theta": [0.0, 1.0], "rows": [{"reward": 1}, {"reward": 0, "keep": 0.5}]},
        {"name": "p2", "theta": [0.5], "rows": [{"reward": 2}]},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tables))
    assert cli(["identity", "--table", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)[str(path)]
    assert [r["name"] for r in data["tables"]] == ["p1", "p2"]
    assert np.allclose(data["tables"][0]["ipw"], data["tables"][0]["grad_J"])
    assert cli(["identity", "--table", str(path)]) == 0
    assert "== p1" in capsys.readouterr().out


def test_bad_table_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"theta": [0.0], "rows": [{"reward": 1, "keep": 2}]}))
    assert cli(["identity", "--table", str(path)]) == 2
    assert "keep must be" in capsys.readouterr().err
    assert cli(["identity", "--table", str(tmp_path / "missing.json")]) == 2
    assert cli(["identity", "fast-thorough", "--table", str(path)]) == 2


def test_a_table_action_is_an_index_when_an_integer_and_a_name_when_a_string(tmp_path, capsys):
    """Names "1", "0": the integer 0 is action 0 (named "1"); the string "0" is action 1."""
    table = {
        "actions": ["1", "0"],
        "theta": [2.0, 0.0],
        "rows": [{"action": 0, "reward": 1.0}, {"action": "0", "reward": 0.0}],
    }
    assert idn.Table.from_dict(table).action.tolist() == [0, 1]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    assert cli(["identity", "--table", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[str(path)]["tables"][0]
    p0 = math.exp(2.0) / (math.exp(2.0) + 1.0)  # softmax(theta)[0]: J = p0 * 1 + (1 - p0) * 0
    assert report["J"] == pytest.approx(p0, abs=1e-12)
    for bad in (True, 2, "2", 1.0):
        with pytest.raises(ValueError, match=r"rows\[0\]\.action"):
            idn.Table.from_dict({**table, "rows": [{"action": bad, "reward": 1.0}]})
