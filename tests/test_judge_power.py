"""``rescue power``: what a seed budget can decide, computed through the judge's own code.

- The shortcut is the judge: a check judged again on its own per-seed values gives its
  verdict, estimate, margin and p-value; a replicate's first n seeds give the verdicts
  ``rescue report``'s judge gives the runs of those n seeds (family-wise rule included);
  an effect planted in the per-seed values gives the verdicts of the same effect planted
  in the runs' rows.
- Known answers: one check alone finds an effect of e σ at n seeds as often as the
  noncentral t says, and declares a difference with no effect at the 5% level (binomial
  bands); below three seeds nothing is decided.
- Refusals name the predictions the arms compare.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from scipy import stats as sps

from rescue import cli
from rescue.judge import power as pw
from rescue.judge.checks import rejudge
from rescue.judge.report import judge
from rescue.judge.runs import Run
from rescue.judge.stats import AS_PREDICTED, LEVEL, OPPOSITE

Q2 = ["zero", "mask", "matched", "survivor", "turn"]
Q3 = ["drop", "never-drop", "protect:0.5"]


def replicate(arms, seed=0, seeds=6):
    return pw.null_runs([pw.arm_label(a) for a in arms], np.random.default_rng(seed), seeds)


def band(n: int, p: float, q: float = 0.999) -> tuple[float, float]:
    return sps.binom.ppf((1 - q) / 2, n, p) / n, sps.binom.ppf(1 - (1 - q) / 2, n, p) / n


@pytest.mark.parametrize("arms", [Q2, Q3], ids=["q2", "q3"])
def test_a_check_judged_again_on_its_own_values_is_the_same_check(arms):
    results = pw.judged_results(replicate(arms, seed=1))
    seen = 0
    for r in results:
        for c in r.checks:
            if c.margin_rule == "not a comparison" and list(c.values) != ["per seed"]:
                continue  # not made by compare or per_seed (P6's variance ratio)
            again = rejudge(c, c.values)
            assert (again.verdict, again.estimate, again.p) == (c.alone, c.estimate, c.p)
            assert again.margin == c.margin or (np.isnan(again.margin) and np.isnan(c.margin))
            seen += 1
    assert seen >= 5


@pytest.mark.parametrize("arms", [Q2, Q3], ids=["q2", "q3"])
@pytest.mark.parametrize("n", [3, 4])
def test_the_first_n_seeds_of_a_replicate_are_the_report_of_n_seeds(arms, n):
    runs = replicate(arms, seed=2)
    results = pw.judged_results(runs)
    short = [r for r in runs if r.seed < n]
    j = judge(short, predictions=pw.JUDGED)
    direct = {r.prediction.id: (r.verdict, r.alone) for c in j.cohorts for r in c.results
              if r.prediction.id in pw.PLANTS}  # fmt: skip
    assert direct and pw.verdicts(results, n) == {k: direct[k] for k in pw.verdicts(results, n)}


def _rows_plus(run: Run, key: str, amount) -> Run:
    rows = copy.deepcopy(run.rows)
    for i, row in enumerate(rows):
        row[key] += amount(i, row, run.rows)
    return Run(run.condition, run.seed, rows, run.source)


def _prior_b(i: int, rows) -> float:
    """b pooled over the ``B_SMOOTH`` rows before row i (equal rollouts per row), written
    out here: the x axis P3's trend is read against (0 at the first row, never read)."""
    from rescue.judge.quantities import B_SMOOTH

    before = rows[max(0, i - B_SMOOTH) : i]
    return float(np.mean([r[pw.C + "b_all"] for r in before])) if before else 0.0


@pytest.mark.parametrize(
    "pid, arms, label, key, amount, shift",
    [
        # P3: the mask's cap-hit rate + c·(prior b) raises its trend against b by exactly c
        ("P3", Q2, "mask", pw.G + "cap_hit_rate",
         lambda i, row, rows: 0.02 * _prior_b(i, rows), lambda k: 0.02),
        # P4: the survivor's cap-hit rate + c·step/100 raises its drift per 100 steps by c
        ("P4", Q2, "survivor", pw.G + "cap_hit_rate", lambda i, row, rows: 0.03 * i / 100,
         lambda k: 0.03),
        # P5: the drop arm's turns of successes − 0.4 over the run
        ("P5", Q3, "drop", pw.G + "turns_mean/solved", lambda i, row, rows: -0.4,
         lambda k: -0.4 if k == 0 else 0.0),
    ],
)  # fmt: skip
def test_an_effect_in_the_per_seed_values_is_the_same_effect_in_the_rows(
    pid, arms, label, key, amount, shift
):
    n = 5
    runs = replicate(arms, seed=3, seeds=n)
    results = pw.judged_results(runs)
    planted = [_rows_plus(r, key, amount) if r.label == label else r for r in runs]
    if pid == "P3":  # a cap-hit rate is a count too: keep the generated counts consistent
        planted = [_counts_follow_rate(r) if r.label == label else r for r in planted]
    j = judge(planted, predictions=pw.JUDGED)
    direct = {r.prediction.id: (r.verdict, r.alone) for c in j.cohorts for r in c.results}
    shortcut = pw.verdicts(results, n, pid, lambda r, k, c: shift(k))
    assert shortcut[pid] == direct[pid]
    # and the estimates themselves moved by the planted amount
    d = next(r for c in j.cohorts for r in c.results if r.prediction.id == pid)
    base = next(r for r in results if r.prediction.id == pid)
    first = next(c for c in d.checks if c.decides)
    was = next(c for c in base.checks if c.decides)
    sign = 1.0 if first.name.split(", ")[-1].startswith(label) else -1.0
    assert first.estimate.value - was.estimate.value == pytest.approx(sign * shift(0), abs=1e-9)


def _counts_follow_rate(run: Run) -> Run:
    rows = copy.deepcopy(run.rows)
    for row in rows:
        row[pw.G + "outcome/budget_failure"] = row[pw.G + "cap_hit_rate"] * pw.ROLLOUTS
    return Run(run.condition, run.seed, rows, run.source)


def test_one_check_alone_finds_an_effect_as_often_as_the_noncentral_t_says():
    n, e, reps = 5, 1.5, 400
    p = pw.power(["survivor", "mask"], seeds=(n,), effects=(e,), replicates=reps, seed=7)
    assert p.predictions == ["P4"]  # one check: the rule over a family of one is the check
    crit = sps.t.ppf(0.5 + LEVEL / 2, n - 1)
    expected = sps.nct.sf(crit, n - 1, e * np.sqrt(n))
    lo, hi = band(reps, expected)
    rule, alone = p.decisive["P4"][n][e]
    assert rule == alone and lo <= alone <= hi, (alone, expected)
    lo, hi = band(reps, 1 - LEVEL)
    assert lo <= p.false["P4"][n][0.0][1] <= hi  # a difference declared with none: 5%


def test_below_three_seeds_nothing_is_decided():
    p = pw.power(Q2, seeds=(2,), effects=(3.0,), replicates=5)
    for pid in p.predictions:
        for e in p.effects:
            assert p.decisive[pid][2][e] == (0.0, 0.0) and p.false[pid][2][e] == (0.0, 0.0)
    assert "decides nothing" in pw.line(p, 2)


def test_the_truth_and_the_false_claims_of_each_kind_of_prediction():
    assert pw.truth("P3", 1.0) == AS_PREDICTED and pw.truth("P3", 0.0) == "no difference"
    assert pw.truth("P6", 1.0) == OPPOSITE and pw.truth("P6", 0.0) == AS_PREDICTED
    assert pw.is_false("P3", 0.0, OPPOSITE) and pw.is_false("P3", 0.0, AS_PREDICTED)
    assert not pw.is_false("P3", 1.0, "no difference")  # can be true of a small effect
    assert pw.is_false("P7 online", 1.0, AS_PREDICTED) and not pw.is_false("P6", 0.0, AS_PREDICTED)


def test_refusal_names_the_predictions_the_arms_compare():
    assert "P3" in pw.refusal(["zero", "mask"], 2) and "fewer than 3" in pw.refusal(
        ["zero", "mask"], 2
    )
    assert pw.refusal(["zero", "mask"], 3) is None
    assert pw.refusal(["drgrpo-mask"], 1) is None  # no prediction compares it alone
    why = pw.refusal(["drop", "never-drop", "protect:0.5", "pace"], 2)
    assert "P5" in why and "P6" in why


def test_the_command_refuses_a_seed_count_that_decides_nothing(capsys):
    assert cli.main(["power", "--arms", "zero,mask", "--seeds", "2", "--gate", "--line",
                     "--no-progress", "--replicates", "3"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "P3" in err and "SEEDS" in err and "FORCE=1" in err
    assert cli.main(["power", "--arms", "zero,mask", "--seeds", "2", "--gate", "--force",
                     "--line", "--no-progress", "--replicates", "3"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert "decides nothing" in out.out and "FORCE=1" in out.err


@pytest.mark.parametrize(
    "argv, named",
    [(["--seeds", "11"], "--seeds"), (["--effects", "0"], "--effects"),
     (["--seeds", "2-4", "--line"], "--line"), (["--replicates", "1"], "--replicates"),
     (["--arms", "zero,bogus"], "'bogus' is not an arm"),
     (["--arms", "protect:x,never-drop"], "'protect:x' is not an arm")],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_flag(capsys, argv, named):
    assert cli.main(["power", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "allowed" in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_the_json_file_is_written_where_asked_and_an_unwritable_place_refused_first(
    tmp_path, capsys, monkeypatch
):
    from rescue.judge import power as pw

    target = tmp_path / "missing" / "dir" / "p.json"
    assert cli.main(["power", "--arms", "zero,mask", "--seeds", "3", "--line", "--no-progress",
                     "--replicates", "3", "--json", str(target)]) == 0  # fmt: skip
    assert json.loads(target.read_text())["--arms"]["arms"] == ["zero", "mask"]
    (tmp_path / "a-file").write_text("")
    ran = []
    monkeypatch.setattr(pw, "power", lambda *a, **k: ran.append(1))
    assert cli.main(["power", "--no-progress", "--json", str(tmp_path / "a-file" / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and "cannot write" in err and err.count("\n") == 1
    assert ran == []  # refused before anything was computed
