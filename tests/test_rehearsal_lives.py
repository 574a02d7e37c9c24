"""A killed and resumed rehearsal read as one run, and the checks of its restart
(``rescue.rehearsal.verdict.lives``), on a run folder written here: two lives, the checkpoint of
step 1, the kill during step 3. The real run is ``tests/test_rehearsal_miles.py``'s."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rescue.gate import coin
from rescue.rehearsal.verdict import lives
from rescue.restart import LEDGER

G = "rollout/census/groups/"
SEED, A = 1, 0.5
KILL = time.mktime(time.strptime("20261207_120000", "%Y%m%d_%H%M%S"))


def _census(flush: int, **groups: float) -> dict:
    return {"flush": flush, "groups": {G + k: float(v) for k, v in groups.items()}}


def _samples(*gids: int) -> dict:
    return {"samples": [{"group_index": g} for g in gids for _ in range(2)]}


def _weights(*digests: str) -> list[dict]:
    return [{"version": str(v), "digest": d} for v, d in enumerate(digests, 1)]


def _gate(flush: int, gid: int, staleness: int, current: int) -> dict:
    kept = staleness == 0 or coin(SEED, gid) < A
    bucket = ("trained_fresh" if staleness == 0 else "trained_protected" if kept
              else "dropped_stale")  # fmt: skip
    return {"flush": flush, "gid": gid, "staleness": staleness, "current": current,
            "bucket": bucket, "weight": 1 / A if bucket == "trained_protected" else 1.0}  # fmt: skip


#: Life 1 drew groups 0..8 by the checkpoint of step 1 (trained 0..3, aborted 4, buffered 5;
#: 6..8 in flight), trained step 2 (groups 6, 7) and was killed during step 3. Life 2
#: resumed at step 2 and trained 9..12: 4 groups lost at the restart (5; 6, 7, 8).
LIFE1 = {
    "census": [_census(0, entered=4, trained_fresh=2, aborted=1, buffered=1),
               _census(1, entered=2, trained_fresh=2, buffered=1),
               _census(2, entered=3, trained_fresh=2, buffered=2)],
    "unused": [{"flush": 0, "samples": [{"group_index": 4}]}],
    "train_data": [_samples(0, 1), _samples(2, 3), _samples(6, 7)],
    "trainer_weights": _weights("w1", "w2", "w3", "w4"),
    "engine_weights": _weights("w1", "w2", "w3", "w4"),
    "gate": [_gate(0, 0, 0, 1), _gate(0, 1, 0, 1), _gate(1, 2, 0, 2), _gate(1, 3, 0, 2),
             _gate(2, 6, 0, 3), _gate(2, 7, 0, 3)],
}  # fmt: skip
LIFE2 = {
    "census": [_census(0, entered=5, lost_at_restart=4, trained_fresh=2, buffered=0),
               _census(1, entered=2, trained_fresh=2, buffered=0)],
    "unused": [],
    "train_data": [_samples(9, 10), _samples(11, 12)],
    "trainer_weights": _weights("w3", "x4", "x5"),
    "engine_weights": _weights("w3", "x4", "x5"),
    "gate": [_gate(0, 9, 0, 1), _gate(0, 10, 0, 1), _gate(1, 11, 0, 2), _gate(1, 12, 1, 2)],
}  # fmt: skip


def write_run(out: Path, life1: dict = LIFE1, life2: dict = LIFE2, *, lost: int = 4) -> Path:
    probes = out / "probes"
    probes.mkdir(parents=True)
    counts = {}
    for name in LIFE1:
        rows = life1[name] + life2[name]
        (probes / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts[f"{name}.jsonl"] = len(life1[name])
    run = out / "runs" / "swe-protect-a0.5-k0-seed1"
    save = run / "checkpoints"
    save.mkdir(parents=True)
    ledger = [
        {"life": 1, "start": 0, "time": KILL - 600},
        {"life": 1, "rollout": 0, "open": 1, "final": 3},
        {"life": 1, "rollout": 1, "open": 1, "final": 5},
        {"life": 1, "rollout": 2, "open": 2, "final": 7},
        {"life": 2, "start": 2, "time": KILL + 60, "checkpoint": 1, "drawn": 9, "carried": 1,
         "unseen": lost - 1},
        {"life": 2, "rollout": 2, "open": 0, "final": 11},
    ]  # fmt: skip
    (save / LEDGER).write_text("".join(json.dumps(r) + "\n" for r in ledger))
    for stamp in ("20261207_115000", "20261207_115005", "20261207_121000", "20261207_121005"):
        (run / "wandb" / "wandb" / f"offline-run-{stamp}-0a1b2c3d").mkdir(parents=True)
    kill = {"life": 1, "time": KILL, "processes": 40, "checkpoint": 1, "probes": counts}
    (out / lives.LIVES).write_text(json.dumps({"kill_at": 3, "kills": [kill]}))
    command = {"runtime_env": {"env_vars": {"RESCUE_SEED": str(SEED)}},
               "flags": ["--max-weight-staleness", "0"]}  # fmt: skip
    (out / "command.json").write_text(json.dumps(command))
    return out


def test_the_lives_are_read_as_one_run_each_step_from_its_last_life(tmp_path):
    j = lives.joined(write_run(tmp_path / "r"))
    assert [life.start for life in j.lives] == [0, 2]
    census = j.probes["census"]
    assert [(r["life"], r["flush"]) for r in census] == [(1, 0), (1, 1), (2, 2), (2, 3)]
    assert [r["life"] for r in j.probes["train_data"]] == [1, 1, 2, 2]
    weights = [(r["life"], r["version"], r["digest"]) for r in j.probes["trainer_weights"]]
    assert weights == [(1, "1", "w1"), (1, "2", "w2"), (2, "3", "w3"), (2, "4", "x4"),
                       (2, "5", "x5")]  # fmt: skip
    assert j.wandb_ids == {1: {"0a1b2c3d"}, 2: {"0a1b2c3d"}}


def test_every_group_is_accounted_once_across_the_lives(tmp_path):
    ok, said = lives.accounted(lives.joined(write_run(tmp_path / "r")))
    assert ok, said
    assert "had drawn 9 groups: 4 trained and 1 dropped or aborted in steps 0..1, 4 lost" in said


def test_a_group_trained_twice_across_the_restart_fails(tmp_path):
    life2 = {**LIFE2, "train_data": [_samples(9, 10), _samples(11, 2)]}  # 2: trained in life 1
    ok, said = lives.accounted(lives.joined(write_run(tmp_path / "r", life2=life2)))
    assert not ok and "groups trained twice in the joined history: [2]" in said


def test_a_lost_group_trained_by_the_later_life_fails(tmp_path):
    life2 = {**LIFE2, "train_data": [_samples(9, 10), _samples(11, 6)]}  # 6: lost at the restart
    ok, said = lives.accounted(lives.joined(write_run(tmp_path / "r", life2=life2)))
    assert not ok and "trained groups drawn before its checkpoint: [6, 6]" in said


def test_a_restart_that_counts_its_losses_wrong_fails(tmp_path):
    ok, said = lives.accounted(lives.joined(write_run(tmp_path / "r", lost=3)))
    assert not ok and "counts 4 groups lost at the restart" in said


def test_the_resume_point_is_the_checkpoints_weights_and_the_judge_reads_each_step_once(
    tmp_path,
):
    j = lives.joined(write_run(tmp_path / "r"))
    steps = {"rollout/step": [0, 1, 2, 3], "train/step": [0, 1, 2, 3]}
    ok, said = lives.resume_check(j, "resumed (2 lives: ...)", steps, 3)
    assert ok, said
    assert (
        "life 2 resumed at step 2 (Miles' start_rollout_id) from the checkpoint of step 1" in said
    )
    twice = {"rollout/step": [0, 1, 2, 2, 3], "train/step": [0, 1, 2, 3]}
    assert not lives.resume_check(j, "resumed", twice, 3)[0]  # a re-trained step read twice
    assert not lives.resume_check(j, None, steps, 3)[0]  # no step was logged twice
    life2 = {**LIFE2, "trainer_weights": _weights("zz", "x4", "x5")}
    j2 = lives.joined(write_run(tmp_path / "r2", life2=life2))
    ok, said = lives.resume_check(j2, "resumed", steps, 3)
    assert not ok and "is not the checkpoint's weights" in said


def test_coins_are_the_groups_own_in_every_life(tmp_path):
    j = lives.joined(write_run(tmp_path / "r"))
    ok, said = lives.coins(j, "protect", A)
    assert ok and "1 stale decisions, each the group's coin" in said, said
    kept = coin(SEED, 12) < A
    wrong = {**LIFE2, "gate": [*LIFE2["gate"][:-1],
                               {**LIFE2["gate"][-1], "bucket": "dropped_stale" if kept
                                else "trained_protected"}]}  # fmt: skip
    j2 = lives.joined(write_run(tmp_path / "r2", life2=wrong))
    assert not lives.coins(j2, "protect", A)[0]
    assert lives.coins(j, "pace", None) == (True, "does not apply: only protect draws a coin")


@pytest.mark.parametrize(
    ("staleness", "current", "ok"), [(0, 1, True), (1, 1, False), (3, 2, False)]
)
def test_no_group_of_the_later_life_reads_stale_by_the_restart(tmp_path, staleness, current, ok):
    life2 = {**LIFE2, "gate": [_gate(0, 9, staleness, current), *LIFE2["gate"][1:]]}
    j = lives.joined(write_run(tmp_path / "r", life2=life2))
    assert lives.restarted(j, "protect", "tis", [], 1)[0] is ok


def test_a_run_never_killed_has_nothing_to_check(tmp_path):
    assert lives.joined(tmp_path) is None
    for check in (lives.accounted(None), lives.coins(None, "protect", A),
                  lives.restarted(None, "protect", "tis", [], 1),
                  lives.resume_check(None, None, {}, 3)):  # fmt: skip
        assert check == (True, lives.NOT_KILLED)
