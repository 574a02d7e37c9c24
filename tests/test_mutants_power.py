"""``rescue.judge.power`` against references that do not go through its own code.

- The truth and the false claims: every (plant, no effect / an effect, verdict, with or
  without the step-size control) case written out by hand from the module docstring.
- A replicate's rows: each quantity's level plus the generator's normals, the keys spelled
  out here; the judge's results kept: the predictions that have checks, nothing else.
- The plant: σ recomputed here from the judge's own per-seed values of the same replicates
  (``report.judge`` on the runs the null returned); each deciding check moved by sign·e·σ
  (P5 each check its own σ; P6 and P7 online a further margin of the first n seeds), the
  per-seed values the judge re-judges read back (only the plant's roles moved, only the
  first n seeds), and the first n seeds of a replicate where the family-wise rule withdraws
  a claim judged by the judge directly.
- The tally: a scripted judge (verdicts fixed by hand per replicate and plant) and every
  share counted by hand; the null's seed count, the progress calls and the draws recorded.
- What is printed: ``arm_label``, ``compared``, ``refusal``, ``seeds_needed``, ``needs``,
  ``line``, ``markdown`` and ``as_json`` of small hand-built ``Power`` tables, whole lines.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from rescue.errors import InputError
from rescue.judge import power as pw
from rescue.judge.checks import Check, rejudge
from rescue.judge.report import judge
from rescue.judge.runs import ARM_NAMES, Run, parse_name

AS, OPP, ND, INC = "as predicted", "opposite", "no difference", "inconclusive"
DIFFERENCES = ("P3", "P3 direction", "P3 step size", "P4", "P5")
EQUIVALENCES = ("P6", "P7 online")


# ---------------------------------------------------------------- the truth, by hand


#: (plant, step-size control) -> the verdict an effect makes true (module docstring;
#: ``PLANTS``' comment: the direction plant is a falsified P3 only without the control).
TRUE_WITH_EFFECT = {
    ("P3", True): AS, ("P3", False): AS,
    ("P3 direction", True): AS, ("P3 direction", False): ND,
    ("P3 step size", True): ND, ("P3 step size", False): ND,
    ("P4", True): AS, ("P4", False): AS,
    ("P5", True): AS, ("P5", False): AS,
    ("P6", True): OPP, ("P6", False): OPP,
    ("P7 online", True): OPP, ("P7 online", False): OPP,
}  # fmt: skip
#: The verdicts each truth calls false (module docstring): with an effect, the opposite of
#: the truth (a claimed difference either way where the truth is no difference); with none,
#: a claimed difference for a difference and a claimed failure for an equivalence.
FALSE_WITH_EFFECT = {AS: {OPP}, OPP: {AS}, ND: {AS, OPP}}
FALSE_WITHOUT = {"difference": {AS, OPP}, "equivalence": {OPP}}


@pytest.mark.parametrize("step_control", [True, False])
@pytest.mark.parametrize("name", [*DIFFERENCES, *EQUIVALENCES])
def test_the_truth_and_every_false_claim_as_the_docstring_says(name, step_control):
    kind = "difference" if name in DIFFERENCES else "equivalence"
    for effect in (0.5, 1.0, 3.0):
        want = TRUE_WITH_EFFECT[(name, step_control)]
        assert pw.truth(name, effect, step_control) == want
        for verdict in (AS, OPP, ND, INC, "not judgeable", None):
            said = pw.is_false(name, effect, verdict, step_control)
            assert said is (verdict in FALSE_WITH_EFFECT[want]), (effect, verdict)
    no_effect = ND if kind == "difference" else AS
    assert pw.truth(name, 0.0, step_control) == no_effect
    for verdict in (AS, OPP, ND, INC, "not judgeable", None):
        said = pw.is_false(name, 0.0, verdict, step_control)
        assert said is (verdict in FALSE_WITHOUT[kind]), verdict
    if step_control:  # the default is a report with the step-size control
        assert pw.truth(name, 1.0) == want and pw.truth(name, 0.0) == no_effect
        assert [pw.is_false(name, 1.0, v) for v in (AS, OPP, ND)] == [
            v in FALSE_WITH_EFFECT[want] for v in (AS, OPP, ND)
        ]


# ---------------------------------------------------------------- arms and refusals


@pytest.mark.parametrize(
    "arm, label",
    [("zero", "zero"), (" drop ", "drop"), ("protect:0.5", "protect-a0.5"),
     ("protect:0.50", "protect-a0.5"), ("protect:1e-1", "protect-a0.1"), ("protect:2", "protect-a2"),
     ("step-control", "step-control")],
)  # fmt: skip
def test_an_arm_is_the_judges_label(arm, label):
    assert pw.arm_label(arm) == label


@pytest.mark.parametrize("arm", ["bogus", "protect:x", "", ":0.5"])
def test_an_arm_the_judge_does_not_know_is_refused_naming_the_allowed(arm):
    with pytest.raises(InputError) as e:
        pw.arm_label(arm)
    assert str(e.value) == (
        f"arm {arm!r} is not an arm; allowed: {', '.join(ARM_NAMES)} (protect:A with a number A)"
    )


@pytest.mark.parametrize(
    "arms, which",
    [(["zero", "mask"], ["P3", "control"]),
     (["turn", "mask", "zero", "survivor"], ["P3", "P4", "control", "P7 online"]),
     (["drop", "never-drop", "protect:0.5"], ["P5", "P6"]),
     (["pace", "protect:0.5"], []),  # protect vs pace is a comparison, not a prediction
     (["zero", "never-drop"], []),  # P7 offline: every role optional, reads no runs' arms
     (["protect:0.1", "never-drop"], [])],  # P6 requires protect at 0.5
)  # fmt: skip
def test_compared_is_the_predictions_whose_required_arms_are_all_there(arms, which):
    assert pw.compared(arms) == which


def test_a_refusal_is_one_sentence_naming_what_the_arms_compare():
    assert pw.refusal(["zero", "mask"], 2) == (
        "SEEDS=2: P3, control compare these arms, and the judge decides nothing on fewer "
        "than 3 paired seeds per arm"
    )
    assert pw.refusal(["drop", "never-drop"], 1) == (
        "SEEDS=1: P5 compares these arms, and the judge decides nothing on fewer than 3 "
        "paired seeds per arm"
    )
    assert pw.refusal(["zero", "mask"], 3) is None  # the judge's minimum decides
    assert pw.refusal(["pace", "protect:0.5"], 2) is None  # nothing to decide


# ---------------------------------------------------------------- a replicate


def test_a_replicate_is_each_quantity_at_its_level_plus_the_generators_noise():
    runs = pw.null_runs(["zero", "protect-a0.5"], np.random.default_rng(3), seeds=2)
    assert [(r.label, r.seed, r.source) for r in runs] == [
        ("zero", 0, "replicate zero seed 0"), ("zero", 1, "replicate zero seed 1"),
        ("protect-a0.5", 0, "replicate protect-a0.5 seed 0"),
        ("protect-a0.5", 1, "replicate protect-a0.5 seed 1"),
    ]  # fmt: skip
    assert [r.condition for r in runs] == [parse_name("zero")[0]] * 2 + [
        parse_name("protect-a0.5")[0]
    ] * 2
    draws = np.random.default_rng(3)  # six rows of 20 standard normals per run, in order
    g, c = "rollout/census/generated/", "rollout/census/"
    for run in runs:
        z = draws.normal(size=(6, 20))
        assert len(run.rows) == 20
        for i, row in enumerate(run.rows):
            solved, capped = 128 * (0.5 + 0.03 * z[0, i]), 128 * (0.2 + 0.03 * z[1, i])
            want = {
                "rollout/step": i, "sim/time": 10 * (i + 1),
                c + "rollouts": 128, c + "b_all": 0.35 + 0.3 * i / 19,  # b: 0.35 rising to 0.65
                g + "rollouts": 128, g + "outcome/solved": solved,
                g + "outcome/budget_failure": capped,
                g + "outcome/submitted_failure": 128 - solved - capped,
                g + "outcome/infra_no_result": 0, g + "cap_hit_rate": 0.2 + 0.03 * z[1, i],
                g + "turns_mean/solved": 6 + 0.5 * z[2, i],
                g + "turns_mean/submitted_failure": 10 + 0.5 * z[3, i],
                g + "turns_mean/budget_failure": 12 + 0.5 * z[4, i],
                g + "ran_tests_rate/solved": 0.8 + 0.03 * z[5, i],
            }  # fmt: skip
            assert row == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert all(isinstance(v, float) for v in row.values())
    assert len(pw.null_runs(["zero"], np.random.default_rng(0))) == 10  # MAX_SEEDS by default


def test_the_judges_results_are_the_predictions_with_checks():
    def kept(arms):
        runs = pw.null_runs([pw.arm_label(a) for a in arms], np.random.default_rng(0), 3)
        return [r.prediction.id for r in pw.judged_results(runs)]

    # the judge also returns P5, P6, P7 online, control without checks here
    assert kept(["zero", "mask", "survivor"]) == ["P3", "P4"]
    # protect vs pace has checks but is a comparison, not a prediction
    assert kept(["pace", "protect:0.5", "never-drop"]) == ["P6"]


def test_differences_are_arm_minus_reference_on_the_seeds_both_have_finite():
    check = Check(
        "x, a − b", "higher", "w",
        values={"a": {0: 3.0, 1: 5.0, 2: math.nan, 4: 1.0, 5: 2.0},
                "b": {0: 1.0, 1: 7.5, 2: 0.0, 3: 9.0, 5: math.inf},
                "c": {0: 100.0}},
    )  # fmt: skip
    assert pw.differences(check) == [2.0, -2.5]


# ---------------------------------------------------------------- the plant


Q2 = ["zero", "mask", "step-control", "survivor", "turn"]
Q3 = ["drop", "never-drop", "protect:0.5"]


def _deciding(result):
    return [c for c in result.checks if c.decides]


def _first(check, n):
    return {lab: {s: v for s, v in d.items() if s < n} for lab, d in check.values.items()}


def _recorded_null(seen):
    def null(labels, rng, seeds):
        runs = pw.null_runs(labels, rng, seeds)
        seen.append((tuple(labels), seeds, runs))
        return runs

    return null


def test_sigma_is_the_sd_of_the_deciding_differences_and_the_plant_moves_them_by_e_sigma(
    monkeypatch,
):
    seen, calls = [], []
    real = pw.verdicts

    def spy(results, n, plant=None, shift=None):
        if plant is not None:
            pid = pw.PLANTS[plant].pid
            r = next(x for x in results if x.prediction.id == pid)
            moved = [shift(r, k, c) for k, c in enumerate(_deciding(r))]
            calls.append((plant, n, r, moved, shift))
        return real(results, n, plant, shift)

    monkeypatch.setattr(pw, "verdicts", spy)
    done = []
    p = pw.power([*Q2, *Q3], seeds=(3, 4), effects=(1.0, 2.5), replicates=3, seed=4,
                 null=_recorded_null(seen), progress=done.append, noise="recorded")  # fmt: skip
    assert done == [1, 2, 3] and [s[1] for s in seen] == [4, 4, 4]
    assert seen[0][0] == ("zero", "mask", "step-control", "survivor", "turn", "drop",
                          "never-drop", "protect-a0.5")  # fmt: skip
    assert p.predictions == ["P3", "P3 step size", "P4", "P5", "P6", "P7 online"]
    assert (p.labels, p.replicates, p.seeds, p.effects, p.noise) == (
        seen[0][0],
        3,
        (3, 4),
        (0.0, 1.0, 2.5),
        "recorded",
    )
    # σ: the judge's per-seed differences (first arm − second) pooled over the replicates
    pooled: dict[str, list[list[float]]] = {}
    for _, _, runs in seen:
        j = judge(runs, predictions=pw.JUDGED)
        for r in (r for c in j.cohorts for r in c.results if r.checks and r.prediction.prediction):
            for k, c in enumerate(_deciding(r)):
                (_, a), (_, b) = list(c.values.items())[:2]
                per = pooled.setdefault(r.prediction.id, [])
                while len(per) <= k:
                    per.append([])
                per[k] += [a[s] - b[s] for s in a]
    sd = {pid: [float(np.std(d, ddof=1)) for d in per] for pid, per in pooled.items()}
    assert len(sd["P3"]) == 2 and len(sd["P5"]) == 2 and len(sd["P4"]) == 1
    want_sigma = {name: sd[pw.PLANTS[name].pid] for name in p.predictions}
    assert p.sigma.keys() == want_sigma.keys()
    for name, s in want_sigma.items():
        assert p.sigma[name] == pytest.approx(s, rel=1e-9)
    # the amounts: each deciding check by sign·e·σ (module docstring)
    assert len(calls) == 3 * 2 * 6 * 2
    # the calls of each replicate, seed count and plant: one per effect, in order
    for i, (plant, n, r, moved, _) in enumerate(calls):
        e = (1.0, 2.5)[i % 2]
        s = sd[r.prediction.id]
        checks = _deciding(r)
        if plant in ("P3", "P3 step size"):  # the mask's trend: both checks by the first σ
            want = [e * s[0], e * s[0]]
        elif plant == "P4":
            want = [e * s[0]]
        elif plant == "P5":  # successes' turns down, failures' up, each by its own σ
            want = [-e * s[0], e * s[1]]
        else:  # the protect / turn arm's final success: a shortfall of e σ beyond the margin
            margin = rejudge(checks[0], _first(checks[0], n)).margin
            assert np.isfinite(margin) and margin > 0
            want = [-(e * s[0] + margin)]
        assert moved == pytest.approx(want, rel=1e-9), (plant, n, e)


def test_a_plant_moves_only_its_roles_values_and_only_the_first_n_seeds(monkeypatch):
    runs = pw.null_runs([pw.arm_label(a) for a in ["zero", "mask", "matched", *Q3]],
                        np.random.default_rng(6), 5)  # fmt: skip
    results = pw.judged_results(runs)
    judged = []
    real = pw.rejudge

    def spy(check, values):
        judged.append((check, {k: dict(v) for k, v in values.items()}))
        return real(check, values)

    monkeypatch.setattr(pw, "rejudge", spy)
    amounts = {("P5", 0): 0.25, ("P5", 1): -0.5}  # shift(result, k, check): by the result
    pw.verdicts(results, 4, "P5", lambda r, k, c: amounts[(r.prediction.id, k)])
    moved = {("P5", 0): {"drop": 0.25}, ("P5", 1): {"drop": -0.5}}
    pw.verdicts(results, 3, "P3 direction", lambda r, k, c: 0.125)
    # mask − zero, and matched − mask (without the step-size control): both moved alike
    moved[("P3", 0)] = {"mask": 0.125}
    moved[("P3", 1)] = {"mask": 0.125, "matched": 0.125}
    seen = []
    for i, (check, values) in enumerate(judged):
        n = 4 if i < len(judged) // 2 else 3
        planted = "P5" if n == 4 else "P3"
        r = next(r for r in results if check in _deciding(r))
        k = _deciding(r).index(check)
        by = moved.get((r.prediction.id, k), {}) if r.prediction.id == planted else {}
        want = {lab: {s: v + by.get(lab, 0.0) for s, v in d.items() if s < n}
                for lab, d in check.values.items()}  # fmt: skip
        assert values == want, (check.name, n)
        seen.append((r.prediction.id, k, n))
    # every deciding check of every prediction, at each n: P3 two, P5 two, P6 one
    assert sorted(seen) == sorted(
        (pid, k, n)
        for n in (3, 4)
        for pid, k in [("P3", 0), ("P3", 1), ("P5", 0), ("P5", 1), ("P6", 0)]
    )


def test_the_first_n_seeds_are_the_judges_verdicts_with_a_claim_the_rule_withdraws():
    runs = pw.null_runs([pw.arm_label(a) for a in ["zero", "mask", "survivor", "turn"]],
                        np.random.default_rng(5), 5)  # fmt: skip
    results = pw.judged_results(runs)
    for n in (4, 5):
        j = judge([r for r in runs if r.seed < n], predictions=pw.JUDGED)
        direct = {r.prediction.id: (r.verdict, r.alone) for c in j.cohorts for r in c.results
                  if r.checks}  # fmt: skip
        assert pw.verdicts(results, n) == direct
    # the fixture: at 4 seeds P3's claim alone is withdrawn by the family-wise rule, at 5 kept
    assert pw.verdicts(results, 4)["P3"] == (INC, AS)
    assert pw.verdicts(results, 5)["P3"] == (AS, AS)


def test_a_large_effect_planted_is_decided_its_way_and_only_its_prediction_moves():
    runs = pw.null_runs([pw.arm_label(a) for a in ["zero", "mask", "survivor", "turn"]],
                        np.random.default_rng(5), 5)  # fmt: skip
    results = pw.judged_results(runs)
    null = pw.verdicts(results, 5)
    for plant, amount, want in [("P4", 1.0, AS), ("P4", -1.0, OPP)]:
        said = pw.verdicts(results, 5, plant, lambda r, k, c, a=amount: a)
        assert said["P4"][1] == want
        assert {k: v for k, v in said.items() if k != "P4"} == {
            k: v for k, v in null.items() if k != "P4"
        }
    assert pw.verdicts(results, 5, "P4") == null  # no shift: the null


# ---------------------------------------------------------------- the tally


#: The scripted judge: (plant or None for the null, replicate) -> (under the rule, alone),
#: the same for every prediction.
SCRIPT = {
    (None, 0): (AS, ND), (None, 1): (ND, ND), (None, 2): (OPP, INC), (None, 3): (INC, AS),
    ("P3", 0): (AS, AS), ("P3", 1): (AS, OPP), ("P3", 2): (INC, INC), ("P3", 3): (OPP, OPP),
    ("P3 direction", 0): (AS, AS), ("P3 direction", 1): (AS, ND),
    ("P3 direction", 2): (ND, ND), ("P3 direction", 3): (INC, OPP),
    ("P3 step size", 0): (ND, AS), ("P3 step size", 1): (ND, AS),
    ("P3 step size", 2): (ND, AS), ("P3 step size", 3): (ND, AS),
    ("P5", 0): (OPP, AS), ("P5", 1): (INC, INC), ("P5", 2): (INC, INC), ("P5", 3): (INC, INC),
    ("P6", 0): (OPP, OPP), ("P6", 1): (AS, OPP), ("P6", 2): (INC, AS), ("P6", 3): (OPP, INC),
}  # fmt: skip


def _scripted(monkeypatch, arms):
    order: list[int] = []

    def fake(results, n, plant=None, shift=None):
        if id(results) not in order:
            order.append(id(results))
        v = SCRIPT[(plant, order.index(id(results)))]
        return {pid: v for pid in ("P3", "P4", "P5", "P6", "P7 online")}

    monkeypatch.setattr(pw, "verdicts", fake)
    return pw.power(arms, seeds=(3,), effects=(2.0,), replicates=4, seed=1)


#: The null's shares of SCRIPT counted by hand: a difference's truth is no difference
#: (false: as predicted, opposite), an equivalence's as predicted (false: opposite).
NULL_DIFFERENCE = ((0.25, 0.5), (0.5, 0.25))
NULL_EQUIVALENCE = ((0.25, 0.25), (0.25, 0.0))


def test_the_shares_are_the_scripted_verdicts_counted_by_hand(monkeypatch):
    p = _scripted(monkeypatch, ["zero", "mask", "matched", *Q3])  # no step-size control
    assert p.predictions == ["P3", "P3 direction", "P5", "P6"]
    want = {  # (decisive, false) at 2 σ, by hand from SCRIPT
        "P3": ((0.5, 0.25), (0.25, 0.5)),  # truth as predicted
        "P3 direction": ((0.25, 0.5), (0.5, 0.5)),  # truth no difference without the control
        "P5": ((0.0, 0.25), (0.25, 0.0)),
        "P6": ((0.5, 0.5), (0.25, 0.25)),  # truth opposite
    }
    for name, (decisive, false) in want.items():
        null = NULL_EQUIVALENCE if name == "P6" else NULL_DIFFERENCE
        assert p.decisive[name] == {3: {0.0: null[0], 2.0: decisive}}, name
        assert p.false[name] == {3: {0.0: null[1], 2.0: false}}, name


def test_with_the_step_size_control_the_direction_plant_is_p3_as_predicted(monkeypatch):
    p = _scripted(monkeypatch, ["zero", "mask", "matched", "step-control"])
    assert p.predictions == ["P3", "P3 direction", "P3 step size"]
    assert p.decisive["P3 direction"][3][2.0] == (0.5, 0.25)  # truth as predicted
    assert p.false["P3 direction"][3][2.0] == (0.0, 0.25)
    assert p.decisive["P3 step size"][3] == {0.0: NULL_DIFFERENCE[0], 2.0: (1.0, 0.0)}
    assert p.false["P3 step size"][3] == {0.0: NULL_DIFFERENCE[1], 2.0: (0.0, 1.0)}


def test_a_report_without_p3_or_its_roles_plants_nothing_of_p3(monkeypatch):
    p = _scripted(monkeypatch, Q3)
    assert p.predictions == ["P5", "P6"]
    q = _scripted(monkeypatch, ["zero", "mask"])  # no matched arm: no direction plant
    assert q.predictions == ["P3"] and list(q.sigma) == ["P3"]


def test_no_replicate_judges_nothing_and_below_three_seeds_the_null_draws_three():
    p = pw.power(["zero", "mask"], seeds=(3,), effects=(1.0,), replicates=0)
    assert (p.predictions, p.sigma, p.false, p.replicates) == ([], {}, {}, 0)
    seen = []
    p = pw.power(["survivor", "mask"], seeds=(2,), effects=(1.0,), replicates=1,
                 null=_recorded_null(seen))  # fmt: skip
    assert [s[1] for s in seen] == [3] and p.noise == "synthetic"
    assert p.decisive["P4"] == {2: {0.0: (0.0, 0.0), 1.0: (0.0, 0.0)}}


def test_the_table_is_reproduced_from_its_seed_zero_by_default():
    def sigma(**kw):
        return pw.power(["survivor", "mask"], seeds=(3,), effects=(1.0,), replicates=2, **kw).sigma

    assert sigma() == sigma(seed=0) == sigma(seed=0)
    assert sigma(seed=1) != sigma(seed=0)


def _drop_turns_missing(labels, rng, seeds):
    """A null whose drop arm has no turns of successes after seed 0 and none of failures
    after seed 1: P5's deciding checks have one and two per-seed differences."""
    runs = pw.null_runs(labels, rng, seeds)
    g = "rollout/census/generated/turns_mean/"
    for run in (r for r in runs if r.label == "drop"):
        for row in run.rows:
            if run.seed >= 1:
                row[g + "solved"] = math.nan
            if run.seed >= 2:
                row[g + "submitted_failure"] = row[g + "budget_failure"] = math.nan
    return runs


def test_sigma_of_fewer_than_two_differences_is_nan_and_of_two_their_sd():
    seen = []

    def null(labels, rng, seeds):
        seen.append(_drop_turns_missing(labels, rng, seeds))
        return seen[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no degrees-of-freedom warning: nothing is computed
        p = pw.power(["drop", "never-drop"], seeds=(3,), effects=(1.0,), replicates=1, null=null)
    j = judge(seen[0], predictions=pw.JUDGED)
    (p5,) = [r for cohort in j.cohorts for r in cohort.results if r.prediction.id == "P5"]
    failures = _deciding(p5)[1]  # the turns of failures: seeds 0 and 1
    a, b = list(failures.values.values())[:2]
    two = [a[s] - b[s] for s in (0, 1)]
    assert math.isnan(p.sigma["P5"][0])
    assert p.sigma["P5"][1] == pytest.approx(abs(two[0] - two[1]) / math.sqrt(2), rel=1e-9)


def test_an_equivalence_with_no_margin_yet_is_planted_by_e_sigma_alone(monkeypatch):
    calls = []
    real = pw.verdicts

    def spy(results, n, plant=None, shift=None):
        if plant == "P6":
            r = next(x for x in results if x.prediction.id == "P6")
            c = _deciding(r)[0]
            calls.append((n, shift(r, 0, c), rejudge(c, _first(c, n)).margin))
        return real(results, n, plant, shift)

    monkeypatch.setattr(pw, "verdicts", spy)
    p = pw.power(Q3, seeds=(1, 3), effects=(2.0,), replicates=1)
    (one, m1), (three, m3) = [(c[1], c[2]) for c in calls]
    assert math.isnan(m1) and np.isfinite(m3)  # one seed has no seed SD: no margin
    assert one == pytest.approx(-2.0 * p.sigma["P6"][0], rel=1e-12)
    assert three == pytest.approx(-(2.0 * p.sigma["P6"][0] + m3), rel=1e-12)


# ---------------------------------------------------------------- the pool's draws


def _pool(k: int) -> list[Run]:
    return [Run(parse_name("zero")[0], i, [{"rollout/step": 0.0, "x": float(i), "config": {},
                                             "scenario": "s"}]) for i in range(k)]  # fmt: skip


def test_a_pool_replicate_is_distinct_pool_runs_relabelled_without_their_identity():
    draw = pw.pool_null(_pool(6))
    runs = draw(["zero", "protect-a0.5"], np.random.default_rng(2), 3)  # the whole pool
    assert [(r.label, r.seed, r.source) for r in runs] == [
        ("zero", 0, "pool zero seed 0"), ("zero", 1, "pool zero seed 1"),
        ("zero", 2, "pool zero seed 2"), ("protect-a0.5", 0, "pool protect-a0.5 seed 0"),
        ("protect-a0.5", 1, "pool protect-a0.5 seed 1"),
        ("protect-a0.5", 2, "pool protect-a0.5 seed 2"),
    ]  # fmt: skip
    assert sorted(r.rows[0]["x"] for r in runs) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(r.rows == [{"rollout/step": 0.0, "x": r.rows[0]["x"]}] for r in runs)
    order = np.random.default_rng(2).permutation(6)  # the generator's draw, in order
    assert [r.rows[0]["x"] for r in runs] == [float(i) for i in order]
    with pytest.raises(InputError) as e:
        draw(["zero", "mask", "matched"], np.random.default_rng(0), 3)
    assert str(e.value) == (
        "the pool of simulated runs holds 6 runs; a replicate of 3 arms × 3 seeds needs 9"
    )


# ---------------------------------------------------------------- what it prints


def test_seeds_needed_is_the_fewest_seeds_reaching_the_share_under_the_rule():
    p = pw.Power(("zero", "mask"), 10, (3, 4, 5, 6), (0.0, 1.0, 2.0))
    p.decisive["P3"] = {5: {1.0: (0.85, 0.0)}, 3: {1.0: (0.5, 0.9)}, 4: {1.0: (0.8, 0.1)},
                        6: {2.0: (1.0, 1.0), 1.0: (0.9, 0.9)}}  # fmt: skip
    assert pw.seeds_needed(p, "P3", 1.0) == 4  # 0.8 reaches the default share 0.8
    assert pw.seeds_needed(p, "P3", 1.0, share=0.81) == 5
    assert pw.seeds_needed(p, "P3", 1.0, share=0.9) == 6  # alone's 0.9 at 3 is not the rule
    assert pw.seeds_needed(p, "P3", 1.0, share=0.95) is None
    assert pw.seeds_needed(p, "P3", 2.0) == 6  # a count without that effect is skipped
    assert pw.seeds_needed(p, "P4", 1.0) is None


def _table() -> pw.Power:
    """P3 and its step-size plant (no direction plant) and P4 at 3 and 4 seeds."""
    p = pw.Power(("zero", "mask", "step-control", "survivor"), 40, (3, 4), (0.0, 0.62, 1.5))
    p.sigma = {"P3": [0.5, 0.25], "P3 step size": [0.5, 0.25], "P4": [0.125]}
    p.decisive = {
        "P3": {3: {0.0: (0.9, 0.95), 0.62: (0.5, 0.6), 1.5: (0.8, 0.85)},
               4: {0.0: (0.9, 0.9), 0.62: (0.8, 0.9), 1.5: (0.95, 1.0)}},
        "P3 step size": {3: {0.0: (0.85, 0.9), 0.62: (0.1, 0.2), 1.5: (0.3, 0.4)},
                         4: {0.0: (0.9, 0.95), 0.62: (0.2, 0.3), 1.5: (0.5, 0.6)}},
        "P4": {3: {0.0: (0.95, 0.9), 0.62: (0.25, 0.35), 1.5: (0.45, 0.55)},
               4: {0.0: (0.95, 0.95), 0.62: (0.35, 0.45), 1.5: (0.65, 0.75)}},
    }  # fmt: skip
    p.false = {
        "P3": {3: {0.0: (0.02, 0.04), 0.62: (0.0, 0.01), 1.5: (0.0, 0.0)},
               4: {0.0: (0.03, 0.05), 0.62: (0.0, 0.0), 1.5: (0.0, 0.0)}},
        "P3 step size": {3: {0.0: (0.01, 0.03), 0.62: (0.12, 0.22), 1.5: (0.3, 0.41)},
                         4: {0.0: (0.02, 0.06), 0.62: (0.1, 0.2), 1.5: (0.2, 0.3)}},
        "P4": {3: {0.0: (0.04, 0.07), 0.62: (0.0, 0.0), 1.5: (0.0, 0.0)},
               4: {0.0: (0.01, 0.08), 0.62: (0.0, 0.0), 1.5: (0.0, 0.0)}},
    }  # fmt: skip
    return p


NEEDS = (
    "seeds per arm for a decisive P3 (80% of replicates, under the rule) at the effect make "
    "map measured at the scenario's settings (0.62 σ): P3 4, P3 step size more than 4"
)


def test_needs_names_each_p3_plants_seed_count_at_the_maps_effect():
    p = _table()
    assert pw.needs(p) == NEEDS  # 0.62 σ: make map's measured effect
    assert pw.needs(p, 1.5) == (
        "seeds per arm for a decisive P3 (80% of replicates, under the rule) at the effect make "
        "map measured at the scenario's settings (1.5 σ): P3 3, P3 step size more than 4"
    )
    assert pw.needs(p, 2.0) == ""  # not an effect of the table
    p.decisive["P3 direction"] = {3: {0.62: (0.81, 0.0)}, 4: {0.62: (0.9, 0.9)}}
    assert pw.needs(p) == NEEDS.replace("P3 4,", "P3 4, P3 direction 3,")
    p.decisive = {"P4": p.decisive["P4"]}
    assert pw.needs(p) == ""  # no P3 plant


def test_needs_reads_the_share_it_names(monkeypatch):
    monkeypatch.setattr(pw, "NEEDED_SHARE", 0.9)
    assert pw.needs(_table()) == NEEDS.replace("80%", "90%").replace("P3 4", "P3 more than 4")


def test_the_line_at_n_seeds_is_the_decided_shares_the_worst_false_claim_and_the_needs():
    p = _table()
    assert pw.line(p, 4) == (
        "SEEDS=4 per arm: a true effect of 1.5 seed SDs is decided (the report's family-wise "
        "rule / alone) P3 0.95 / 1.00, P3 step size 0.50 / 0.60, P4 0.65 / 0.75; with no "
        "effect, false claims at most 0.08 (rescue power, 40 replicates; noise: synthetic); "
        + NEEDS
    )
    p.noise = "pool"
    assert pw.line(p, 3, effect=0.62) == (
        "SEEDS=3 per arm: a true effect of 0.62 seed SDs is decided (the report's family-wise "
        "rule / alone) P3 0.50 / 0.60, P3 step size 0.10 / 0.20, P4 0.25 / 0.35; with no "
        "effect, false claims at most 0.07 (rescue power, 40 replicates; noise: pool); " + NEEDS
    )
    p.decisive = {"P4": p.decisive["P4"]}  # no P3 plant: no needs clause
    assert pw.line(p, 3) == (
        "SEEDS=3 per arm: a true effect of 1.5 seed SDs is decided (the report's family-wise "
        "rule / alone) P4 0.45 / 0.55; with no effect, false claims at most 0.07 (rescue "
        "power, 40 replicates; noise: pool)"
    )


def test_below_the_judges_minimum_the_line_needs_no_replicate():
    p = _table()
    assert pw.line(p, 2) == (
        "SEEDS=2 per arm: the judge decides nothing on fewer than 3 paired seeds: P3, "
        "P3 step size, P4 stay inconclusive"
    )
    assert pw.line(p, 2, arms=Q3) == (
        "SEEDS=2 per arm: the judge decides nothing on fewer than 3 paired seeds: P5, P6 "
        "stay inconclusive"
    )
    assert pw.line(p, 1, arms=["pace", "protect:0.5"]) == (
        "SEEDS=1 per arm: no prediction compares these arms"
    )
    empty = pw.Power(("pace",), 5, (2, 3), (0.0, 1.5))
    assert pw.line(empty, 2) == "SEEDS=2 per arm: no prediction compares these arms"
    assert pw.line(empty, 3) == "SEEDS=3 per arm: no prediction compares these arms"


INTRO = (
    "judged by `rescue.judge` ({s} s). Each cell: the share of replicates, under the report's "
    "family-wise rule / alone. Decisive: the verdict the truth makes (with an effect `as "
    "predicted` for P3, P4, P5 and `opposite` for the equivalences P6 and P7 online, planted "
    "beyond their margin; with none `no difference`, or `as predicted` for an equivalence). "
    "False claims: with no effect `as predicted` or `opposite` (P3, P4, P5), `opposite` (P6, "
    "P7 online)."
)


def test_the_markdown_table_line_by_line():
    p = _table()
    assert pw.markdown(p, "Q2", 12.4) == [
        "## Q2: the report of zero, mask, step-control, survivor",
        "",
        "40 replicates of up to 4 seeds per arm (noise: synthetic), " + INTRO.format(s=12),
        "",
        "**P3**: the mask drifts, neither control does, true verdict `as predicted` (σ: the SD "
        "of the deciding check's per-seed differences)",
        "",
        "| seeds | no effect: decisive | no effect: false claims | 0.62 σ | 1.5 σ |",
        "|---|---|---|---|---|",
        "| 3 | 0.90 / 0.95 | 0.02 / 0.04 | 0.50 / 0.60 | 0.80 / 0.85 |",
        "| 4 | 0.90 / 0.90 | 0.03 / 0.05 | 0.80 / 0.90 | 0.95 / 1.00 |",
        "",
        "With an effect, the wrong way (a false claim): at most 0.01.",
        "",
        "**P3 step size**: the mask and the step-size control drift (step size carries it), "
        "true verdict `no difference` (σ: the SD of the deciding check's per-seed differences)",
        "",
        "| seeds | no effect: decisive | no effect: false claims | 0.62 σ | 1.5 σ |",
        "|---|---|---|---|---|",
        "| 3 | 0.85 / 0.90 | 0.01 / 0.03 | 0.10 / 0.20 | 0.30 / 0.40 |",
        "| 4 | 0.90 / 0.95 | 0.02 / 0.06 | 0.20 / 0.30 | 0.50 / 0.60 |",
        "",
        "With an effect, the wrong way (a false claim): at most 0.41.",
        "",
        "**P4** (σ: the SD of the deciding check's per-seed differences)",
        "",
        "| seeds | no effect: decisive | no effect: false claims | 0.62 σ | 1.5 σ |",
        "|---|---|---|---|---|",
        "| 3 | 0.95 / 0.90 | 0.04 / 0.07 | 0.25 / 0.35 | 0.45 / 0.55 |",
        "| 4 | 0.95 / 0.95 | 0.01 / 0.08 | 0.35 / 0.45 | 0.65 / 0.75 |",
        "",
        "With an effect, the wrong way (a false claim): at most 0.00.",
        "",
    ]


def test_the_direction_plants_true_verdict_follows_the_step_size_control_in_the_table():
    direction = {3: {0.0: (0.5, 0.5)}}
    for labels, truth in [(("zero", "mask", "matched"), "no difference"),
                          (("zero", "step-control", "matched"), "as predicted")]:  # fmt: skip
        p = pw.Power(labels, 7, (3,), (0.0,))
        p.decisive = {"P3 direction": direction}
        p.false = {"P3 direction": {3: {0.0: (0.25, 0.75)}}}
        assert pw.markdown(p, "x", 0.6) == [
            f"## x: the report of {', '.join(labels)}",
            "",
            "7 replicates of up to 3 seeds per arm (noise: synthetic), " + INTRO.format(s=1),
            "",
            "**P3 direction**: the mask and the matched control drift (the mask's direction "
            f"carries it), true verdict `{truth}` (σ: the SD of the deciding check's per-seed "
            "differences)",
            "",
            "| seeds | no effect: decisive | no effect: false claims |  |",
            "|---|---|---|",
            "| 3 | 0.50 / 0.50 | 0.25 / 0.75 |  |",
            "",
            "With an effect, the wrong way (a false claim): at most 0.00.",  # no effect asked
            "",
        ]


def test_the_json_is_the_shares_keyed_by_seeds_and_effect():
    p = _table()
    p.decisive = {"P4": p.decisive["P4"]}
    p.false = {"P4": p.false["P4"]}
    assert pw.as_json(p) == {
        "arms": ["zero", "mask", "step-control", "survivor"],
        "replicates": 40,
        "sigma": {"P3": [0.5, 0.25], "P3 step size": [0.5, 0.25], "P4": [0.125]},
        "decisive": {"P4": {"3": {"0": [0.95, 0.9], "0.62": [0.25, 0.35], "1.5": [0.45, 0.55]},
                            "4": {"0": [0.95, 0.95], "0.62": [0.35, 0.45],
                                  "1.5": [0.65, 0.75]}}},
        "false": {"P4": {"3": {"0": [0.04, 0.07], "0.62": [0.0, 0.0], "1.5": [0.0, 0.0]},
                         "4": {"0": [0.01, 0.08], "0.62": [0.0, 0.0], "1.5": [0.0, 0.0]}}},
        "cells": "(under the report's family-wise rule, alone)",
    }  # fmt: skip
