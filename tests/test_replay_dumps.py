"""Loading debug rollout dumps: schema, trajectories, turn indices, errors, safe unpickling."""

import fractions
import os
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rescue.outcomes import Outcome  # noqa: E402
from rescue.replay.dumps import load_dumps, parse_payload, token_turn_index  # noqa: E402
from rescue.replay.synthetic import sample_dict, synthetic_step  # noqa: E402


def _save(tmp_path, name, payload):
    path = tmp_path / name
    torch.save(payload, path)
    return str(path)


def test_turn_index_numbers_runs_of_ones_and_zeroes_observations():
    assert token_turn_index([1, 1, 0, 0, 1, 0, 1, 1], 8).tolist() == [1, 1, 0, 0, 2, 0, 3, 3]
    assert token_turn_index([0, 1, 1], 3).tolist() == [0, 1, 1]
    assert token_turn_index(None, 3).tolist() == [1, 1, 1]
    assert token_turn_index([1, 0, 1], 3, first_turn=4).tolist() == [4, 0, 5]
    assert token_turn_index([], 0).tolist() == []


def test_glob_of_steps_loads_every_sample_into_one_trajectory_each(tmp_path):
    for step in (2, 10):
        _save(
            tmp_path, f"rollout_{step}.pt", synthetic_step(rollout_id=step, seed=step, p_abort=0.2)
        )
    dumps = load_dumps([str(tmp_path / "rollout_*.pt")])
    assert [d.step for d in dumps] == [2, 10]  # natural order, step = rollout_id
    for d in dumps:
        assert len(d.trajectories) == len(d.samples) == 16
        for t in d.trajectories:
            s = d.samples[t.samples[0]]
            assert t.group == (d.step, s["group_index"])
            assert t.turns == len(s["weight_versions"])  # one generation call per turn
            (turns,) = t.token_turns
            assert len(turns) == s["response_length"]
            assert ((turns > 0) == np.asarray(s["loss_mask"], bool)).all()
            expected = {
                "completed": (Outcome.SOLVED, Outcome.SUBMITTED_FAILURE),
                "truncated": (Outcome.BUDGET_FAILURE,),
                "aborted": (Outcome.INFRA_NO_RESULT,),
            }[s["status"]]
            assert t.record.outcome in expected
            assert t.capped == (s["status"] == "truncated")


def test_siblings_sharing_rollout_id_form_one_trajectory_with_continued_turns():
    a = sample_dict(group_index=0, index=0, rollout_id=7, tokens=[1, 2, 3, 4], response_length=3,
                    loss_mask=[1, 0, 1], reward=1.0, status="completed", weight_versions=["1", "1"])  # fmt: skip
    b = sample_dict(group_index=0, index=1, rollout_id=7, tokens=[1, 2, 5, 6], response_length=2,
                    loss_mask=[1, 1], reward=1.0, status="completed", weight_versions=["2"])  # fmt: skip
    c = sample_dict(group_index=0, index=2, tokens=[1, 2, 9], response_length=1, loss_mask=[1],
                    reward=0.0, status="truncated")  # fmt: skip
    d = parse_payload({"rollout_id": 3, "samples": [a, b, c]}, source="x.pt")
    assert len(d.trajectories) == 2
    first, second = d.trajectories
    assert first.samples == (0, 1) and first.turns == 3
    assert [t.tolist() for t in first.token_turns] == [[1, 0, 2], [3, 3]]
    assert first.record.outcome is Outcome.SOLVED
    assert second.capped and second.turns == 1
    b["reward"] = 0.0
    with pytest.raises(ValueError, match="siblings must share one reward"):
        parse_payload({"samples": [a, b]}, source="x.pt")


@pytest.mark.parametrize("field", ["group_index", "status", "reward", "loss_mask", "metadata"])
def test_missing_field_names_file_sample_and_field(field):
    samples = synthetic_step()["samples"]
    del samples[5][field]
    with pytest.raises(
        ValueError, match=rf"step_0\.pt: samples\[5\] \(index=5\) has no field '{field}'"
    ):
        parse_payload({"samples": samples}, source="step_0.pt")


def test_tokens_are_required_only_for_gradients():
    samples = synthetic_step()["samples"]
    del samples[2]["tokens"]
    parse_payload({"samples": samples})
    with pytest.raises(ValueError, match=r"samples\[2\].*'tokens'"):
        parse_payload({"samples": samples}, need_tokens=True)


def test_bad_group_and_mask_are_errors_naming_the_sample():
    samples = synthetic_step()["samples"]
    samples[1]["group_index"] = None
    with pytest.raises(ValueError, match=r"samples\[1\].*group_index=None"):
        parse_payload({"samples": samples})
    samples = synthetic_step()["samples"]
    samples[3]["loss_mask"] = samples[3]["loss_mask"][:-1]
    with pytest.raises(ValueError, match=r"samples\[3\].*'loss_mask' has"):
        parse_payload({"samples": samples})
    with pytest.raises(ValueError, match="no 'samples' list"):
        parse_payload({"rollout_id": 0}, source="f.pt")


def test_dict_reward_needs_reward_key_and_honours_it():
    samples = synthetic_step()["samples"]
    for s in samples:
        s["reward"] = {"score": s["reward"], "acc": 1.0}
    with pytest.raises(ValueError, match="--reward-key"):
        parse_payload({"samples": samples})
    with pytest.raises(ValueError, match="no key 'nope'"):
        parse_payload({"samples": samples}, reward_key="nope")
    d = parse_payload({"samples": samples}, reward_key="score")
    assert [t.reward for t in d.trajectories] == [s["reward"]["score"] for s in samples]
    d = parse_payload({"samples": samples}, reward_key="acc")
    assert all(t.reward == 1.0 for t in d.trajectories)


def test_numpy_arrays_and_framework_classes_load_with_weights_only(tmp_path, monkeypatch):
    """A Miles dataclass is replaced by an inert stand-in; Miles is never imported."""
    fake = types.ModuleType("miles.utils.types")

    class AdapterRef:
        def __init__(self, name, slot):
            self.name, self.slot = name, slot

    AdapterRef.__module__ = "miles.utils.types"
    AdapterRef.__qualname__ = "AdapterRef"
    fake.AdapterRef = AdapterRef
    for name in ("miles", "miles.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "miles.utils.types", fake)
    payload = synthetic_step()
    payload["samples"][0]["adapter"] = AdapterRef("lora", 1)
    payload["samples"][0]["rollout_routed_experts"] = np.zeros((3, 2, 1), dtype=np.int32)
    path = _save(tmp_path, "step_0.pt", payload)
    for name in ("miles", "miles.utils", "miles.utils.types"):
        monkeypatch.delitem(sys.modules, name)

    (d,) = load_dumps([path])
    assert d.samples[0]["adapter"].__dict__ == {"name": "lora", "slot": 1}
    assert d.samples[0]["rollout_routed_experts"].shape == (3, 2, 1)
    assert "miles" not in sys.modules


def test_other_globals_are_refused_unless_unsafe_load(tmp_path):
    payload = synthetic_step()
    payload["samples"][0]["metadata"] = {"frac": fractions.Fraction(1, 3)}
    path = _save(tmp_path, "step_0.pt", payload)
    with pytest.raises(ValueError, match=r"fractions\.Fraction.*--unsafe-load"):
        load_dumps([path])
    (d,) = load_dumps([path], unsafe_load=True)
    assert d.samples[0]["metadata"]["frac"] == fractions.Fraction(1, 3)


class _Payload:
    """An object whose unpickling would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_dump_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    payload = synthetic_step()
    payload["samples"][0]["metadata"] = {"x": _Payload(marker)}
    path = _save(tmp_path, "step_0.pt", payload)
    with pytest.raises(ValueError, match=r"(posix|os)\.system.*--unsafe-load"):
        load_dumps([path])
    assert not marker.exists()


def test_glob_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="matches no file"):
        load_dumps([str(tmp_path / "none_*.pt")])
    with pytest.raises(ValueError, match="is not a file"):
        load_dumps([str(tmp_path / "missing.pt")])


def test_two_files_of_one_rollout_are_refused_naming_both(tmp_path):
    run_a = tmp_path / "a"
    run_b = tmp_path / "b"
    run_a.mkdir()
    run_b.mkdir()
    first = _save(run_a, "3.pt", synthetic_step(rollout_id=3, seed=1))
    second = _save(run_b, "3.pt", synthetic_step(rollout_id=3, seed=2))
    _save(run_b, "4.pt", synthetic_step(rollout_id=4, seed=3))
    with pytest.raises(ValueError, match=f"{second}: rollout 3 is also in {first}; pass the dumps"):
        load_dumps([str(run_a / "*.pt"), str(run_b / "*.pt")])
    assert [d.step for d in load_dumps([str(run_b / "*.pt")])] == [3, 4]
