"""A resumed run read by the judge: each step once, from the last life that logged it
(``rescue.judge.lives``), with a known answer: the uninterrupted run of the same seed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from synthetic_runs import make_run

from rescue.judge.inputs import read_inputs
from rescue.judge.lives import each_step_once
from rescue.judge.quantities import QUANTITIES, series
from rescue.restart import LIFE_KEY

STEPS = 6


def uninterrupted() -> list[dict]:
    """What an uninterrupted run logs: per step a census row (rollout/step) and a trainer
    row (train/step), in time order."""
    rows = []
    for r in make_run("protect-a0.5", 1, steps=STEPS, family="swe", noise=0.0).rows:
        s = int(r["rollout/step"])
        rows.append({**r, LIFE_KEY: 1.0, "_timestamp": 100.0 + 10 * s})
        rows.append({"train/step": s, "train/rescue/update_norm": 1.0 + s,
                     "_timestamp": 105.0 + 10 * s})  # fmt: skip
    return rows


def _step(row: dict) -> int:
    return int(row.get("rollout/step", row.get("train/step")))


#: Keys a life does not change: its number, the time and the steps.
_KEEP = (LIFE_KEY, "_timestamp", "rollout/step", "train/step")


def resumed(checkpoint: int = 1, killed_after: int = 3) -> list[dict]:
    """The same run killed after logging step ``killed_after`` and resumed from the
    checkpoint of step ``checkpoint``: life 1 logged the steps after the checkpoint with
    other values (it trained other groups there, then lost them), life 2 logged them again
    with the run's."""
    life1 = []
    for row in uninterrupted():
        if _step(row) > killed_after:
            continue
        if _step(row) > checkpoint:
            row = {k: v * 3.0 if k not in _KEEP and isinstance(v, float) else v
                   for k, v in row.items()}  # fmt: skip
        life1.append(row)
    life2 = [
        {
            **row,
            "_timestamp": row["_timestamp"] + 1000.0,
            **({LIFE_KEY: 2.0} if LIFE_KEY in row else {}),
        }
        for row in uninterrupted()
        if _step(row) > checkpoint
    ]
    return life1 + life2


def _steps(rows, key):
    return [r[key] for r in rows if key in r]


def test_a_resumed_run_reads_the_step_sequence_of_the_uninterrupted_run():
    rows, note = each_step_once(resumed())
    want = uninterrupted()
    assert _steps(rows, "rollout/step") == _steps(want, "rollout/step") == list(range(STEPS))
    assert _steps(rows, "train/step") == list(range(STEPS))
    for got, w in zip(rows, want, strict=True):  # the values of the run: life 2's
        assert {k: v for k, v in got.items() if k not in (LIFE_KEY, "_timestamp")} == {
            k: v for k, v in w.items() if k not in (LIFE_KEY, "_timestamp")
        }
    assert note.startswith("resumed (2 lives: life 1 from step 0, life 2 from step 2)")
    assert "4 rows of steps an earlier life logged and a later one trained again left out" in note


def test_a_run_with_one_life_comes_back_unchanged():
    rows = uninterrupted()
    assert each_step_once(rows) == (rows, None)


def test_the_judges_quantities_on_a_resumed_run_are_the_uninterrupted_runs(tmp_path):
    """Read through the judge's reader, a resumed run's cap-hit series is the uninterrupted
    run's: a step trained twice counted twice (or from the earlier life) would differ."""
    for name, rows in (("swe-protect-a0.5-seed1", uninterrupted()),
                       ("swe-protect-a0.5-seed2", resumed())):  # fmt: skip
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    inputs = read_inputs([tmp_path], progress=False)
    by_seed = {r.seed: r for r in inputs.runs}
    a, b = (series(by_seed[s], QUANTITIES["cap_hit"]) for s in (1, 2))
    assert np.array_equal(a.step, b.step) and np.allclose(a.values(), b.values())
    naive = [r for r in resumed() if "rollout/census/cap_hit_rate" in r]
    assert len(naive) == STEPS + 2  # steps 2 and 3 logged twice
    assert [n for n in inputs.notes if "resumed (2 lives" in n] == [
        f"{by_seed[2].source}: {by_seed[2].notes[0]}"
    ]


def test_the_offline_folders_of_two_lives_of_one_run_id_are_read_once_per_step(tmp_path):
    """Two lives of one run id, each with a process for the census and one for the trainer
    (each its own offline folder): one run, every step once, the later life's."""
    wandb = pytest.importorskip("wandb")
    lives = {1: [r for r in resumed() if r["_timestamp"] < 1000],
             2: [r for r in resumed() if r["_timestamp"] >= 1000]}  # fmt: skip
    for life in (1, 2):
        for part in ("rollout/step", "train/step"):
            run = wandb.init(
                mode="offline", dir=str(tmp_path), project="rescue-test", id="resumed1",
                resume="allow", group="swe-protect-a0.5-seed1", name="swe-protect-a0.5-seed1",
                reinit="create_new", settings=wandb.Settings(silent=True, console="off"),
            )  # fmt: skip
            for row in lives[life]:
                if part in row:
                    run.log({k: v for k, v in row.items() if k != "_timestamp"})
            run.finish()
    [one] = read_inputs([tmp_path / "wandb"], progress=False).runs
    census = [r for r in one.rows if "rollout/census/cap_hit_rate" in r]
    assert [r["rollout/step"] for r in census] == list(range(STEPS))
    want = {int(r["rollout/step"]): r["rollout/census/cap_hit_rate"]
            for r in uninterrupted() if "rollout/step" in r}  # fmt: skip
    assert all(
        math.isclose(r["rollout/census/cap_hit_rate"], want[r["rollout/step"]]) for r in census
    )
    assert sorted(r["train/step"] for r in one.rows if "train/step" in r) == list(range(STEPS))
    assert one.notes and one.notes[0].startswith("resumed (2 lives")
