"""Dumps written by Miles' own debug-dump code (needs MILES_SRC)."""

import argparse

import pytest

torch = pytest.importorskip("torch")

from miles_env import require_miles  # noqa: E402

from rescue.outcomes import Outcome  # noqa: E402
from rescue.replay.dumps import load_dumps  # noqa: E402
from rescue.replay.synthetic import MILES_SAMPLE_FIELDS, synthetic_step  # noqa: E402


@pytest.fixture
def miles():
    require_miles()
    from miles.ray.rollout import debug_data
    from miles.utils.types import Sample

    return Sample, debug_data


def test_synthetic_schema_is_miles_sample_to_dict(miles):
    Sample, _ = miles
    assert set(Sample().to_dict()) == set(MILES_SAMPLE_FIELDS)


def test_dump_written_by_miles_loads_without_miles_classes(miles, tmp_path):
    Sample, debug_data = miles
    samples = [Sample.from_dict(d) for d in synthetic_step(seed=3, p_abort=0.2)["samples"]]
    samples[0].reward = {"acc": samples[0].reward}  # one dict reward needs --reward-key
    template = str(tmp_path / "rollout_data" / "{rollout_id}.pt")
    args = argparse.Namespace(save_debug_rollout_data=template, save_debug_trajectory_data=None)
    debug_data.save_debug_rollout_data(args, samples, rollout_id=4, evaluation=False)

    with pytest.raises(ValueError, match=r"samples\[0\].*--reward-key"):
        load_dumps([str(tmp_path / "rollout_data" / "*.pt")])
    samples[0].reward = samples[0].reward["acc"]
    debug_data.save_debug_rollout_data(args, samples, rollout_id=4, evaluation=False)
    (d,) = load_dumps([str(tmp_path / "rollout_data" / "*.pt")])
    assert d.step == 4 and len(d.trajectories) == len(samples)
    for t in d.trajectories:
        s = samples[t.samples[0]]
        assert t.group == (4, s.group_index) and t.reward == s.reward
        assert (t.record.outcome is Outcome.INFRA_NO_RESULT) == (s.status is Sample.Status.ABORTED)
        assert t.capped == (s.status is Sample.Status.TRUNCATED)


def test_miles_loads_a_synthetic_dump(miles, tmp_path):
    """The synthetic dumps are real dumps: Miles' own loader turns them into Samples."""
    _, debug_data = miles
    payload = synthetic_step(seed=1)
    torch.save(payload, tmp_path / "0.pt")
    loaded, _ = debug_data._load_rollout_data_file(tmp_path / "0.pt")
    assert [s.to_dict() for s in loaded] == payload["samples"]
