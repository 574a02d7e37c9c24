"""One reader of wandb's records, one key convention: the judge, the rehearsal's report and
the online reading see the same rows (runs written here with wandb itself, offline)."""

from __future__ import annotations

import math

import pytest

from rescue.errors import InputError
from rescue.judge.inputs import read_wandb
from rescue.rehearsal.verdict.report import wandb_history
from rescue.tracking.history import KEY_JOIN, decode, flatten, read_offline

wandb = pytest.importorskip("wandb")

NESTED = {
    "rollout/step": 0,
    "rollout/census/outcome/solved": 3.0,
    "agent": {"turns": {"mean": 4.5, "max": 9}, "ran_tests": 1},
    "train/rescue/update_norm": float("nan"),
    "limit": float("inf"),
}


def _log(tmp_path, rows, **init):
    run = wandb.init(mode="offline", dir=str(tmp_path), project="rescue-test",
                     reinit="create_new", settings=wandb.Settings(silent=True, console="off"),
                     **init)  # fmt: skip
    for r in rows:
        run.log(r)
    run.finish()
    return sorted((tmp_path / "wandb").glob("offline-run-*"))


def test_a_nested_key_reads_the_same_through_every_reader(tmp_path):
    dirs = _log(tmp_path, [NESTED], group="swe-drop-k2-seed1", name="swe-drop-k2-seed1")
    want = {"agent.turns.mean": 4.5, "agent.turns.max": 9, "agent.ran_tests": 1}
    assert KEY_JOIN == "." and flatten(NESTED)["agent.turns.mean"] == 4.5
    judged = read_wandb(dirs[0]).rows
    rehearsal = wandb_history(dirs)
    assert judged == rehearsal  # one reader: the same rows, key for key
    [row] = judged
    assert {k: row[k] for k in want} == want
    assert not any("/" in k and k.startswith("agent") for k in row)  # never a/b for nested
    assert row["rollout/census/outcome/solved"] == 3.0  # flat keys keep their slashes
    assert math.isnan(row["train/rescue/update_norm"]) and row["limit"] == math.inf


def test_wandbs_non_finite_spellings_read_back_as_numbers():
    assert math.isnan(decode("NaN")) and decode("Infinity") == math.inf
    assert decode("-Infinity") == -math.inf and decode("drop") == "drop" and decode(2) == 2


def test_the_folders_of_one_run_id_join_in_order_with_the_first_names(tmp_path):
    for row, tags in (({"rollout/step": 0, "a": 1.0}, ["arm:zero", "seed:2"]), ({"b": 2.0}, [])):
        _log(tmp_path, [row], id="run1", resume="allow", group="rlvr-zero-cap32-seed2", tags=tags)
    dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    log = read_offline(dirs)
    assert log.run_id == "run1" and log.group == "rlvr-zero-cap32-seed2"
    assert log.tags == ["arm:zero", "seed:2"]
    assert [("a" in r, "b" in r) for r in log.rows] == [(True, False), (False, True)]
    assert log.source.endswith("(+1)")


def test_a_folder_without_a_transaction_log_is_one_line(tmp_path):
    (tmp_path / "offline-run-x").mkdir()
    with pytest.raises(InputError, match=r"no run-\*\.wandb transaction log"):
        read_offline([tmp_path / "offline-run-x"])
    with pytest.raises(InputError, match="no offline-run folder"):
        read_offline([])
