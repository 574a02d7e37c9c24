"""The rehearsal's report fails on each defect it exists to catch (synthetic run folders)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rescue.advantages import group_advantages
from rescue.rehearsal.verdict import report as rep
from rescue.rehearsal.verdict.checks import GROUPS
from rescue.rehearsal.verdict.report import (
    CHECKS,
    Report,
    _check_outcomes,
    check_run,
    job_error,
    wandb_history,
)


def test_wandb_history_reassembles_records_across_blocks(tmp_path):
    """A record longer than one 32 KiB block of the transaction log comes back whole, through
    the one reader (wandb's own); a file that is not a transaction log is a clear error."""
    wandb = pytest.importorskip("wandb")
    small, big = "a" * 10, "".join(chr(65 + i % 26) for i in range(51200))  # spans two blocks
    run = wandb.init(mode="offline", dir=str(tmp_path), project="rescue-test",
                     reinit="create_new", settings=wandb.Settings(silent=True, console="off"))  # fmt: skip
    run.log({"rollout/step": 0, "note": small})
    run.log({"rollout/step": 1, "note": big})
    run.finish()
    dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert [r["note"] for r in wandb_history(dirs)] == [small, big]
    bad = tmp_path / "offline-run-bad"
    bad.mkdir()
    (bad / "run-bad.wandb").write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a wandb run file"):
        wandb_history([bad])


def _samples(weights: list[float | None], a_group: int = 0) -> list[dict]:
    raw = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    w = np.array([x or 1.0 for x in weights])
    adv = group_advantages(raw, ids) * w
    return [
        {
            "group_index": int(g),
            "raw_reward": float(r),
            "reward": float(v),
            "rescue_weight": x,
            "outcome": "solved" if r else "submitted_failure",
            "loss_mask_sum": 5,
        }
        for g, r, v, x in zip(ids, raw, adv, weights, strict=True)
    ]


def test_outcomes_check_names_each_class_never_seen(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "calls.log").write_text(json.dumps(["run", "-d", "img.gone"]) + "\n")
    train = [
        {"outcome": o, "outcome_reason": r}
        for o, r in [("solved", "resolved"), ("budget_failure", "turn_cap")]
    ]
    r = Report()
    _check_outcomes(r, train, [{"flush": 0, "groups": {f"{GROUPS}aborted": 1.0}}], tmp_path)
    detail = r.checks[0].detail
    assert not r.ok and "submitted_failure/unresolved" in detail
    assert "budget_failure/context_limit" in detail and "infra" not in detail
    r = Report()
    _check_outcomes(r, train, [{"flush": 0, "groups": {}}], tmp_path)
    assert "infra_no_result" in r.checks[0].detail


def test_check_run_fails_on_a_failed_job_and_an_infra_rollout_in_the_loss(tmp_path, monkeypatch):
    (tmp_path / "probes").mkdir()
    samples = _samples([None] * 8)
    samples[1].update(outcome="infra_no_result", outcome_reason="cancelled")
    (tmp_path / "probes" / "train_data.jsonl").write_text(json.dumps({"samples": samples}) + "\n")
    monkeypatch.setattr(rep, "wandb_history", lambda dirs: [])
    report = check_run(tmp_path, arm="drop", a=None, job_status="FAILED", steps_checked=1)
    by_name = {c.name: c for c in report.checks}
    assert not report.ok
    assert not by_name["job"].ok and not by_name["infra"].ok
    assert "1 infra_no_result rollouts reached the loss" in by_name["infra"].detail
    assert not by_name["replay"].ok  # no dump written
    assert [c.name for c in report.checks] == list(CHECKS)
    text = report.render(wall_s=12.0)
    assert text.splitlines()[-1].startswith("rehearsal: FAILED: job:")
    assert "wall time: 12 s" in text


def test_report_json_has_every_check(tmp_path):
    r = Report()
    r.add("job", True, "ok")
    d = r.as_dict(wall_s=1.0)
    assert d["ok"] and d["checks"][0]["name"] == "job" and d["wall_s"] == 1.0
    assert Path(tmp_path).exists()


def test_a_failed_job_is_reported_with_the_exception_a_ray_task_raised(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "\x1b[36m(MegatronTrainRayActor pid=1)\x1b[0m ZeroDivisionError: division by zero\n"
        "ray.exceptions.RayTaskError(ZeroDivisionError): ray::MegatronTrainRayActor.train()\n"
        "ConnectionResetError: Connection lost\n"
    )
    assert job_error(log) == "ZeroDivisionError: division by zero"
    log.write_text("rescue.errors.InputError: --without removed the hook\n")
    assert job_error(log) == "InputError: --without removed the hook"
    assert job_error(tmp_path / "absent.log") == ""
    (tmp_path / "probes").mkdir()
    log.write_text("ray.exceptions.RayTaskError(ValueError): x\nValueError: bad step\n")
    report = check_run(tmp_path, arm="drop", a=None, job_status="FAILED (exit 1)",
                       steps_checked=1, progress=False)  # fmt: skip
    assert report.checks[0].detail == "Ray job FAILED (exit 1): ValueError: bad step"
    # the driver's log as Ray kept it is read first: the tail may have stopped early
    (tmp_path / "driver.log").write_text(
        "ray.exceptions.RayTaskError(KeyError): x\nKeyError: 'k'\n"
    )
    report = check_run(tmp_path, arm="drop", a=None, job_status="FAILED (exit 1)",
                       steps_checked=1, progress=False)  # fmt: skip
    assert report.checks[0].detail == "Ray job FAILED (exit 1): KeyError: 'k'"


def test_a_text_game_run_counts_each_episode_once_and_says_why_a_class_is_missing(tmp_path):
    from rescue.rehearsal.verdict.report import episodes

    steps = [
        {"group_index": 0, "rollout_id": 7, "outcome": "solved", "outcome_reason": "won",
         "difficulty": 0, "exit_status": "won", "invalid_actions": 1, "inadmissible_actions": 2},
        {"group_index": 0, "rollout_id": 7, "outcome": "solved", "outcome_reason": "won",
         "difficulty": 0, "exit_status": "won", "invalid_actions": 1, "inadmissible_actions": 2},
        {"group_index": 1, "rollout_id": 8, "outcome": "budget_failure", "outcome_reason": "turn_cap",
         "difficulty": 5, "exit_status": "max_turns", "invalid_actions": 4, "inadmissible_actions": 9},
    ]  # fmt: skip
    r = Report()
    _check_outcomes(r, steps, [], tmp_path, "agent")
    # the loss is a chance outcome of the taught model: named with why, not a failure
    assert r.ok and r.checks[0].detail.startswith(
        "every other class appeared; not in this run: submitted_failure/lost: the model loses"
    )
    assert "eating an ingredient" in r.checks[0].detail
    assert r.facts["outcomes trained (episodes)"] == {"budget_failure/turn_cap": 1, "solved/won": 1}
    e = episodes(steps)
    assert (e["episodes"], e["steps"]) == (2, 3)
    assert (e["invalid_actions"], e["inadmissible_actions"]) == (5, 11)
    assert e["ends by level"] == {"level 0": {"won": 1}, "level 5": {"max_turns": 1}}
    r = Report()
    _check_outcomes(r, steps[:2], [], tmp_path, "agent")  # no capped episode: that must appear
    assert not r.ok and r.checks[0].detail.startswith(
        "never seen: submitted_failure/lost, budget_failure/turn_cap (submitted_failure/lost: "
    )


def test_a_single_turn_run_needs_solved_wrong_and_truncated_and_no_sandbox(tmp_path):
    train = [{"outcome": o, "outcome_reason": r} for o, r in [
        ("solved", "resolved"), ("submitted_failure", "unresolved"),
        ("budget_failure", "truncated")]]  # fmt: skip
    r = Report()
    _check_outcomes(r, train, [], tmp_path, "rlvr")
    assert r.ok, r.checks[0].detail
    r = Report()
    _check_outcomes(r, train[:2], [], tmp_path, "rlvr")
    assert not r.ok and r.checks[0].detail == "never seen: budget_failure/truncated"


def test_start_compares_the_first_update_with_the_taught_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from rescue.rehearsal.tiny.policy import digest
    from rescue.rehearsal.verdict.checks import RunFiles
    from rescue.rehearsal.verdict.report import started_from

    state = {"model.norm.weight": torch.tensor([1.0, 0.5]), "x.weight": torch.ones(2, 2)}
    save_file(state, str(tmp_path / "model.safetensors"))
    bf16 = digest({k: v.to(torch.bfloat16) for k, v in state.items()}.items())
    f = RunFiles(arm="zero", a=None, offpolicy="none", steps_checked=1, max_response_len=8,
                 trainer_weights=[{"version": "1", "digest": bf16}])  # fmt: skip
    ok, detail = started_from(f, tmp_path)
    assert ok and "bit for bit" in detail
    f.trainer_weights = [{"version": "1", "digest": "other"}]
    assert not started_from(f, tmp_path)[0]
    f.trainer_weights = []
    assert "no first weight update" in started_from(f, tmp_path)[1]
    assert started_from(f, None) == (
        True,
        "does not apply: the trainer starts from Megatron's seeded initialization",
    )


def test_replay_compares_the_steps_whose_census_reached_wandb_and_needs_enough(tmp_path):
    torch = pytest.importorskip("torch")
    from rescue.rehearsal.verdict.report import _check_replay
    from rescue.replay.census import census_report
    from rescue.replay.dumps import load_dumps
    from rescue.replay.synthetic import synthetic_step

    folder = tmp_path / "runs" / "x" / "dumps" / "rollout_data"
    folder.mkdir(parents=True)
    for rid in (0, 1):
        torch.save(synthetic_step(rollout_id=rid, seed=rid, groups=2, G=4), folder / f"{rid}.pt")
    replayed = census_report(load_dumps([str(p) for p in sorted(folder.glob("*.pt"))]))
    step0 = next(r for r in replayed["steps"] if r["step"] == 0)["metrics"]
    logged = {
        0: {f"rollout/census/samples/{k}": v for k, v in step0.items() if k.startswith("outcome/")},
        1: {"perf/x": 1.0},  # the census row of step 1 was lost at exit
    }
    r = Report()
    _check_replay(r, tmp_path, logged, need=1)
    assert r.ok and "agree with the census of the 1 steps logged" in r.checks[0].detail
    r = Report()
    _check_replay(r, tmp_path, logged, need=2)
    assert not r.ok and r.checks[0].detail == "the census of 1 steps reached wandb (need 2)"
    logged[0]["rollout/census/samples/outcome/solved"] = 99.0
    r = Report()
    _check_replay(r, tmp_path, logged, need=1)
    assert not r.ok and r.checks[0].detail.startswith("dump and log disagree: [(0, 'solved'")
