"""One reading of a sample: the reward hook reads each trainer sample once, into its view
(``rescue.samples.SampleView``), and every part of rescue it calls reads the view.

Two measures, on the tests' ``Sample`` under every setting the hook has (both estimators,
R = 0 on the cap, the survivors' baseline, protect's weights):

- every attribute read on a sample, with the module that read it: each field is read once
  per sample, by ``rescue.samples``; the hook itself asks the sample for Miles'
  ``get_reward_value`` and the turn estimator asks which channel it has (Miles' or slime's);
- every call that receives a sample, a list of them or a view, traced: the modules the
  samples pass through from ``post_process_rewards``, at most four (on main at ac70bca, five
  under the turn estimator: the hook, the budget rule, the sample model, the turn estimator
  and the model-call rules, which read the samples again).
"""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace

import pytest
from fake_sample import Sample

from rescue.reward import post_process_rewards
from rescue.samples import SampleView

READS: Counter = Counter()


class WatchedSample(Sample):
    """The tests' ``Sample``, counting each attribute read by (module, field, sample)."""

    def __getattribute__(self, name: str):
        if not name.startswith("__"):
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith("rescue"):
                READS[(module, name, id(self))] += 1
        return object.__getattribute__(self, name)


ARGS = SimpleNamespace(
    advantage_estimator="grpo",
    rewards_normalization=True,
    grpo_std_normalization=True,
    normalize_advantages=False,
    reward_key=None,
    n_samples_per_prompt=4,
    rollout_batch_size=2,
    loss_type="custom_loss",
    custom_loss_function_path="rescue.miles.loss.policy_loss",
    use_opd=False,
    object_store_backend="mooncake",
)
SETTINGS = {
    "group": {"RESCUE_ESTIMATOR": "group"},
    "group, R = 0 on the cap, survivors": {
        "RESCUE_ESTIMATOR": "group",
        "RESCUE_TRUNCATED_REWARD": "zero",
        "RESCUE_BASELINE": "survivors",
    },
    "turn, R = 0 on the cap": {"RESCUE_ESTIMATOR": "turn", "RESCUE_TRUNCATED_REWARD": "zero"},
}


def batch() -> list[WatchedSample]:
    """Two groups of four multi-turn samples: capped and finished, one masked, one group
    protected (weight 2), one with its model calls recorded."""
    out = []
    for g in range(2):
        for k in range(4):
            s = WatchedSample(
                group_index=g,
                index=4 * g + k,
                response_length=6,
                loss_mask=[1, 1, 0, 0, 1, 1],
                reward=float(k % 2),
                weight_versions=["1", "2"],
                status=Sample.Status.TRUNCATED if k == 0 else Sample.Status.COMPLETED,
                remove_sample=k == 3,
                metadata={"rescue_weight": 2.0} if g == 1 else {},
            )
            if k == 2:
                s.metadata["rescue_calls"] = [[0, 2, 1, False], [2, 6, 1, False]]
            s.opd_reverse_kl = None
            out.append(s)
    return out


@pytest.fixture(params=list(SETTINGS))
def setting(request, monkeypatch):
    for name in ("RESCUE_ESTIMATOR", "RESCUE_TRUNCATED_REWARD", "RESCUE_BASELINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in SETTINGS[request.param].items():
        monkeypatch.setenv(name, value)
    return request.param


def test_the_reward_hook_reads_each_field_of_a_sample_once_into_its_view(setting):
    samples = batch()
    READS.clear()
    post_process_rewards(ARGS, samples)
    assert READS, "no read was counted"
    allowed = {
        ("rescue.reward", "get_reward_value"),
        ("rescue.turn_reward", "opd_reverse_kl"),
    }
    elsewhere = {(m, f) for m, f, _ in READS if m != "rescue.samples"} - allowed
    assert not elsewhere, f"samples read outside rescue.samples: {sorted(elsewhere)}"
    twice = {(f, n) for (m, f, _), n in READS.items() if m == "rescue.samples" and n > 1}
    assert not twice, f"fields read more than once per sample: {sorted(twice)}"
    fields = {f for m, f, _ in READS if m == "rescue.samples"}
    assert {"metadata", "loss_mask", "weight_versions", "status", "reward"} <= fields


def _carries(value, ids) -> bool:
    if id(value) in ids or isinstance(value, SampleView):
        return True
    if isinstance(value, (list, tuple)) and value:
        head = value[0][0] if isinstance(value[0], list) and value[0] else value[0]
        return id(head) in ids or isinstance(head, SampleView)
    return False


def samples_path(samples) -> list[str]:
    """The rescue modules whose functions receive a sample, a list of them or a view, in
    the order the samples reach them, during ``post_process_rewards``."""
    ids = {id(s) for s in samples} | {id(samples)}
    seen: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("rescue") or module in seen:
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(_carries(frame.f_locals.get(n), ids) for n in names):
            seen.append(module)

    sys.setprofile(profile)
    try:
        post_process_rewards(ARGS, samples)
    finally:
        sys.setprofile(None)
    return seen


def test_the_samples_path_from_the_reward_hook_crosses_at_most_four_modules(setting):
    path = samples_path(batch())
    assert path[:2] == ["rescue.reward", "rescue.samples"]
    assert len(path) <= 4, path
    assert "rescue.model_calls" not in path and "rescue.turns" not in path
