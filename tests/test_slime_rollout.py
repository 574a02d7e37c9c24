"""The slime fully-async rollout: drain, gate, sample filter and census; slime's worker."""

from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest
from fake_sample import Sample, check_against
from miles_env import require_slime
from slime_env import slime_rollout_modules

import filters
from rescue.gate import Gate
from rescue.pace import PaceSettings
from rescue.samples import group_id, iter_samples
from rescue.slime import rollout
from rescue.slime.pace import SlimePace
from rescue.slime.rollout import ENV_MAX_STALENESS, Drain, engine_version, max_staleness_from_env

P = "rollout/census/"
ARGS = SimpleNamespace(reward_key=None)


def make_group(g, version, n=2, *, rewards=None, status=Sample.Status.COMPLETED):
    rewards = rewards or [float(k % 2) for k in range(n)]
    return [
        Sample(
            group_index=g,
            index=g * n + k,
            status=status,
            reward=rewards[k],
            weight_versions=[str(version)],
        )
        for k in range(n)
    ]


class FakeWorker:
    """``get_completed_groups`` / ``queue_size`` of slime's ``AsyncRolloutWorker``."""

    def __init__(self, groups):
        self.queue = deque(enumerate(groups))
        self.limits = []

    def get_completed_groups(self, limit=None):
        self.limits.append(limit)
        out = []
        while self.queue and (limit is None or len(out) < limit):
            out.append(self.queue.popleft())
        return out

    def queue_size(self):
        return len(self.queue)


def drain(groups, gate, **kw):
    return Drain(FakeWorker(groups), gate, poll_s=0.0, **kw)


def test_fresh_groups_pass_through_in_index_order_and_leave_the_rest_queued():
    groups = [make_group(g, version=3) for g in (4, 1, 3, 0, 2, 5)]
    d = drain(groups, Gate(arm="drop", max_staleness=1))
    out, m = d.collect(ARGS, target=4)
    assert [g[0].group_index for g in out] == [0, 1, 3, 4]  # the first four popped, by index
    assert d.worker.queue_size() == 2 and m[f"{P}worker_queue"] == 2.0
    assert m[f"{P}groups/trained_fresh"] == 4 and m[f"{P}groups/entered"] == 4
    assert m[f"{P}groups/buffered"] == 0
    assert all("rescue_weight" not in s.metadata for g in out for s in g)


def test_drop_arm_skips_stale_groups_and_still_fills_the_batch():
    # Current version 5 (the newest seen); K = 2: version-0 groups are stale (5 > 2).
    groups = [
        make_group(0, 5),
        make_group(1, 0),
        make_group(2, 0),
        make_group(3, 5),
        make_group(4, 4),
    ]
    d = drain(groups, Gate(arm="drop", max_staleness=2))
    out, m = d.collect(ARGS, target=3)
    assert [g[0].group_index for g in out] == [0, 3, 4]
    assert m[f"{P}groups/dropped_stale"] == 2 and m[f"{P}groups/trained_fresh"] == 3
    assert m[f"{P}groups/entered"] == 5 and m[f"{P}current_version"] == 5.0
    assert m[f"{P}dropped/outcome/solved"] == 2 and m[f"{P}dropped/outcome/submitted_failure"] == 2
    assert m[f"{P}staleness_max"] == 1.0  # of the trained groups
    assert d.worker.limits == [3, 2]  # pulls only what the batch still needs


def test_protect_arm_weights_every_sample_of_a_kept_stale_group():
    gate = Gate(arm="protect", a=0.25, seed=3, max_staleness=0)
    n = 200
    groups = [make_group(0, version=9)] + [make_group(g, version=0) for g in range(1, n)]
    groups[1] = [groups[1][:1], groups[1][1:]]  # list-of-samples trajectories
    kept_ids = [g for g in range(1, n) if gate.decide(g, 9).keep]
    d = drain(groups, gate)
    out, m = d.collect(ARGS, target=1 + len(kept_ids))
    assert [group_id(g) for g in out] == [0, *kept_ids]
    assert all("rescue_weight" not in s.metadata for s in out[0])
    for g in out[1:]:
        assert [s.metadata["rescue_weight"] for s in iter_samples(g)] == [4.0, 4.0]
    assert m[f"{P}groups/trained_protected"] == len(kept_ids) == m[f"{P}protected_groups"]
    assert m[f"{P}protected_weight_mean"] == 4.0
    # The drain stops at the last group it needs: groups 1..max(kept_ids) were popped.
    assert m[f"{P}groups/dropped_stale"] == max(kept_ids) - len(kept_ids)
    assert d.worker.queue_size() == n - 1 - max(kept_ids)


def test_never_drop_keeps_stale_groups_with_weight_one_and_clears_a_leftover_weight():
    groups = [make_group(0, 7), make_group(1, 0)]
    groups[1][0].metadata["rescue_weight"] = 4.0  # left from an earlier pass
    d = drain(groups, Gate(arm="never-drop", max_staleness=1))
    out, m = d.collect(ARGS, target=2)
    assert m[f"{P}groups/trained_stale"] == 1 and m[f"{P}groups/trained_fresh"] == 1
    assert all("rescue_weight" not in s.metadata for g in out for s in g)


def test_groups_without_numeric_versions_are_never_stale():
    groups = [make_group(0, "default"), make_group(1, 0)]
    groups[1][0].weight_versions = groups[1][1].weight_versions = []
    d = drain(groups, Gate(arm="drop", max_staleness=0), current_version=lambda: 10)
    out, m = d.collect(ARGS, target=2)
    assert len(out) == 2 and m[f"{P}groups/trained_fresh"] == 2


def test_current_version_is_the_engine_version_or_the_newest_seen():
    d = drain([], Gate())
    assert d.current_version() is None
    assert d.current_version([make_group(0, 3), make_group(1, 5)]) == 5
    assert d.current_version([make_group(2, 4)]) == 5  # never goes back
    d._engine_version = lambda: 8
    assert d.current_version() == 8
    d._engine_version = lambda: 2
    assert d.current_version() == 5


def test_the_sample_filter_runs_on_the_kept_groups_and_the_census_counts_the_masks():
    groups = [make_group(g, 1, n=4, rewards=[1.0, 0.0, 0.0, 0.0]) for g in range(3)]
    for g in groups:
        g[2].status = g[3].status = Sample.Status.TRUNCATED
    seen = []

    def spy(args, batch):
        seen.append([g[0].group_index for g in batch])
        filters.mask_truncated_zero_reward(args, batch)

    d = drain(groups, Gate(), sample_filter=spy)
    out, m = d.collect(ARGS, target=3)
    assert seen == [[0, 1, 2]]
    assert [[s.remove_sample for s in g] for g in out] == [[False, False, True, True]] * 3
    assert m[f"{P}masked_frac"] == 0.5 and m[f"{P}masked_frac/budget_failure"] == 1.0
    assert m[f"{P}cap_hit_rate"] == 0.5 and m[f"{P}b_realized"] == 0.5


def test_every_popped_group_is_settled_within_the_call():
    gate = Gate(arm="protect", a=0.5, seed=1, max_staleness=0)
    d = drain([make_group(g, g % 3) for g in range(60)], gate)
    entered = 0
    for _ in range(3):
        _, m = d.collect(ARGS, target=5)
        entered += m[f"{P}groups/entered"]
        assert m[f"{P}groups/buffered"] == 0
    totals = d.census.totals()
    assert (
        totals["entered"]
        == entered
        == sum(totals[b] for b in totals if b not in ("entered", "buffered"))
    )


def test_max_staleness_setting():
    assert max_staleness_from_env({}) is None
    assert max_staleness_from_env({ENV_MAX_STALENESS: " "}) is None
    assert max_staleness_from_env({ENV_MAX_STALENESS: "2"}) == 2
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ValueError, match=f"{ENV_MAX_STALENESS}='{bad}'; allowed"):
            max_staleness_from_env({ENV_MAX_STALENESS: bad})


def test_the_pace_arm_needs_its_schedule_and_the_schedule_needs_the_pace_arm():
    with pytest.raises(ValueError, match=r"^RESCUE_ARM=pace: the drain needs the pace") as e:
        drain([], Gate(arm="pace", max_staleness=1))
    assert "\n" not in str(e.value)
    pace = SlimePace(PaceSettings(max_staleness=1, batch=2))
    with pytest.raises(ValueError, match="a pace schedule with RESCUE_ARM=drop"):
        drain([], Gate(arm="drop", max_staleness=1), pace=pace)
    drain([], Gate(arm="pace", max_staleness=1), pace=pace)


def test_evaluation_is_refused_with_the_flag_to_use():
    with pytest.raises(ValueError, match="--eval-function-path"):
        rollout.generate_rollout(SimpleNamespace(), 0, None, evaluation=True)


def test_a_run_without_the_global_dataset_is_refused():
    with pytest.raises(ValueError, match="--disable-rollout-global-dataset"):
        rollout.generate_rollout(SimpleNamespace(rollout_global_dataset=False), 0, None)


class _Engines(BaseHTTPRequestHandler):
    versions: ClassVar[dict] = {}

    def do_GET(self):
        if self.path == "/workers":
            host, port = self.server.server_address
            body = {"workers": [{"url": f"http://{host}:{port}/e{k}"} for k in self.versions]}
        else:
            body = {"weight_version": self.versions[self.path.split("/")[1][1:]]}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_engine_version_asks_every_engine_behind_the_router():
    server = HTTPServer(("127.0.0.1", 0), _Engines)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        args = SimpleNamespace(
            sglang_router_ip="127.0.0.1", sglang_router_port=server.server_address[1]
        )
        _Engines.versions = {"0": "7", "1": "9", "2": "default"}
        assert engine_version(args) == 9
        _Engines.versions = {"0": "default"}
        assert engine_version(args) is None
    finally:
        server.shutdown()
        server.server_close()
    assert engine_version(args, timeout_s=0.5) is None  # nobody answers: fall back
    assert engine_version(SimpleNamespace()) is None


# ---------------------------------------------------------------- with slime's worker


def _slime():
    slime_rollout_modules()
    import slime.rollout.fully_async_rollout as fa
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample

    return fa, RolloutFnTrainOutput, Sample


class _DataSource:
    """slime's data source contract for the worker: ``get_samples(1)`` / ``add_samples``."""

    def __init__(self, groups):
        self.groups = deque(groups)
        self.requeued = []

    def get_samples(self, n):
        return [self.groups.popleft() for _ in range(min(n, len(self.groups)))]

    def add_samples(self, groups):
        self.requeued.extend(groups)


def test_generate_rollout_with_slimes_worker(monkeypatch):
    fa, RolloutFnTrainOutput, Sample = _slime()
    S = Sample.Status

    async def scripted_generate(args, group, sampling_params, evaluation):
        # Groups 0-5 were generated under version 0, the rest under 5; every fourth
        # sample hit the length limit; group 6 is aborted (slime's worker requeues it).
        for s in group:
            g = s.group_index
            s.weight_versions = ["0" if g < 6 else "5"]
            s.status = S.ABORTED if g == 6 else (S.TRUNCATED if s.index % 4 == 3 else S.COMPLETED)
            s.reward = float(s.index % 2) if s.status is S.COMPLETED else 0.0
        return group

    monkeypatch.setattr(fa, "GenerateState", lambda args: SimpleNamespace(sampling_params={}))
    monkeypatch.setattr(fa, "generate_and_rm_group", scripted_generate)
    monkeypatch.setattr(rollout, "EngineVersions", FixedVersion)
    monkeypatch.setattr(rollout, "_DRAIN", None)
    for k, v in {
        "RESCUE_ARM": "protect",
        "RESCUE_A": "0.5",
        "RESCUE_SEED": "0",
        ENV_MAX_STALENESS: "2",
    }.items():
        monkeypatch.setenv(k, v)

    groups = [
        [Sample(group_index=g, index=4 * g + k, prompt=f"p{g}") for k in range(4)]
        for g in range(16)
    ]
    source = _DataSource(groups)
    args = SimpleNamespace(
        rollout_batch_size=4,
        sglang_server_concurrency=16,
        rollout_num_engines=1,
        rollout_sample_filter_path="filters.mask_truncated_zero_reward",
        reward_key=None,
        custom_reward_post_process_path="rescue.miles.reward.post_process_rewards",
        advantage_estimator="grpo",
        custom_generate_function_path="rescue.slime.generate.generate",
    )
    gate = Gate(arm="protect", a=0.5, seed=0, max_staleness=2)
    try:
        outputs = [rollout.generate_rollout(args, r, source) for r in range(2)]
        worker = rollout._DRAIN.worker
        assert isinstance(worker, fa.AsyncRolloutWorker)
    finally:
        rollout._stop()

    # The worker queues finished groups in the order it started them (0..15 without the
    # aborted 6); each call pops only what its batch still needs, so the calls see:
    expected, queue = [], [g for g in range(16) if g != 6]
    for _ in range(2):
        kept, popped = [], []
        while len(kept) < 4:
            g = queue.pop(0)
            popped.append(g)
            if gate.decide(g, 5 if g < 6 else 0).keep:
                kept.append(g)
        expected.append((kept, popped))

    assert [type(o) for o in outputs] == [RolloutFnTrainOutput] * 2
    for o, (kept, popped) in zip(outputs, expected, strict=True):
        assert [g[0].group_index for g in o.samples] == kept  # sorted by index
        m = o.metrics
        # the aborted group 6 entered and settled aborted when slime's worker requeued it
        assert m[f"{P}groups/entered"] == len(popped) + m[f"{P}groups/aborted"]
        assert m[f"{P}groups/requeued"] == m[f"{P}groups/aborted"]
        assert m[f"{P}groups/dropped_stale"] == len(popped) - len(kept)
        protected = [g for g in kept if g < 6]
        assert m[f"{P}groups/trained_protected"] == len(protected)
        assert m[f"{P}groups/trained_fresh"] == len(kept) - len(protected)
        assert m[f"{P}masked_frac"] == 0.25 and m[f"{P}groups/buffered"] == 0
        assert m[f"{P}current_version"] == 5.0
        for g in o.samples:
            weight = 2.0 if g[0].group_index < 6 else None
            assert [s.metadata.get("rescue_weight") for s in g] == [weight] * 4
            assert [s.remove_sample for s in g] == [s.status is S.TRUNCATED for s in g]
    assert any(g < 6 for kept, _ in expected for g in kept)  # the scenario protects some
    assert any(len(p) > len(k) for k, p in expected)  # and drops some
    assert [g[0].group_index for g in source.requeued] == [6]  # aborted: back to the source
    assert sum(o.metrics[f"{P}groups/requeued"] for o in outputs) == 1
    assert sum(o.metrics.get(f"{P}aborted/reason/aborted", 0) for o in outputs) == 1
    assert all(o.metrics[f"{P}version_fallback"] == 0.0 for o in outputs)


class FixedVersion:
    """``rescue.slime.versions.EngineVersions`` for engines that all report version 5."""

    def __init__(self, args):
        self.source = "engines (/get_weight_version)"

    def __call__(self):
        return 5

    def probe(self):
        return self.source


def test_the_fake_sample_has_slime_fields_defaults_and_statuses():
    require_slime()
    from slime.utils.types import Sample as SlimeSample

    assert check_against(SlimeSample) == []


def test_a_group_without_a_result_is_discarded_and_counted_by_its_reason():
    """A trial that timed out after a model call is COMPLETED with reward 0 in slime: its
    group never reaches the batch, in any arm."""
    for arm in ("drop", "never-drop", "protect"):
        broken = make_group(1, version=3)
        broken[0].metadata = {
            "instance_id": "t1",
            "exit_status": "TrialTimeout",
            "outcome": "infra_no_result",
            "outcome_reason": "trial_timeout",
        }
        groups = [make_group(0, version=3), broken, make_group(2, version=3)]
        gate = Gate(arm=arm, a=0.5 if arm == "protect" else None, max_staleness=1)
        out, m = drain(groups, gate).collect(ARGS, target=2)
        assert [g[0].group_index for g in out] == [0, 2]
        assert m[f"{P}groups/aborted"] == 1 and m[f"{P}aborted/reason/trial_timeout"] == 1
        assert m[f"{P}groups/entered"] == 3 and m[f"{P}groups/buffered"] == 0


def test_a_stopped_worker_is_replaced_and_its_groups_in_flight_are_lost(monkeypatch):
    _slime()
    from rescue.slime.worker import RescueSource, WorkerEvents

    events = WorkerEvents()
    source = RescueSource(_DataSource([make_group(g, 1) for g in range(4)]), events)
    source.get_samples(1)
    source.get_samples(1)  # two groups in flight on the worker that stops
    dead = SimpleNamespace(
        worker_thread=SimpleNamespace(is_alive=lambda: False), data_buffer=source
    )
    d = Drain(dead, Gate(arm="never-drop"), events=events, poll_s=0.0)
    started = []

    def start_worker(args, new_source):
        started.append(new_source)
        worker = FakeWorker([make_group(5, 1), make_group(6, 1)])
        worker.data_buffer = new_source
        return worker

    monkeypatch.setattr(rollout, "_DRAIN", d)
    monkeypatch.setattr(rollout, "start_worker", start_worker)
    out = rollout.generate_rollout(SimpleNamespace(rollout_batch_size=2, reward_key=None), 0, None)
    (new_source,) = started
    assert new_source.source is source.source and new_source.events is events
    assert (
        out.metrics[f"{P}groups/lost"] == 2 and out.metrics[f"{P}lost/reason/worker_stopped"] == 2
    )
    assert [g[0].group_index for g in out.samples] == [5, 6]


def test_the_watchdogs_flush_logs_the_census_through_slimes_logging(monkeypatch):
    _slime()
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step

    from rescue.watchdog import Watchdog, WatchdogSettings, WatchdogStop

    broken = [make_group(9, 1)]  # kept: still open in the census when the run stops
    for g in range(4):
        group = make_group(g, 1)
        group[0].status = Sample.Status.FAILED  # an API error the generator marked FAILED
        broken.append(group)
    d = Drain(FakeWorker(broken), Gate(arm="never-drop"), poll_s=0.0)
    d.watchdog = Watchdog(
        WatchdogSettings(window=4, max_no_result=0.5, idle_s=0),
        flush=lambda line: rollout._flush_census(d, line),
    )
    logged = []
    monkeypatch.setattr(logging_utils, "log", lambda a, m, step_key: logged.append((m, step_key)))
    args = SimpleNamespace(reward_key=None, rollout_batch_size=2, wandb_always_use_train_step=False)
    monkeypatch.setitem(rollout._CALL, "args", args)
    monkeypatch.setitem(rollout._CALL, "rollout_id", 3)
    with pytest.raises(
        WatchdogStop, match=r"3 of the last 4 groups had no result.*census flushed$"
    ):
        d.collect(args, target=2)
    ((m, step_key),) = logged
    assert step_key == "rollout/step" and m["rollout/step"] == compute_rollout_step(args, 3)
    assert m[f"{P}groups/aborted"] == 3 and m[f"{P}aborted/reason/failed"] == 3
    assert m[f"{P}groups/entered"] == 4 and m[f"{P}groups/buffered"] == 1


def test_generate_rollout_declares_rescues_axes_on_the_wandb_run(monkeypatch, tmp_path):
    """The rollout function declares the census against ``rollout/step`` on the process' wandb
    run (``rescue.tracking.metrics``), read back from the run's transaction log."""
    wandb = pytest.importorskip("wandb")
    _slime()
    from rescue.tracking.history import read_offline

    worker = FakeWorker([make_group(0, 1), make_group(1, 1)])
    worker.worker_thread = SimpleNamespace(is_alive=lambda: True)
    monkeypatch.setattr(rollout, "_DRAIN", Drain(worker, Gate(arm="never-drop"), poll_s=0.0))
    run = wandb.init(mode="offline", dir=str(tmp_path), project="rescue-test",
                     settings=wandb.Settings(silent=True, console="off"))  # fmt: skip
    try:
        rollout.generate_rollout(SimpleNamespace(rollout_batch_size=2, reward_key=None), 0, None)
    finally:
        run.finish()
    [folder] = sorted((tmp_path / "wandb").glob("offline-run-*"))
    axes = read_offline([folder]).axes
    assert axes["rollout/census/*"] == "rollout/step" and axes["train/rescue/*"] == "train/step"
