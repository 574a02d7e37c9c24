"""Reading runs: names and tags, the simulator's JSONL, CSV/JSON exports, wandb offline runs.

The wandb runs are written by this test with wandb itself in offline mode and read back
through the judge (wandb's own reader of the transaction log).
"""

import csv
import json
import math
from pathlib import Path

import pytest
from synthetic_runs import make_run

from rescue.judge.inputs import expand, read_inputs, read_wandb
from rescue.judge.offline import report_kind
from rescue.judge.report import judge, markdown
from rescue.judge.runs import Condition, Run, identify, parse_name

# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "text, cond, seed",
    [
        ("swe-protect-a0.5-k2-seed1", Condition("swe", "protect", 0.5, 2), 1),
        ("swe-never-drop-seed3", Condition("swe", "never-drop"), 3),
        ("swe-drop-k2-seed0", Condition("swe", "drop", k=2), 0),
        ("rlvr-drgrpo-mask-cap512-seed4", Condition("rlvr", "drgrpo-mask", cap=512), 4),
        ("protect-a0.1", Condition("sim", "protect", 0.1), None),
        ("turn-baseline-seed2", Condition("sim", "turn-baseline"), 2),
        ("swe-drop-k2-est-turn-seed1", Condition("swe", "drop", k=2, setting="est-turn"), 1),
        ("swe-never-drop-drgrpo-seed2", Condition("swe", "never-drop", setting="drgrpo"), 2),
        (
            "swe-protect-a0.5-k2-est-turn-drgrpo-seed3",
            Condition("swe", "protect", 0.5, 2, setting="est-turn-drgrpo"),
            3,
        ),
    ],
)
def test_launcher_and_simulator_names(text, cond, seed):
    assert parse_name(text) == (cond, seed)


def test_unknown_names_are_not_guessed():
    assert parse_name("swe-fancy-seed1") is None and parse_name("") is None


def test_tags_win_over_the_name_and_fill_what_it_lacks():
    cond, seed = identify(tags="arm:protect,seed:7,a:0.25,k:3", group="swe-protect-a0.5-k2-seed1")
    assert (cond, seed) == (Condition("swe", "protect", 0.25, 3), 7)
    cond, seed = identify(tags=["arm:never-drop", "seed:2"], group="swe-never-drop-seed2")
    assert (cond.family, cond.label, seed) == ("swe", "never-drop", 2)
    assert Condition("swe", "protect", 0.5, 2).label == "protect-a0.5-k2"


def test_the_estimator_and_drgrpo_tags_set_the_cohort_and_win_over_the_name():
    cond, _ = identify(tags="arm:drop,seed:1,estimator:turn,drgrpo:1", group="swe-drop-k2-seed1")
    assert cond.setting == "est-turn-drgrpo" and cond.cohort == (
        "swe",
        None,
        "est-turn-drgrpo",
        None,
    )
    cond, _ = identify(tags="arm:drop,seed:1,estimator:group", group="swe-drop-k2-est-turn-seed1")
    assert cond.setting is None and cond.cohort == ("swe", None, None, None)
    cond, _ = identify(tags="arm:drop,seed:1", group="swe-drop-k2-drgrpo-seed1")
    assert cond.setting == "drgrpo"
    with pytest.raises(ValueError, match="tag estimator:fancy; allowed: group, turn"):
        identify(tags="arm:drop,seed:1,estimator:fancy")
    with pytest.raises(ValueError, match="tag drgrpo:yes; allowed: 0, 1"):
        identify(tags="arm:drop,seed:1,drgrpo:yes")


def test_runs_under_another_estimator_are_another_cohort_never_pooled():
    from dataclasses import replace

    from synthetic_runs import make_run

    from rescue.judge.report import as_json, judge, markdown

    runs = []
    for setting in (None, "est-turn"):
        for label in ("drop", "never-drop"):
            for s in range(3):
                r = make_run(label, s, family="swe")
                r.condition = replace(r.condition, setting=setting)
                runs.append(r)
    j = judge(runs)
    assert [(c.family, c.setting) for c in j.cohorts] == [("swe", None), ("swe", "est-turn")]
    assert all(sorted(c.arms) == ["drop", "never-drop"] for c in j.cohorts)
    assert all(len(seeds) == 3 for c in j.cohorts for seeds in c.arms.values())
    assert not j.notes  # nothing read as a duplicate of the other cohort's runs
    assert [c["setting"] for c in as_json(j)["cohorts"]] == [None, "est-turn"]
    assert "swe runs, est-turn" in markdown(j)
    assert [c.stem for c in j.cohorts] == ["swe", "swe-est-turn"]


def test_a_run_that_names_no_arm_is_an_error_naming_it():
    with pytest.raises(
        ValueError, match=r"run-x: cannot tell the arm and seed .* tags arm:<arm>,seed:<seed>"
    ):
        identify(group="my-experiment", where="run-x")
    with pytest.raises(ValueError, match="arm 'fancy'; allowed: drop, never-drop"):
        identify(tags="arm:fancy,seed:1")


# ---------------------------------------------------------------- the simulator's output


@pytest.fixture(scope="module")
def sim_out(tmp_path_factory) -> Path:
    from rescue import cli

    out = tmp_path_factory.mktemp("sim") / "out"
    flags = ["--steps", "6", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
             "--max-turns", "12", "--seeds", "2", "--workers", "1", "--no-plots", "--no-progress",
             "--arms", "drop,never-drop,protect:0.5"]  # fmt: skip
    assert cli.main(["sim", "--out", str(out), *flags]) == 0
    return out


def test_a_simulator_directory_is_its_census_jsonl_and_runs_json(sim_out):
    inputs = read_inputs([sim_out], progress=False)
    got = sorted((r.condition.family, r.label, r.seed) for r in inputs.runs)
    assert got == [("sim", a, s) for a in ("drop", "never-drop", "protect-a0.5") for s in (0, 1)]
    first = json.loads((sim_out / "census" / "drop-seed0.jsonl").read_text().splitlines()[0])
    run = next(r for r in inputs.runs if r.label == "drop" and r.seed == 0)
    assert run.rows[0] == first and len(run.rows) == 6
    assert set(run.offline["p7"]) == {"group_mean", "leave_one_out", "turn_reached"}
    assert any("not read again" in n for n in inputs.notes)  # its wandb/ holds the same runs


def test_the_same_run_read_twice_is_kept_once_and_said(sim_out, tmp_path):
    copy = tmp_path / "drop-seed0.jsonl"
    copy.write_text((sim_out / "census" / "drop-seed0.jsonl").read_text())
    inputs = read_inputs([sim_out, copy], progress=False)
    j = judge(inputs.runs, notes=inputs.notes)
    assert len(j.cohorts[0].arms["drop"]) == 2
    [collision] = j.collisions
    assert "already read" in collision and collision.endswith("skipped")
    top = markdown(j).split("## sim runs")[0]  # said before the first cohort, not at the end
    assert "**Collisions: 1 run(s)" in top and collision in top


def test_runs_of_different_settings_are_never_pooled_into_one_cohort(sim_out, tmp_path):
    """Two simulator outputs that differ in one setting: two cohorts, each named by the
    setting, no collision. Today's rule pooled them into one ``sim`` cohort and skipped
    every run of the second as a duplicate."""
    from rescue import cli

    other = tmp_path / "lr0"
    flags = ["--steps", "6", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
             "--max-turns", "12", "--seeds", "2", "--workers", "1", "--no-plots", "--no-progress",
             "--no-wandb", "--arms", "drop,never-drop,protect:0.5", "--lr", "0"]  # fmt: skip
    assert cli.main(["sim", "--out", str(other), *flags]) == 0
    inputs = read_inputs([sim_out, other], progress=False)
    j = judge(inputs.runs, notes=inputs.notes)
    assert j.collisions == []
    assert sorted(c.title for c in j.cohorts) == ["sim runs, lr = 0.0", "sim runs, lr = 0.1"]
    for c in j.cohorts:
        assert sorted(c.arms) == ["drop", "never-drop", "protect-a0.5"]
        assert all(sorted(seeds) == [0, 1] for seeds in c.arms.values())
    # Each runs.json goes to the runs of its own directory.
    for c in j.cohorts:
        for seeds in c.arms.values():
            for run in seeds.values():
                assert run.offline["p7"]
                assert Path(run.source).parent.parent in (sim_out, other)


def test_scenarios_are_cohorts_and_timing_json_is_not_a_run(tmp_path):
    from rescue import cli

    out = tmp_path / "sim"
    flags = ["--steps", "4", "--groups-per-step", "4", "--group-size", "2", "--concurrency", "4",
             "--seeds", "1", "--workers", "1", "--no-plots", "--no-progress", "--no-wandb"]  # fmt: skip
    assert (
        cli.main(
            ["sim", "--scenario", "two-outcome,budget-three-outcome", "--out", str(out), *flags]
        )
        == 0
    )
    inputs = read_inputs([out], progress=False)
    assert len(inputs.runs) == 4 + 6  # the scenarios' arms, one seed each; no timing.json
    assert sum("timing.json" in n and "not a run" in n for n in inputs.notes) == 2
    j = judge(inputs.runs, notes=inputs.notes)
    assert [c.scenario for c in j.cohorts] == ["budget-three-outcome", "two-outcome"]
    assert j.collisions == [] and "scenario two-outcome" in j.cohorts[1].title


# ---------------------------------------------------------------- exports


def rows_of(label: str, seed: int, steps: int = 12) -> list[dict]:
    return make_run(label, seed, steps=steps).rows


def test_csv_export_split_by_its_group_column(tmp_path):
    rows = [{"group": f"swe-drop-k2-seed{s}", **r} for s in (0, 1) for r in rows_of("drop", s)]
    keys = sorted({k for r in rows for k in r})
    path = tmp_path / "export.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "sim/p_thorough": ""})  # an empty cell is a key not logged
    inputs = read_inputs([path], progress=False)
    assert sorted((r.condition, r.seed) for r in inputs.runs) == [
        (Condition("swe", "drop", k=2), 0),
        (Condition("swe", "drop", k=2), 1),
    ]
    run = inputs.runs[0]
    assert run.column("rollout/census/rollouts")[0] == 128.0 and not run.has("sim/p_thorough")


def test_csv_export_named_by_its_file(tmp_path):
    path = tmp_path / "swe-never-drop-seed5.csv"
    rows = rows_of("never-drop", 5)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted(rows[0]))
        w.writeheader()
        w.writerows(rows)
    [run] = read_inputs([path], progress=False).runs
    assert (run.condition, run.seed, len(run.rows)) == (Condition("swe", "never-drop"), 5, 12)


def test_json_exports_rows_record_and_runs(tmp_path):
    (tmp_path / "swe-mask-seed1.json").write_text(json.dumps(rows_of("mask", 1)))
    (tmp_path / "one.json").write_text(
        json.dumps({"group": "x", "tags": ["arm:zero", "seed:2"], "history": rows_of("zero", 2)})
    )
    (tmp_path / "many.json").write_text(
        json.dumps(
            {
                "runs": [
                    {"name": f"swe-turn-seed{s}", "history": rows_of("turn-baseline", s)}
                    for s in (3, 4)
                ]
            }
        )
    )
    runs = read_inputs([tmp_path], progress=False).runs
    assert sorted((r.label, r.seed) for r in runs) == [
        ("mask", 1),
        ("turn", 3),
        ("turn", 4),
        ("zero", 2),
    ]


def test_a_json_file_that_is_neither_runs_nor_a_report_is_an_error_naming_it(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(
        ValueError, match=r"odd.json: not a run history or a `rescue replay --json` report"
    ):
        read_inputs([path], progress=False)


def test_replay_reports_are_recognised_by_their_keys(tmp_path):
    grad = {"rollouts": 4, "parameters": 10, "buckets": [], "check": {}}
    adv = {"steps": [], "total": {"var_e": 1.0}, "arms": {}}
    chk = {"prompts": 2, "max_residual": 0.0, "rtol": 1e-4}
    assert [report_kind(x) for x in (grad, adv, chk, {"x": 1})] == [
        "gradients",
        "advantages",
        "check",
        None,
    ]
    (tmp_path / "g.json").write_text(json.dumps(grad))
    inputs = read_inputs([tmp_path / "g.json"], progress=False)
    assert [r.kind for r in inputs.replays] == ["gradients"] and not inputs.runs


def test_paths_that_do_not_exist_or_match_nothing_are_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        expand([tmp_path / "nope"])
    with pytest.raises(ValueError, match="matches nothing"):
        expand([str(tmp_path / "*.csv")])


def test_a_progress_bar_when_reading_many_inputs(tmp_path, capsys):
    for s in range(3):
        (tmp_path / f"swe-zero-seed{s}.json").write_text(json.dumps(rows_of("zero", s, 3)))
    read_inputs([tmp_path], progress=True)
    err = capsys.readouterr().err  # tqdm's bar: "reading runs: 100%|...| 3/3 [..inputs/s]"
    assert "reading runs" in err and "3/3" in err and "inputs/s" in err
    read_inputs([tmp_path], progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- wandb offline runs


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory) -> tuple[Path, dict]:
    wandb = pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("wandb")
    written = {}
    for label, group_arm, extra in (
        ("drop", "drop-k2", ["k:2"]),
        ("never-drop", "never-drop", []),
    ):
        for seed in range(3):
            run = wandb.init(
                mode="offline",
                dir=str(root),
                project="rescue-test",
                group=f"swe-{group_arm}-seed{seed}",
                name=f"swe-{group_arm}-seed{seed}",
                tags=[f"arm:{label}", f"seed:{seed}", *extra],
                config={"model": "tiny"},
                reinit="create_new",
                settings=wandb.Settings(silent=True, console="off"),
            )
            run.define_metric("*", step_metric="rollout/step")
            turns = 5.0 if label == "drop" else 6.0
            rows = make_run(label, seed, steps=8, turns_solved=turns).rows
            for r in rows:
                run.log(r)
            run.log({"train/step": 8, "train/loss": 0.5})  # a trainer row without the census
            run.finish()
            written[(label, seed)] = rows
    return root / "wandb", written


def test_wandb_offline_runs_read_back_with_wandbs_reader(wandb_runs):
    wandb_dir, written = wandb_runs
    dirs = sorted(wandb_dir.glob("offline-run-*"))
    assert len(dirs) == 6
    run = read_wandb(dirs[0])
    assert run.condition.family == "swe" and run.seed in (0, 1, 2)
    rows = [r for r in run.rows if "rollout/census/rollouts" in r]
    want = written[(run.condition.arm, run.seed)]
    assert len(rows) == len(want)
    for got, w in zip(rows, want, strict=True):
        for k, v in w.items():
            assert math.isclose(got[k], v, rel_tol=1e-12, abs_tol=1e-12), k
    assert any("train/loss" in r for r in run.rows)


def test_rescue_judges_wandb_offline_runs(wandb_runs):
    wandb_dir, _ = wandb_runs
    inputs = read_inputs([wandb_dir], progress=False)
    assert sorted((r.label, r.seed) for r in inputs.runs) == [
        *(("drop-k2", s) for s in range(3)),
        *(("never-drop", s) for s in range(3)),
    ]
    [cohort] = judge(inputs.runs).cohorts
    p5 = next(r for r in cohort.results if r.prediction.id == "P5")
    assert p5.binding == {"drop": "drop-k2", "never-drop": "never-drop"}
    shorter = next(c for c in p5.checks if c.name.startswith("turns of successes over the run"))
    assert shorter.verdict == "as predicted" and shorter.estimate.n == 3
    assert shorter.estimate.value == pytest.approx(-1.0, abs=0.05)


def test_a_broken_jsonl_file_is_one_clear_error(tmp_path, capsys):
    from rescue import cli

    bad = tmp_path / "swe-drop-seed0.jsonl"
    bad.write_text('{"rollout/step": 0}\n{not json\n')
    assert cli.main(["report", str(bad), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert f"rescue report: error: {bad}: not JSON lines" in capsys.readouterr().err


def test_a_variant_of_an_arm_keeps_its_own_label_and_the_arms_roles():
    from rescue.judge.evaluation import Role

    cond, seed = parse_name("sim-protect-a0.5-wnorm-seed3")
    assert (cond.arm, cond.a, cond.variant, seed) == ("protect", 0.5, "wnorm", 3)
    assert cond.label == "protect-a0.5-wnorm" != Condition("sim", "protect", 0.5).label
    assert Role("protect", 0.5).matches(Run(cond, 3, []))
    assert parse_name("protect-a0.5-bogus") is None
    cond, seed = identify(tags=["arm:protect", "a:0.5", "variant:wnorm", "seed:1"])
    assert (cond.label, seed) == ("protect-a0.5-wnorm", 1)


def test_gradient_oracle_files_are_skipped_with_a_note(tmp_path):
    """No registered prediction reads the oracle's comparison: it is said, not judged."""
    (tmp_path / "oracle").mkdir()
    (tmp_path / "oracle" / "oracle.json").write_text(
        json.dumps({"format": "rescue-oracle/1", "arms": ["all"], "entries": []})
    )
    (tmp_path / "oracle" / "compare.json").write_text(
        json.dumps({"format": "rescue-oracle-compare/1", "arms": ["all"], "steps": []})
    )
    (tmp_path / "drop-seed0.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows_of("drop", 0)) + "\n"
    )
    inputs = read_inputs([tmp_path], progress=False)
    assert [r.label for r in inputs.runs] == ["drop"] and not inputs.replays
    skipped = [n for n in inputs.notes if "no registered prediction reads it" in n]
    assert len(skipped) == 2 and all(n.endswith("skipped") for n in skipped)


def test_the_offline_folders_of_one_run_id_are_one_run(tmp_path):
    """Miles' driver, rollout manager and train actor each log to the run from their own
    process, each into an offline folder of its own with the run's id: one run, its rows
    joined (what the CPU rehearsal found when its report read a Miles run)."""
    wandb = pytest.importorskip("wandb")
    parts = (
        ({"rollout/step": 0, "rollout/census/samples/rollouts": 8.0}, ["arm:zero", "seed:2"]),
        ({"train/step": 0, "train/rescue/update_norm": 0.25}, []),
    )
    for row, tags in parts:
        run = wandb.init(
            mode="offline", dir=str(tmp_path), project="rescue-test", id="milesrun1",
            resume="allow", group="rlvr-zero-cap32-seed2", name="rlvr-zero-cap32-seed2",
            tags=tags, reinit="create_new", settings=wandb.Settings(silent=True, console="off"),
        )  # fmt: skip
        run.log(row)
        run.finish()
    dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2 and all((d / "run-milesrun1.wandb").is_file() for d in dirs)
    inputs = read_inputs([tmp_path / "wandb"], progress=False)
    [one] = inputs.runs
    assert (one.condition.family, one.label, one.seed) == ("rlvr", "zero", 2)
    assert one.has("rollout/census/samples/rollouts") and one.has("train/rescue/update_norm")


def test_a_synchronous_runs_behaviour_is_read_from_its_sample_census():
    from rescue.judge.quantities import QUANTITIES, series
    from rescue.judge.runs import Condition, Run

    p = "rollout/census/samples/"
    rows = [{"rollout/step": s, p + "rollouts": 8.0, p + "outcome/solved": float(s),
             p + "cap_hit_rate": 0.5, p + "b_all": 0.25} for s in range(3)]  # fmt: skip
    run = Run(Condition(family="rlvr", arm="zero"), 1, rows)
    success = series(run, QUANTITIES["success"])
    assert success.source == p and list(success.values()) == [0.0, 0.125, 0.25]
    assert list(series(run, QUANTITIES["b"]).values()) == [0.25, 0.25, 0.25]
    # the group census, where a run logs one, still comes first
    both = Run(Condition(family="swe", arm="zero"), 1,
               [{**r, "rollout/census/rollouts": 4.0, "rollout/census/outcome/solved": 4.0}
                for r in rows])  # fmt: skip
    assert series(both, QUANTITIES["success"]).source == "rollout/census/"
