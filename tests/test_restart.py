"""A run's lives (``rescue.restart``): the ledger, what a restart loses, counted once; and the
Miles buffer across a kill and a resume from Miles' checkpoint (``rescue.miles.restart``),
on the tests' samples and FIFO store (no Miles needed)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from buffer_store import FifoStore, load_function
from test_miles_buffer import fake_group

from rescue.census import Bucket
from rescue.miles.buffer import RescueDataBuffer
from rescue.miles.restart import DATA_STATE, TRACKER, resume_point
from rescue.restart import (
    LEDGER,
    LIFE_KEY,
    Flush,
    Ledger,
    Life,
    LifeLog,
    append,
    describe,
    joined,
    read,
    restart,
)

P = "rollout/census/"


# ── the ledger ───────────────────────────────────────────────────────────────


def test_the_joined_history_takes_each_step_from_the_last_life_that_logged_it():
    ledger = Ledger(
        lives=[Life(1, 0), Life(2, 2, checkpoint=1), Life(3, 3, checkpoint=2)],
        flushes=[Flush(1, r, 0, r) for r in range(4)]  # life 1 logged 0..3
        + [Flush(2, r, 0, 10 + r) for r in (2, 3, 4)]  # life 2 trained 2..4 again
        + [Flush(3, r, 0, 20 + r) for r in (3, 4, 5)],  # life 3 from 3
    )
    rows = joined(ledger)
    assert [(r.life, r.rollout) for r in rows] == [(1, 0), (1, 1), (2, 2), (3, 3), (3, 4), (3, 5)]


def test_a_restart_loses_the_open_and_the_unseen_groups_of_its_checkpoint_step():
    # step 1's census: 7 settled for good, 2 open; the checkpoint had drawn 12 groups
    ledger = Ledger([Life(1, 0)], [Flush(1, 0, 3, 2), Flush(1, 1, 2, 7), Flush(1, 2, 1, 11)])
    life, base = restart(ledger, checkpoint=1, drawn=12, clock=lambda: 5.0)
    assert (life.life, life.start, life.carried, life.unseen, life.lost) == (2, 2, 2, 3, 5)
    assert base == 7 and not life.unknown and life.resumed
    assert "resumed from the checkpoint of step 1 at step 2; 5 groups lost" in describe(life)


@pytest.mark.parametrize(
    ("flushes", "drawn", "why"),
    [
        ([], 12, "the ledger has no census of step 1"),
        ([Flush(1, 1, 2, 7)], None, "holds no data-source counters"),
        ([Flush(1, 1, 2, 7)], 8, "fewer than the 7 settled and 2 open"),
    ],
)
def test_a_restart_whose_counts_cannot_be_told_says_why(flushes, drawn, why):
    life, _ = restart(Ledger([Life(1, 0)], flushes), checkpoint=1, drawn=drawn)
    assert why in life.unknown and "unknown" in describe(life)
    assert life.unseen == 0


def test_a_life_that_starts_from_nothing_loses_nothing():
    life, base = restart(Ledger([Life(1, 0)], [Flush(1, 0, 1, 3)]), checkpoint=None, drawn=None)
    assert (life.life, life.start, life.lost, base) == (2, 0, 0, 0) and not life.resumed


def test_a_torn_last_line_is_passed_over(tmp_path):
    path = tmp_path / LEDGER
    append(path, {"life": 1, "start": 0, "time": 1.0})
    append(path, {"life": 1, "rollout": 0, "open": 1, "final": 2})
    with open(path, "a") as f:
        f.write('{"life": 1, "rollout": 1, "op')  # the kill cut this write
    ledger = read(path)
    assert ledger.lives == [Life(1, 0, 1.0)] and ledger.flushes == [Flush(1, 0, 1, 2)]


# ── Miles' checkpoint ────────────────────────────────────────────────────────


def _checkpoint(folder, step, drawn):
    torch = pytest.importorskip("torch")
    (folder / TRACKER).write_text(f"{step}\n")
    state = folder / DATA_STATE.format(step=step)
    state.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"sample_offset": drawn, "epoch_id": 0, "sample_group_index": drawn,
                "sample_index": drawn * 3, "metadata": {}}, state)  # fmt: skip


def test_the_resume_point_is_megatrons_tracker_and_the_data_sources_counter(tmp_path):
    fresh = SimpleNamespace(start_rollout_id=0, load=str(tmp_path / "ref"), ckpt_step=None)
    assert resume_point(fresh) == (None, None)
    _checkpoint(tmp_path, 4, 23)
    resumed = SimpleNamespace(start_rollout_id=None, load=str(tmp_path), ckpt_step=None)
    assert resume_point(resumed) == (4, 23)
    (tmp_path / DATA_STATE.format(step=4)).unlink()
    assert resume_point(resumed) == (4, None)
    assert resume_point(
        SimpleNamespace(start_rollout_id=None, load=str(tmp_path), ckpt_step=2)
    ) == (2, None)


# ── the buffer across a kill and a resume ────────────────────────────────────


def _buffer(save, *, start=0, load=None, handler="drop", arm="never-drop"):
    args = SimpleNamespace(
        max_weight_staleness=0, dynamic_sampling_filter_path=None, reward_key=None,
        save=str(save), load=load, start_rollout_id=start, ckpt_step=None,
        async_unused_samples_handler=handler,
    )  # fmt: skip
    return RescueDataBuffer(
        SimpleNamespace(args=args, unused_handler_fn=lambda g: None),
        env={"RESCUE_ARM": arm},
        store=FifoStore(1000),
        load_function=load_function,
    )


async def _step(buffer, put, get, version=0):
    for gid in put:
        await buffer.put(SimpleNamespace(prompt_group=fake_group(gid), group=fake_group(gid)))
    trained = [(await buffer.get(current_version=version)).group[0].group_index for _ in range(get)]
    return trained, buffer.get_metrics()


def test_the_buffer_counts_what_the_restart_lost_once_and_the_joined_census_conserves(tmp_path):
    """Life 1 draws groups 0..9 and trains 2 a step; Miles checkpoints after step 1 with 9
    groups drawn (7 entered by step 1's census, 2 of them still buffered; 2 in flight); life 1
    trains step 2 and dies. Life 2 resumes at step 2: the 4 groups lost settle in its first
    census, and every group id below 9 is settled once in the joined history."""

    async def life_1():
        b = _buffer(tmp_path)
        rows = [await _step(b, range(0, 3), 2), await _step(b, range(3, 7), 3)]
        _checkpoint(tmp_path, 1, 9)  # 7, 8 in flight at the checkpoint
        rows.append(await _step(b, range(7, 10), 3))  # step 2, trained again by life 2
        return rows

    async def life_2():
        b = _buffer(tmp_path, start=None, load=str(tmp_path))
        return b, [await _step(b, range(9, 12), 2), await _step(b, range(12, 14), 3)]

    rows1 = asyncio.run(life_1())
    b2, rows2 = asyncio.run(life_2())
    assert b2.lives.life == Life(
        2, 2, b2.lives.life.time, checkpoint=1, drawn=9, carried=2, unseen=2
    )
    first = rows2[0][1]
    assert first[f"{P}groups/lost_at_restart"] == 4 and first[LIFE_KEY] == 2.0
    assert rows1[0][1][LIFE_KEY] == 1.0
    kept = [m for _, m in rows1[:2]] + [m for _, m in rows2]  # the joined history
    entered = settled = 0.0
    for m in kept:
        entered += m[f"{P}groups/entered"]
        settled += sum(m[f"{P}groups/{b.value}"] for b in Bucket)
        assert entered == settled + m[f"{P}groups/buffered"]
    trained_before = {g for trained, _ in rows1[:2] for g in trained}
    trained_after = {g for trained, _ in rows2 for g in trained}
    assert trained_before == {0, 1, 2, 3, 4} and min(trained_after) >= 9  # none trained twice
    assert len(trained_before) + first[f"{P}groups/lost_at_restart"] == 9  # ids 0..8, once
    ledger = read(tmp_path / LEDGER)
    assert [(r.life, r.rollout) for r in joined(ledger)] == [(1, 0), (1, 1), (2, 2), (2, 3)]
    assert joined(ledger)[-1].final == 5 + 4 + 2 + 3  # trained 0..4, lost 4, then 2 and 3


def test_a_retry_handler_leaves_recycled_groups_unsettled_for_good(tmp_path):
    """Under ``retry`` a dropped stale group goes back to be generated: at the checkpoint it
    is not settled for good, so the restart counts it lost (it is not in the counters)."""

    async def life_1():
        b = _buffer(tmp_path, handler="retry", arm="drop")
        await b.put(SimpleNamespace(prompt_group=fake_group(0), group=fake_group(0, version=0)))
        await b.put(SimpleNamespace(prompt_group=fake_group(1), group=fake_group(1, version=5)))
        kept = await b.get(current_version=5)  # group 0 is stale at K = 0: dropped, recycled
        assert kept.group[0].group_index == 1
        return b.get_metrics()

    m = asyncio.run(life_1())
    assert m[f"{P}groups/dropped_stale"] == 1
    assert json.loads((tmp_path / LEDGER).read_text().splitlines()[-1])["final"] == 1
    _checkpoint(tmp_path, 0, 2)
    life = LifeLog(tmp_path, checkpoint=0, drawn=2).life
    assert (life.carried, life.unseen) == (0, 1)


# ── rescue status of an arm's run ────────────────────────────────────────────


def test_rescue_status_says_the_run_was_resumed_from_which_step_and_what_it_lost(tmp_path, capsys):
    from rescue import cli

    save = tmp_path / "runs" / "swe-protect-a0.5-k0-seed1" / "checkpoints"
    save.mkdir(parents=True)
    (save / "rescue-run.json").write_text(json.dumps({
        "wandb_run_id": "0a1b2c3d",
        "launches": [{"time": "2026-12-07T10:00:00+0000", "resume": False},
                     {"time": "2026-12-07T11:00:00+0000", "resume": True}],
    }))  # fmt: skip
    (save / TRACKER).write_text("3\n")
    ledger = save / LEDGER
    append(ledger, {"life": 1, "start": 0, "time": 1.0})
    for r in range(3):
        append(ledger, {"life": 1, "rollout": r, "open": 2, "final": 2 * r + 2})
    append(ledger, {"life": 2, "start": 2, "time": 2.0, "checkpoint": 1, "drawn": 9,
                    "carried": 2, "unseen": 3})  # fmt: skip
    append(ledger, {"life": 2, "rollout": 2, "open": 1, "final": 13})
    for where in (save, save.parent, tmp_path):  # the save dir, the run, a rehearsal's folder
        assert cli.main(["status", str(where)]) == 0
        out = capsys.readouterr().out
        assert f"arm run in {save} (wandb run 0a1b2c3d)" in out
        assert "2026-12-07T11:00:00+0000 (RESUME=1): resumed 1 times" in out
        assert "life 2: resumed from the checkpoint of step 1 at step 2; 5 groups lost at the " \
               "restart (2 buffered, 3 in flight or not settled by then)" in out  # fmt: skip
        assert "last census: step 2 (life 2)" in out and "latest checkpoint: step 3" in out
