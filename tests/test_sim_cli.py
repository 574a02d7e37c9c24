"""`rescue sim`: every flag changes what is run or written (a test per flag)."""

import json
import time
from pathlib import Path

import pytest

from rescue import cli
from rescue.sim import SimConfig, runner
from rescue.sim import run as sim_run

TINY = [
    "--steps", "4", "--groups-per-step", "4", "--group-size", "4", "--concurrency", "4",
    "--max-turns", "12", "--seeds", "1", "--workers", "1", "--no-wandb", "--no-plots",
    "--no-progress",
]  # fmt: skip


def sim(tmp_path: Path, *flags: str, tiny=TINY) -> Path:
    out = tmp_path / "out"
    rc = cli.main(["sim", "--out", str(out), *tiny, *flags])
    assert rc == 0
    return out


def lines(out: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (out / "census" / f"{name}.jsonl").read_text().splitlines()]


def runs(out: Path) -> list[dict]:
    return json.loads((out / "runs.json").read_text())


def files(out: Path) -> set[str]:
    return {p.name for p in (out / "census").iterdir()}


def test_default_arms_are_every_arm_side_by_side(tmp_path):
    out = sim(tmp_path)
    assert files(out) == {
        f"{a}-seed0.jsonl"
        for a in (
            "drop",
            "never-drop",
            "protect-a0.5",
            "protect-a0.1",
            "pace",
            "mask",
            "matched",
            "step-control",
            "zero",
            "survivor",
            "turn",
        )
    }
    summary = (out / "summary.md").read_text()
    for p in ("P3", "P5", "P6", "P7"):
        assert f"### {p}" in summary


def test_arm_runs_one_arm(tmp_path):
    assert files(sim(tmp_path, "--arm", "drop")) == {"drop-seed0.jsonl"}


def test_arms_runs_the_listed_arms(tmp_path):
    assert files(sim(tmp_path, "--arms", "mask,zero")) == {"mask-seed0.jsonl", "zero-seed0.jsonl"}


def test_a_sets_the_keep_probability_of_protect(tmp_path):
    out = sim(tmp_path, "--arm", "protect", "--a", "0.25", "--steps", "12")
    weights = [
        m["rollout/census/protected_weight_mean"]
        for m in lines(out, "protect-a0.25-seed0")
        if "rollout/census/protected_weight_mean" in m
    ]
    assert weights and set(weights) == {4.0}


def test_seeds_and_first_seed_choose_the_seeds(tmp_path):
    out = sim(tmp_path, "--arm", "zero", "--seeds", "2", "--first-seed", "5")
    assert files(out) == {"zero-seed5.jsonl", "zero-seed6.jsonl"}
    assert lines(out, "zero-seed5") != lines(out, "zero-seed6")


def test_steps_is_the_number_of_trainer_steps(tmp_path):
    assert len(lines(sim(tmp_path, "--arm", "zero", "--steps", "7"), "zero-seed0")) == 7


def test_groups_per_step_and_group_size_set_the_batch(tmp_path):
    out = sim(tmp_path, "--arm", "zero", "--groups-per-step", "3", "--group-size", "5")
    for m in lines(out, "zero-seed0"):
        assert m["rollout/census/rollouts"] == 15
        assert (
            m["rollout/census/groups/trained_fresh"] + m["rollout/census/groups/trained_stale"] == 3
        )


def test_max_turns_is_the_turn_cap(tmp_path):
    out = sim(tmp_path, "--arm", "zero", "--max-turns", "5", "--steps", "8")
    capped = [
        m for m in lines(out, "zero-seed0") if "rollout/census/turns_mean/budget_failure" in m
    ]
    assert capped and {m["rollout/census/turns_mean/budget_failure"] for m in capped} == {5.0}
    assert (
        max(
            m["rollout/census/generated/turns_p90/solved"]
            for m in lines(out, "zero-seed0")
            if "rollout/census/generated/turns_p90/solved" in m
        )
        <= 5
    )


def _total(out: Path, name: str, key: str) -> float:
    return sum(m.get(key, 0.0) for m in lines(out, name))


def test_max_staleness_sets_k(tmp_path):
    strict = sim(tmp_path / "a", "--arm", "drop", "--max-staleness", "0", "--steps", "10")
    lax = sim(tmp_path / "b", "--arm", "drop", "--max-staleness", "50", "--steps", "10")
    key = "rollout/census/groups/dropped_stale"
    assert _total(strict, "drop-seed0", key) > 0 == _total(lax, "drop-seed0", key)


def test_concurrency_sets_the_groups_in_flight(tmp_path):
    few = sim(tmp_path / "a", "--arm", "zero", "--concurrency", "2", "--steps", "15")
    many = sim(tmp_path / "b", "--arm", "zero", "--concurrency", "16", "--steps", "15")
    key = "rollout/census/staleness_mean"
    assert _total(many, "zero-seed0", key) > _total(few, "zero-seed0", key)


def test_buffer_capacity_blocks_finished_workers(tmp_path):
    small = sim(
        tmp_path / "a",
        "--arm",
        "zero",
        "--concurrency",
        "16",
        "--buffer-capacity",
        "1",
        "--steps",
        "10",
    )
    large = sim(
        tmp_path / "b",
        "--arm",
        "zero",
        "--concurrency",
        "16",
        "--buffer-capacity",
        "64",
        "--steps",
        "10",
    )
    key = "rollout/census/groups/buffered"
    assert max(m[key] for m in lines(small, "zero-seed0")) <= 1
    assert max(m[key] for m in lines(large, "zero-seed0")) > 1


def test_train_time_is_the_time_of_an_update(tmp_path):
    fast = sim(tmp_path / "a", "--arm", "zero", "--train-time", "0")
    slow = sim(tmp_path / "b", "--arm", "zero", "--train-time", "100")
    assert (
        lines(slow, "zero-seed0")[-1]["sim/time"] > lines(fast, "zero-seed0")[-1]["sim/time"] + 300
    )


def test_lr_is_the_step_size(tmp_path):
    still = sim(tmp_path / "a", "--arm", "zero", "--lr", "0")
    moving = sim(tmp_path / "b", "--arm", "zero", "--lr", "1")
    assert {m["sim/p_thorough"] for m in lines(still, "zero-seed0")} == {0.5}
    assert len({m["sim/p_thorough"] for m in lines(moving, "zero-seed0")}) > 1


def test_kappa_sets_the_turn_reached_shrinkage(tmp_path):
    # With --lr 0 the policy never moves, so both runs play the same episodes whatever the
    # number of steps: the group baselines' statistics are equal by construction and only
    # the turn-reached one can move. (That kappa reaches the update is checked in
    # test_sim_engine.py, on the normalizer's calls.)
    runs_ = [sim(tmp_path / k, "--arm", "turn-baseline", "--kappa", k, "--lr", "0") for k in "05"]
    a, b = (runs(out)[0]["p7"] for out in runs_)
    assert a["group_mean"] == b["group_mean"] and a["leave_one_out"] == b["leave_one_out"]
    assert a["turn_reached"] != b["turn_reached"]


def test_infra_rate_is_the_share_of_lost_rollouts(tmp_path):
    none = sim(tmp_path / "a", "--arm", "zero", "--infra-rate", "0")
    many = sim(tmp_path / "b", "--arm", "zero", "--infra-rate", "0.2")
    assert runs(none)[0]["totals"]["aborted"] == 0
    assert runs(many)[0]["totals"]["aborted"] > 0


def test_out_is_where_everything_is_written(tmp_path):
    out = sim(tmp_path, "--arm", "zero")
    assert (out / "summary.md").exists() and (out / "runs.json").exists()
    assert files(out) == {"zero-seed0.jsonl"}


def test_workers_does_not_change_results_and_must_be_positive(tmp_path, capsys):
    one = sim(tmp_path / "a", "--arms", "drop,mask", "--workers", "1")
    two = sim(tmp_path / "b", "--arms", "drop,mask", "--workers", "2")
    for name in ("drop-seed0", "mask-seed0"):
        assert lines(one, name) == lines(two, name)
    assert cli.main(["sim", "--out", str(tmp_path / "c"), *TINY, "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_no_wandb_turns_wandb_off(tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr(runner, "wandb_available", lambda: True)
    monkeypatch.setattr(  # where run_one, which logs each run, finds it
        sim_run, "log_wandb_run", lambda steps, label, seed, cfg, out: logged.append(label)
    )
    tiny = [f for f in TINY if f != "--no-wandb"]
    sim(tmp_path / "a", "--arm", "zero", tiny=tiny)
    assert logged == ["zero"]
    logged.clear()
    sim(tmp_path / "b", "--arm", "zero", "--no-wandb", tiny=tiny)
    assert logged == []


def test_wandb_gets_one_offline_run_per_arm_and_seed_with_the_cluster_keys(tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "w"
    runner.log_wandb_run([{"rollout/census/b_realized": 0.5}], "zero", 0, SimConfig(), out)
    (run,) = (out / "wandb").glob("offline-run-*")
    (data,) = run.glob("*.wandb")
    for _ in range(100):  # the wandb service may still be flushing the file
        if b"rollout/census/b_realized" in data.read_bytes():
            break
        time.sleep(0.1)
    assert b"rollout/census/b_realized" in data.read_bytes()


def test_no_plots_turns_plots_off(tmp_path):
    pytest.importorskip("matplotlib")
    tiny = [f for f in TINY if f != "--no-plots"]
    with_plots = sim(tmp_path / "a", "--arms", "drop,never-drop", tiny=tiny)
    assert {
        "success.png",
        "cap_hit.png",
        "turns.png",
        "ran_tests.png",
        "b.png",
        "overview.png",
    } <= {p.name for p in with_plots.iterdir()}
    without = sim(tmp_path / "b", "--arm", "zero", "--no-plots", tiny=tiny)
    assert not list(without.glob("*.png"))


def test_no_progress_silences_the_progress_bar(tmp_path, capsys):
    tiny = [f for f in TINY if f != "--no-progress"]
    sim(tmp_path / "a", "--arm", "zero", tiny=tiny)
    assert "steps" in capsys.readouterr().err
    sim(tmp_path / "b", "--arm", "zero", "--no-progress", tiny=tiny)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--arm", "protect", "--a", "0"], "--a"),
        (["--arm", "keep-all"], "allowed: drop, never-drop"),
        (["--arms", "drop,drop"], "more than once"),
        (["--arms", "drop:0.5"], "only protect"),
        (["--seeds", "0"], "--seeds"),
        (["--group-size", "0"], "--group-size"),
        (["--infra-rate", "1.5"], "--infra-rate"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, flags, named):
    assert cli.main(["sim", "--out", str(tmp_path), *TINY, *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
