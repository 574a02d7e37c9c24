"""A weight update aborting requests in flight, through slime's own code on a CPU.

slime's ``AsyncRolloutWorker`` runs ``generate_and_rm_group`` -> ``generate_and_rm`` ->
the generate function (rescue's wrapper around slime's ``generate()``) -> slime's
``post`` to a stand-in SGLang engine (``sglang_pause``) that pauses as SGLang's default
``abort`` mode does; slime's ``Sample.append_response_tokens`` records the aborted reply's
version, slime's worker requeues the group into slime's ``RolloutDataSourceWithBuffer``,
which hands it out again, and ``generate()`` resumes the sample from its tokens. rescue's
rollout function (``rescue.slime.rollout.generate_rollout``) then drains the batches.

What the engine logged is the ground truth: every token names the request that produced
it, and every request its weight version. So each trained sample's counted versions, its
group's staleness and its turns are derived here from tokens and the log alone, and
compared with what rescue recorded; without the wrapper the same run shows what was wrong.

The same setting shows slime's worker losing a group whose reward model raised (the census
counts it ``lost``), and the pace arm admitting generations through slime's worker.
"""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest
from sglang_pause import PausingEngine
from slime_env import StubTokenizer, slime_rollout_modules

from rescue.model_calls import CALLS_KEY, counted_weight_versions, turn_count
from rescue.samples import STALENESS_KEY, group_records, iter_samples

P = "rollout/census/"
N = 2  # samples per group
#: groups in slime's worker, and samples at once under slime's semaphore
#: (--sglang-server-concurrency x 1 engine): group 0's two samples take the semaphore first
#: (asyncio runs tasks in the order they were created), so the two requests in flight at
#: the weight update are group 0's, and group 1 waits for the engine to continue.
CONCURRENCY = 2


async def reward(args, sample, **kwargs):
    """--custom-rm-path: a scalar reward (slime's ``async_rm`` calls it)."""
    return float(sample.index % 2)


class RewardModelDown(RuntimeError):
    """What a remote reward model raises once its retries are spent."""


async def reward_down_for_group_1(args, sample, **kwargs):
    if sample.group_index == 1:
        raise RewardModelDown("reward model unreachable after 3 retries")
    return float(sample.index % 2)


def _post(engine):
    def post(path, body):
        request = urllib.request.Request(
            engine.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read()

    return post


@pytest.fixture
def slime_run(monkeypatch):
    """slime's modules, args from slime's own parser, a fresh GenerateState and HTTP client;
    everything rescue or slime started is stopped after the test."""
    slime_rollout_modules()
    from framework_args import slime_defaults
    from slime.rollout import sglang_rollout
    from slime.utils import http_utils
    from slime.utils.misc import SingletonMeta

    from rescue.slime import rollout

    monkeypatch.setattr(sglang_rollout, "load_tokenizer", lambda *a, **k: StubTokenizer())
    monkeypatch.setattr(sglang_rollout, "load_processor", lambda *a, **k: None)
    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)
    monkeypatch.setattr(rollout, "_DRAIN", None)
    for name in ("RESCUE_ESTIMATOR", "RESCUE_BASELINE", "RESCUE_A", "RESCUE_PACE_WINDOW"):
        monkeypatch.delenv(name, raising=False)
    yield SimpleNamespace(rollout=rollout, http_utils=http_utils, defaults=slime_defaults)
    rollout._stop()
    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)
    http_utils._http_client = None


def slime_args(slime_run, engine, *, wrapper=True, partial=False, **overrides):
    return slime_run.defaults(
        **{
            **dict(
                hf_checkpoint="stand-in",
                prompt_data=None,
                rollout_global_dataset=True,
                n_samples_per_prompt=N,
                rollout_batch_size=N,
                rollout_max_response_len=16,
                sglang_server_concurrency=CONCURRENCY,
                rollout_num_gpus=1,
                rollout_num_gpus_per_engine=1,
                sglang_router_ip=engine.server.server_address[0],
                sglang_router_port=engine.server.server_address[1],
                custom_rm_path=f"{__name__}.reward",
                custom_generate_function_path=(
                    "rescue.slime.generate.generate" if wrapper else None
                ),
                custom_reward_post_process_path="rescue.miles.reward.post_process_rewards",
                custom_advantage_function_path="rescue.slime.advantages.turn_advantages",
                partial_rollout=partial,
                mask_offpolicy_in_partial_rollout=partial,
                # SGLang's own flags (slime adds them with an --sglang- prefix from SGLang's
                # ServerArgs, not installed here), at SGLang's defaults
                sglang_dp_size=None,
                sglang_enable_deterministic_inference=False,
                sglang_speculative_algorithm=None,
            ),
            **overrides,
        }
    )


def start(slime_run, args):
    """slime's data source and HTTP client, rescue's drain around slime's worker."""
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    slime_run.http_utils._http_client = None
    slime_run.http_utils.init_http_client(args)
    source = RolloutDataSourceWithBuffer(args)
    rollout = slime_run.rollout
    rollout._DRAIN = rollout.build_drain(args, source)
    rollout._DRAIN.worker.poll_interval = 0.02
    return source


def run(slime_run, engine, monkeypatch, *, hold, wrapper, arm="never-drop", partial=False):
    """Hold the requests in flight after ``hold`` tokens, update the weights to version 1
    (pause, abort, continue), then drain batches of N groups until group 0 (aborted,
    requeued, resumed) is trained or dropped; returns (outputs, args)."""
    args = slime_args(slime_run, engine, wrapper=wrapper, partial=partial)
    monkeypatch.setenv("RESCUE_ARM", arm)
    monkeypatch.setenv("RESCUE_MAX_STALENESS", "0")
    engine.holding, engine.hold = True, (lambda serial: hold)
    source = start(slime_run, args)
    rollout = slime_run.rollout
    engine.wait_in_flight(CONCURRENCY)
    engine.update_weights("1", _post(engine))
    outputs = []
    for r in range(6):
        outputs.append(rollout.generate_rollout(args, r, source))
        seen = [g[0].group_index for g in trained(outputs)]
        if 0 in seen or sum(o.metrics[f"{P}groups/dropped_stale"] for o in outputs):
            break
    rollout._stop()  # while the engine still answers what the worker has in flight
    return outputs, args


def truth(engine, sample):
    """From the engine's log: the versions of the requests that produced the sample's
    trained tokens."""
    version = {serial: v for serial, v, _, _ in engine.log}
    tokens = sample.tokens[len(StubTokenizer.PROMPT) :]
    mask = sample.loss_mask or [1] * len(tokens)
    serials = {engine.request_of(t) for t, m in zip(tokens, mask, strict=True) if m}
    return sorted({int(version[s]) for s in serials})


def trained(outputs):
    return [g for o in outputs for g in o.samples]


@pytest.mark.parametrize(
    ("hold", "partial", "staleness"),
    [(0, False, 0), (3, False, 1), (3, True, 0)],
    ids=["abort-before-a-token", "abort-mid-way", "abort-mid-way-masked"],
)
def test_an_abort_at_a_weight_update_counts_only_what_produced_trained_tokens(
    slime_run, monkeypatch, hold, partial, staleness
):
    with PausingEngine(length=6) as engine:
        outputs, args = run(
            slime_run, engine, monkeypatch, hold=hold, wrapper=True, partial=partial
        )
        aborted = [entry for entry in engine.log if entry[3] == "abort"]
    assert sorted(n for _, _, n, _ in aborted) == [hold, hold]  # group 0's two requests
    groups = trained(outputs)
    (group0,) = [g for g in groups if g[0].group_index == 0]
    assert all(s.weight_versions == ["0", "1"] for s in group0)  # slime recorded both
    assert all(s.response_length == hold + 6 for s in group0)  # resumed from its tokens
    for group in groups:
        for s in group:
            assert s.status.value == "completed" and turn_count(s) == 1
            assert CALLS_KEY in s.metadata
            assert [int(v) for v in counted_weight_versions(s)] == truth(engine, s)
        # the staleness rescue gated the group with is the ground truth's
        oldest = min(min(truth(engine, s)) for s in group)
        assert {s.metadata[STALENESS_KEY] for s in group} == {1 - oldest}
    assert {s.metadata[STALENESS_KEY] for s in group0} == {staleness}
    if partial:  # the resumed request's tokens are trained, the masked ones are not
        assert all(s.loss_mask == [0] * hold + [1] * 6 for s in group0)
    # the census: group 0 requeued once, aborted for the reason Miles gives; one turn each
    metrics = [o.metrics for o in outputs]
    assert sum(m[f"{P}groups/requeued"] for m in metrics) == 1
    assert sum(m.get(f"{P}aborted/reason/aborted", 0) for m in metrics) == 1
    assert all(m[f"{P}version_fallback"] == 0.0 and m[f"{P}current_version"] == 1 for m in metrics)
    assert {r.turns for g in groups for r in group_records(g)} == {1}
    # the turn estimator takes each resumed reply as one model call
    from rescue.reward import post_process_rewards

    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    flat = [s for g in groups for s in iter_samples(g)]
    assert post_process_rewards(args, flat)[1] == [0.0] * len(flat)
    assert all(s.teacher_log_probs is not None for s in flat)


def test_without_the_wrapper_the_same_run_overstates_staleness_turns_and_stops_the_turn_arm(
    slime_run, monkeypatch
):
    with PausingEngine(length=6) as engine:
        outputs, args = run(slime_run, engine, monkeypatch, hold=0, wrapper=False)
        groups = trained(outputs)
        (group0,) = [g for g in groups if g[0].group_index == 0]
        assert [truth(engine, s) for s in group0] == [[1], [1]]  # no token of version 0
    assert {s.metadata[STALENESS_KEY] for s in group0} == {1}  # yet one version staler
    assert [r.turns for r in group_records(group0)] == [2, 2]  # and two turns
    from rescue.reward import post_process_rewards

    monkeypatch.setenv("RESCUE_ESTIMATOR", "turn")
    with pytest.raises(ValueError, match="1 runs of 1s but 2 model calls"):
        post_process_rewards(args, [s for g in groups for s in iter_samples(g)])


@pytest.mark.parametrize("wrapper", [True, False])
def test_the_drop_arm_drops_a_group_for_its_trained_tokens_only(slime_run, monkeypatch, wrapper):
    """K = 0, the abort before any token: with the record the resumed group is fresh and
    trained; without it, it is dropped as stale."""
    with PausingEngine(length=6) as engine:
        outputs, _ = run(slime_run, engine, monkeypatch, hold=0, wrapper=wrapper, arm="drop")
    seen = [g[0].group_index for g in trained(outputs)]
    dropped = sum(o.metrics[f"{P}groups/dropped_stale"] for o in outputs)
    assert (0 in seen, dropped) == ((True, 0) if wrapper else (False, 1))


def test_a_group_whose_reward_model_raised_is_counted_lost(slime_run, monkeypatch):
    """slime's worker logs the exception of generate_and_rm_group and the group is gone;
    rescue's census counts it, with the exception's name."""
    monkeypatch.setenv("RESCUE_ARM", "never-drop")
    with PausingEngine(length=4) as engine:
        args = slime_args(slime_run, engine, custom_rm_path=f"{__name__}.reward_down_for_group_1")
        source = start(slime_run, args)
        outputs = [slime_run.rollout.generate_rollout(args, r, source) for r in range(2)]
        slime_run.rollout._stop()
    seen = [g[0].group_index for o in outputs for g in o.samples]
    assert 1 not in seen and len(seen) == 4
    metrics = [o.metrics for o in outputs]
    assert sum(m[f"{P}groups/lost"] for m in metrics) == 1
    assert sum(m.get(f"{P}lost/reason/RewardModelDown", 0) for m in metrics) == 1
    entered = sum(m[f"{P}groups/entered"] for m in metrics)
    assert entered == 4 + 1  # the trained groups and the lost one: none went uncounted


def test_pace_admits_generations_through_slimes_worker(slime_run, monkeypatch):
    """K = 1, B = N = 2: the window W = 4 holds although slime's worker would start 8
    groups; it refills when the next step begins."""
    import time

    monkeypatch.setenv("RESCUE_ARM", "pace")
    monkeypatch.setenv("RESCUE_MAX_STALENESS", "1")

    def handed_out_settles_at(source, n):
        deadline = time.monotonic() + 30
        while source.sample_group_index < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # several of the worker's polls: nothing more is admitted
        return source.sample_group_index

    with PausingEngine(length=4) as engine:
        args = slime_args(slime_run, engine, sglang_server_concurrency=8)
        source = start(slime_run, args)
        assert handed_out_settles_at(source, 4) == 4
        first = slime_run.rollout.generate_rollout(args, 0, source)
        assert handed_out_settles_at(source, 4) == 4  # 2 taken + 2 open = W until step 1
        second = slime_run.rollout.generate_rollout(args, 1, source)
        assert handed_out_settles_at(source, 6) == 6
        slime_run.rollout._stop()
    first_ids = [g[0].group_index for g in first.samples]
    second_ids = [g[0].group_index for g in second.samples]
    # step 1 owes both its places to step 0's groups (deadline 1), not to 4 and 5 (deadline 2)
    assert len(first_ids) == len(second_ids) == 2
    assert sorted(first_ids + second_ids) == [0, 1, 2, 3]
    for o in (first, second):
        assert o.metrics[f"{P}groups/trained_fresh"] == 2
        assert o.metrics[f"{P}groups/dropped_stale"] == 0
