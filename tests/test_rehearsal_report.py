"""The rehearsal's report fails on each defect it exists to catch (synthetic run folders)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from rescue.advantages import group_advantages
from rescue.rehearsal import report as rep
from rescue.rehearsal.report import (
    BUCKETS,
    GROUPS,
    Report,
    _check_outcomes,
    _check_steps,
    _check_unused,
    _check_weights,
    check_run,
    wandb_records,
)


def _frame(payload: bytes, kind: int) -> bytes:
    return struct.pack("<IHB", zlib.crc32(payload), len(payload), kind) + payload


def test_wandb_records_reassembles_chunks_across_blocks(tmp_path):
    small, big = b"a" * 10, bytes(range(256)) * 200  # big spans two 32 KiB blocks
    first = 32768 - 7 - (7 + len(small)) - 7
    data = b":W&B\xe1\xbe\x00" + _frame(small, 1) + _frame(big[:first], 2)
    rest = big[first:]
    data += _frame(rest, 4)
    path = tmp_path / "run.wandb"
    path.write_bytes(data)
    assert wandb_records(path) == [small, big]
    path.write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a wandb run file"):
        wandb_records(path)


def _step(entered: float, buffered: float, **buckets: float) -> dict:
    row = {f"{GROUPS}entered": entered, f"{GROUPS}buffered": buffered}
    row.update({GROUPS + b: float(buckets.get(b, 0)) for b in BUCKETS})
    return row


def test_steps_check_catches_a_missing_step_and_broken_conservation():
    good = {0: _step(3, 1, trained_fresh=2), 1: _step(2, 1, trained_fresh=1, dropped_stale=1)}
    r = Report()
    _check_steps(r, good)
    assert r.ok
    r = Report()
    _check_steps(r, {**good, 2: {}})
    assert not r.ok and "steps [2]" in r.checks[0].detail
    r = Report()
    _check_steps(r, {0: _step(3, 0, trained_fresh=2)})
    assert not r.ok and "conservation broken" in r.checks[0].detail


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


def test_weights_check_needs_protected_samples_with_1_over_a_in_the_reward():
    protected = _samples([2.0] * 4 + [None] * 4)
    r = Report()
    _check_weights(r, [protected], "protect", 0.5)
    assert r.ok, r.checks
    r = Report()
    _check_weights(r, [_samples([None] * 8)], "protect", 0.5)
    assert not r.ok and "no protected sample" in r.checks[0].detail
    unweighted_reward = _samples([None] * 8)
    for s in unweighted_reward[:4]:
        s["rescue_weight"] = 2.0  # the weight is on the sample but never reached the reward
    r = Report()
    _check_weights(r, [unweighted_reward], "protect", 0.5)
    assert not r.ok and "not weight x group advantage" in r.checks[0].detail
    r = Report()
    _check_weights(r, [_samples([4.0] * 4 + [None] * 4)], "protect", 0.5)
    assert not r.ok and "other than 1/a" in r.checks[0].detail
    r = Report()
    _check_weights(r, [protected], "drop", None)
    assert not r.ok and "weighted samples" in r.checks[0].detail


def test_unused_check_needs_every_dropped_and_aborted_group_at_the_handler():
    steps = {0: {f"{GROUPS}dropped_stale": 2.0, f"{GROUPS}aborted": 1.0}}
    r = Report()
    _check_unused(r, steps, [{"samples": []}] * 3, "drop")
    assert r.ok
    r = Report()
    _check_unused(r, steps, [{"samples": []}] * 2, "drop")
    assert not r.ok
    r = Report()
    _check_unused(r, {0: {f"{GROUPS}aborted": 1.0}}, [{"samples": []}], "protect")
    assert not r.ok and "no stale group was dropped" in r.checks[0].detail
    r = Report()
    _check_unused(r, {0: {f"{GROUPS}aborted": 1.0}}, [{"samples": []}], "never-drop")
    assert r.ok


def test_outcomes_check_names_each_class_never_seen(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "calls.log").write_text(json.dumps(["run", "-d", "img.gone"]) + "\n")
    train = [
        {"outcome": o, "outcome_reason": r}
        for o, r in [("solved", "resolved"), ("budget_failure", "turn_cap")]
    ]
    r = Report()
    _check_outcomes(r, train, {0: {f"{GROUPS}aborted": 1.0}}, tmp_path)
    detail = r.checks[0].detail
    assert not r.ok and "submitted_failure/unresolved" in detail
    assert "budget_failure/context_limit" in detail and "infra" not in detail
    r = Report()
    _check_outcomes(r, train, {0: {}}, tmp_path)
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
    text = report.render(wall_s=12.0)
    assert text.splitlines()[-1].startswith("rehearsal: FAILED: job:")
    assert "wall time: 12 s" in text


def test_report_json_has_every_check(tmp_path):
    r = Report()
    r.add("job", True, "ok")
    d = r.as_dict(wall_s=1.0)
    assert d["ok"] and d["checks"][0]["name"] == "job" and d["wall_s"] == 1.0
    assert Path(tmp_path).exists()
