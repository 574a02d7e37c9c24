"""The heads' transport: publication on the rollout side, lookup on the train side.

Without Ray an in-process registry holds the entries; with Ray (every Miles process) a
named actor holds object references, and a train rank in another process fetches them.
The Ray test starts its own head on a free port and stops exactly that process group.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_sample import Sample
from ray_head import RAY_ENV, local_ray_head

from rescue.errors import InputError
from rescue.miles import topk_store
from rescue.miles.topk import KEY, token_digest

K = 3


def sample(index, mask, *, seed=0, remove=False, heads=True, tokens=None):
    rng = np.random.default_rng(seed + index)
    n = len(mask)
    tokens = tokens or [int(t) for t in rng.integers(0, 50, size=4 + n)]
    s = Sample(group_index=0, index=index, tokens=tokens, response_length=n, loss_mask=list(mask),
               rollout_log_probs=[float(x) for x in -rng.random(n)], remove_sample=remove)  # fmt: skip
    trained = [t for t, m in enumerate(mask) if m]
    if heads:
        s.metadata[KEY] = {
            "positions": np.asarray(trained, dtype=np.int32),
            "ids": rng.integers(0, 50, size=(len(trained), K)).astype(np.int32),
            "logprobs": -rng.random((len(trained), K)).astype(np.float32),
            "digest": token_digest(tokens),
        }
    return s


def test_publish_puts_every_trained_samples_heads_under_the_rollout():
    samples = [
        sample(0, [1, 1, 0, 1]),
        sample(1, [0, 0]),
        sample(2, [1, 1], remove=True, heads=False),
    ]
    published, positions = topk_store.publish(41, samples)
    assert (published, positions) == (1, 3)  # sample 1 trains nothing, sample 2 is removed
    entries = topk_store._LOCAL.lookup(41)
    (entry,) = entries[token_digest(samples[0].tokens)]
    assert entry["positions"].tolist() == [0, 1, 3]
    np.testing.assert_array_equal(entry["ids"], samples[0].metadata[KEY]["ids"])
    np.testing.assert_allclose(entry["sampled"], samples[0].rollout_log_probs, rtol=1e-6)
    topk_store._LOCAL.release(42)
    assert topk_store._LOCAL.lookup(41) is None


def test_two_samples_with_the_same_tokens_are_both_kept():
    a = sample(0, [1, 1])
    b = sample(1, [1, 1], tokens=list(a.tokens), seed=9)
    b.metadata[KEY]["digest"] = token_digest(a.tokens)
    topk_store.publish(43, [a, b])
    assert len(topk_store._LOCAL.lookup(43)[token_digest(a.tokens)]) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.metadata.pop(KEY), "trains 2 positions but has no recorded heads"),
        (lambda s: s.tokens.append(7), "belong to other tokens"),
        (lambda s: s.metadata[KEY].update(positions=np.asarray([0], np.int32)),
         "1 trained positions have no recorded head \\(first at response position 1\\)"),
        (lambda s: setattr(s, "rollout_log_probs", None), "rollout_log_probs missing"),
    ],
)  # fmt: skip
def test_a_trained_sample_without_its_heads_stops_the_publication(change, message):
    s = sample(0, [1, 1])
    change(s)
    with pytest.raises(InputError, match=message):
        topk_store.publish(44, [s])


def test_the_trainer_needs_the_rollout_named_and_published():
    trainer = topk_store.Trainer()
    with pytest.raises(InputError, match="before-train-step hook"):
        trainer._step_entries()
    trainer.begin(999)
    with pytest.raises(InputError, match="no heads were published for rollout 999"):
        trainer._step_entries()


@pytest.fixture
def fake_miles_tracking(monkeypatch):
    """Stand-ins for the two Miles modules ``log_rollout`` imports."""
    logged: list = []
    metric_utils = types.ModuleType("miles.utils.metric_utils")
    metric_utils.compute_rollout_step = lambda args, rollout_id: rollout_id
    tracking_utils = types.ModuleType("miles.utils.tracking_utils")
    tracking_utils.tracking = SimpleNamespace(log=lambda args, m, step_key: logged.append(dict(m)))
    for name, module in {
        "miles": types.ModuleType("miles"),
        "miles.utils": types.ModuleType("miles.utils"),
        "miles.utils.metric_utils": metric_utils,
        "miles.utils.tracking_utils": tracking_utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return logged


SC_ARGS = dict(
    loss_type="custom_loss",
    custom_loss_function_path="rescue.miles.sc_loss.policy_loss",
    custom_generate_function_path="rescue.miles.topk.agentic_generate",
    custom_rollout_log_function_path="rescue.miles.log.log_rollout",
    custom_megatron_before_train_step_hook_path="rescue.miles.train_step.before_train_step",
    advantage_estimator="grpo",
    reward_key=None,
)


def test_log_rollout_publishes_under_score_centering_only(fake_miles_tracking, monkeypatch):
    from rescue.miles.log import log_rollout

    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    samples = [sample(0, [1, 1, 0, 1]), sample(1, [1])]
    log_rollout(50, SimpleNamespace(**SC_ARGS), samples, None, 0.0)
    assert fake_miles_tracking[-1]["rollout/rescue/sc/published"] == 2
    assert fake_miles_tracking[-1]["rollout/rescue/sc/head_positions"] == 4
    assert topk_store._LOCAL.lookup(50) is not None
    log_rollout(51, SimpleNamespace(reward_key=None), samples, None, 0.0)  # not score centering
    assert "rollout/rescue/sc/published" not in fake_miles_tracking[-1]
    assert topk_store._LOCAL.lookup(51) is None
    del samples[1].metadata[KEY]
    with pytest.raises(InputError, match="no recorded heads"):
        log_rollout(52, SimpleNamespace(**SC_ARGS), samples, None, 0.0)


# ── with Ray: the rollout manager publishes, a train rank elsewhere fetches ──────────────


@pytest.fixture(scope="module")
def ray_head():
    pytest.importorskip("ray")
    with local_ray_head(num_cpus=1, prefix="rtopk") as address:
        yield address


def fetch_as_a_train_rank(rollout_id: int, digest: str):
    """In a Ray worker process: name the rollout, look the sample up, fetch its entry."""
    import ray

    from rescue.miles import topk_store as store

    store.TRAINER.begin(rollout_id)
    (ref,) = store.TRAINER._step_entries()[digest]
    entry = ray.get(ref)
    return entry["positions"].tolist(), entry["ids"].tolist(), os.getpid()


def begin_as_a_train_rank(rollout_id: int) -> None:
    from rescue.miles import topk_store as store

    store.TRAINER.begin(rollout_id)


def test_the_store_actor_carries_heads_to_another_process(ray_head, monkeypatch):
    import ray

    for key, value in RAY_ENV.items():
        monkeypatch.setenv(key, value)
    here = Path(__file__).resolve().parent  # the workers import rescue and this module
    path = f"{here.parent}{os.pathsep}{here}"
    ray.init(address=ray_head, runtime_env={"env_vars": {"PYTHONPATH": path}},
             logging_level="ERROR")  # fmt: skip
    topk_store._HANDLE.clear()
    try:
        s = sample(0, [1, 0, 1, 1])
        assert topk_store.publish(7, [s]) == (1, 3)
        assert topk_store._LOCAL.lookup(7) is None  # not the in-process registry
        remote = ray.remote(fetch_as_a_train_rank)
        positions, ids, pid = ray.get(remote.remote(7, token_digest(s.tokens)))
        assert pid != os.getpid()
        assert positions == [0, 2, 3] and ids == s.metadata[KEY]["ids"].tolist()
        # the next rollout's first step releases this one
        ray.get(ray.remote(begin_as_a_train_rank).remote(8))
        actor = ray.get_actor(topk_store.ACTOR)
        assert ray.get(actor.lookup.remote(7)) is None
    finally:
        topk_store._HANDLE.clear()
        ray.shutdown()
