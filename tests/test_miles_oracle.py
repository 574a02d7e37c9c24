"""The gradient oracle with real Miles and megatron-core 0.16.1 on a CPU:

- the build step on dumps written by Miles' own dump code (``save_debug_rollout_data``) of
  Miles Samples gated by rescue's gate, read back by Miles' own replay loader;
- the capture hook (``RESCUE_ORACLE_DIR``) inside rescue's before-train-step hook, wrapping
  the model config's finalize function around megatron-core's ``finalize_model_grads`` in
  Megatron's no-pipelining forward/backward schedule (DDP, one gloo process, the test-only
  CPU patch), written in full and streamed."""

from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from miles_env import require_miles
from recorded_dumps import SEED, recorded_step

from rescue.gate import Gate, coin
from rescue.gating import gate_group
from rescue.oracle.build import build
from rescue.oracle.compare import compare
from rescue.oracle.manifest import Manifest
from rescue.samples import WEIGHT_KEY

torch = pytest.importorskip("torch")


@pytest.fixture
def miles():
    require_miles()
    from miles.ray.rollout import debug_data
    from miles.utils.types import Sample

    return Sample, debug_data


def test_build_on_dumps_written_by_miles_replays_through_miles_loader(miles, tmp_path):
    Sample, debug_data = miles
    gate = Gate(arm="never-drop", seed=SEED, max_staleness=1)
    template = str(tmp_path / "dumps" / "rollout_data" / "{rollout_id}.pt")
    dump_args = argparse.Namespace(
        save_debug_rollout_data=template, save_debug_trajectory_data=None
    )
    for rid, stale in ((5, {1}), (6, {0, 2})):
        payload = recorded_step(rid, stale=set(), groups=3, G=3, cap=3, seed=rid)
        samples = [Sample.from_dict(s) for s in payload["samples"]]
        for s in samples:  # weight versions: stale groups two versions behind
            s.metadata = {}
            s.weight_versions = [str(10 - 2 * (s.group_index in stale))]
        groups: dict[int, list] = {}
        for s in samples:
            groups.setdefault(s.group_index, []).append(s)
        for group in groups.values():  # the recording run's buffer, on Miles Samples
            gate_group(gate, group, 10)
        debug_data.save_debug_rollout_data(dump_args, samples, rollout_id=rid, evaluation=False)

    out = str(tmp_path / "oracle")
    manifest = build([str(tmp_path / "dumps")], out, progress=False)
    assert [e.arm for e in manifest.of_step(5)] == ["all", "drop", "stale", "protect-a0.5"]
    load_args = SimpleNamespace(
        load_debug_rollout_data=os.path.join(out, manifest.rollout_data),
        load_debug_rollout_data_subsample=None,
    )
    for e in manifest:
        samples, _ = debug_data.load_debug_rollout_data(load_args, rollout_id=e.rollout_id)
        stale = {1} if e.step == 5 else {0, 2}
        assert len(samples) == 9 and e.stale_groups == len(stale)
        for s in samples:
            g, u = s.group_index, coin(SEED, s.group_index)
            keep = {
                "all": True,
                "drop": g not in stale,
                "stale": g in stale,
                "protect-a0.5": g not in stale or u < 0.5,
            }[e.arm]
            assert s.remove_sample == (not keep)
            protected = e.arm == "protect-a0.5" and g in stale and keep
            assert s.metadata.get(WEIGHT_KEY) == (2.0 if protected else None)
            assert s.metadata["rescue_would_drop"] == (g in stale)


# ---------------------------------------------------------------- the capture hook


@pytest.fixture
def megatron(monkeypatch, tmp_path):
    require_miles()
    from megatron.core import mpu
    from megatron_cpu import cpu_patch, gloo_world, miles_parallel_state

    monkeypatch.delenv("RESCUE_ORACLE_STREAM", raising=False)
    with gloo_world(), cpu_patch():
        mpu.initialize_model_parallel(1, 1)
        try:
            with miles_parallel_state():
                yield
        finally:
            mpu.destroy_model_parallel()


@pytest.fixture
def oracle(tmp_path):
    """An oracle directory of 2 steps x 3 arms (its replay files are not read here)."""
    d = tmp_path / "dumps"
    d.mkdir()
    for rid in (0, 1):
        torch.save(recorded_step(rid, stale={0}, groups=2, G=2, seed=rid), d / f"{rid}.pt")
    out = str(tmp_path / "oracle")
    build([str(d)], out, arms=("all", "drop", "stale"), progress=False)
    return out


def tiny():
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.enums import ModelType
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    class Tiny(MegatronModule):
        def __init__(self, config):
            super().__init__(config)
            self.a = torch.nn.Linear(4, 5)
            self.b = torch.nn.Linear(5, 2)
            self.model_type = ModelType.encoder_or_decoder

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

        def set_input_tensor(self, tensor):
            pass

    config = TransformerConfig(
        num_layers=1, hidden_size=4, num_attention_heads=1, use_cpu_initialization=True
    )
    torch.manual_seed(0)
    return DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), Tiny(config)
    )


def replay_args(directory, **overrides):
    manifest = Manifest.read(directory)
    base = dict(
        debug_disable_optimizer=True,
        load_debug_rollout_data=os.path.join(directory, manifest.rollout_data),
        custom_convert_samples_to_train_data_path=None,
    )
    return SimpleNamespace(**{**base, **overrides})


def micro_batches(rollout_id):
    g = torch.Generator().manual_seed(rollout_id)
    return [torch.randn(3, 4, generator=g) for _ in range(2)]


def train_one_step(ddp, args, rollout_id, step_id=0):
    """Miles' train() / train_one_step order without an optimizer: finalize function set,
    grads zeroed, the before-train-step hook, Megatron's forward/backward schedule."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_model_config

    from rescue.miles.train_step import before_train_step

    get_model_config(ddp).finalize_model_grads_func = finalize_model_grads  # set per rollout
    ddp.zero_grad_buffer()
    before_train_step(args, rollout_id, step_id, [ddp], None, None)
    data = iter(micro_batches(rollout_id))

    def forward_step(data_iterator, model):
        out = model(next(data_iterator))

        def loss(output):
            value = (output.pow(2).sum(dim=1) - output[:, 1]).sum()
            return value, {"loss": value.detach()}

        return out, loss

    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=data,
        model=[ddp],
        num_microbatches=2,
        seq_length=1,
        micro_batch_size=1,
        forward_only=False,
    )


def expected_gradient(ddp, rollout_id):
    """Plain autograd on a copy of the module: the mean over micro-batches of their losses."""
    import copy

    module = copy.deepcopy(ddp.module)
    module.zero_grad()
    total = 0.0
    for x in micro_batches(rollout_id):
        out = module(x)
        total = total + (out.pow(2).sum(dim=1) - out[:, 1]).sum() / 2
    total.backward()
    return {f"module.{n}": p.grad for n, p in module.named_parameters()}


def test_capture_writes_the_reduced_gradient_of_each_replayed_arm(megatron, oracle, monkeypatch):
    monkeypatch.setenv("RESCUE_ORACLE_DIR", oracle)
    ddp = tiny()
    args = replay_args(oracle)
    for rid in range(6):
        train_one_step(ddp, args, rid)
        saved = torch.load(os.path.join(oracle, "gradients", str(rid), "tp0-pp0.pt"))
        want = expected_gradient(ddp, rid)
        assert set(saved) == set(want)
        for name, g in want.items():
            torch.testing.assert_close(saved[name], g, rtol=1e-5, atol=1e-7)
    report = compare(oracle)
    assert report["source"].endswith("gradients") and len(report["steps"]) == 2


def test_streamed_statistics_equal_those_of_the_written_gradients(megatron, oracle, monkeypatch):
    monkeypatch.setenv("RESCUE_ORACLE_DIR", oracle)
    ddp = tiny()
    args = replay_args(oracle)
    for rid in range(6):
        train_one_step(ddp, args, rid)
    full = compare(oracle)
    monkeypatch.setenv("RESCUE_ORACLE_STREAM", "1")
    for rid in range(6):
        train_one_step(ddp, args, rid)
    with open(os.path.join(oracle, "stats", "2.json")) as f:
        stats = json.load(f)
    assert stats["arm"] == "stale" and set(stats["dots"]) == {"0", "1"}
    g = {
        r: torch.cat([t.reshape(-1) for _, t in sorted(torch.load(
            os.path.join(oracle, "gradients", str(r), "tp0-pp0.pt")).items())]).double()
        for r in (0, 1, 2)
    }  # fmt: skip
    assert stats["sq_norm"] == pytest.approx(float(g[2] @ g[2]), rel=1e-6)
    assert stats["dots"]["0"] == pytest.approx(float(g[2] @ g[0]), rel=1e-6)
    streamed = compare(oracle)
    assert streamed["source"] == "stats"
    for a, b in zip(full["steps"], streamed["steps"], strict=True):
        for arm in ("drop", "stale"):
            assert np.isclose(a["arms"][arm]["cos_all"], b["arms"][arm]["cos_all"], rtol=1e-6)


def test_stream_out_of_order_is_an_error(megatron, oracle, monkeypatch):
    monkeypatch.setenv("RESCUE_ORACLE_DIR", oracle)
    monkeypatch.setenv("RESCUE_ORACLE_STREAM", "1")
    with pytest.raises(ValueError, match="needs replay rollouts \\[3\\]"):
        train_one_step(tiny(), replay_args(oracle), 4)


def test_the_replay_flags_are_checked(megatron, oracle, monkeypatch):
    from rescue.miles.train_step import before_train_step

    monkeypatch.setenv("RESCUE_ORACLE_DIR", oracle)
    ddp = tiny()
    with pytest.raises(ValueError, match="--debug-disable-optimizer"):
        before_train_step(
            replay_args(oracle, debug_disable_optimizer=False), 0, 0, [ddp], None, None
        )
    with pytest.raises(ValueError, match="replays --load-debug-rollout-data"):
        before_train_step(replay_args(oracle, load_debug_rollout_data="/x/{rollout_id}.pt"), 0, 0, [ddp], None, None)  # fmt: skip
    with pytest.raises(ValueError, match="--global-batch-size"):
        before_train_step(replay_args(oracle), 0, 1, [ddp], None, None)
    with pytest.raises(ValueError, match="--num-rollout 6"):
        before_train_step(replay_args(oracle), 6, 0, [ddp], None, None)
    monkeypatch.setenv("RESCUE_ORACLE_STREAM", "yes")
    with pytest.raises(ValueError, match="RESCUE_ORACLE_STREAM='yes'; allowed: 0"):
        before_train_step(replay_args(oracle), 0, 0, [ddp], None, None)


def test_the_wrapper_is_replaced_not_stacked(megatron, oracle, monkeypatch):
    from megatron.core.utils import get_model_config

    from rescue.miles.train_step import before_train_step

    monkeypatch.setenv("RESCUE_ORACLE_DIR", oracle)
    ddp = tiny()
    config = get_model_config(ddp)
    config.finalize_model_grads_func = original = object()
    before_train_step(replay_args(oracle), 0, 0, [ddp], None, None)
    before_train_step(replay_args(oracle), 1, 0, [ddp], None, None)
    assert config.finalize_model_grads_func._rescue_oracle_original is original


def test_miles_objects_in_a_dump_need_unsafe_load_to_be_copied(miles, tmp_path):
    """A RewardSpec is read as an inert stand-in, which cannot be written back as Miles'
    class: build says so, and with --unsafe-load (Miles importable) copies it."""
    Sample, debug_data = miles
    from miles.utils.types import RewardSpec

    payload = recorded_step(0, stale={1}, groups=2, G=2)
    samples = [Sample.from_dict(s) for s in payload["samples"]]
    samples[0].reward_spec = RewardSpec(rm_type="math")
    template = str(tmp_path / "d" / "{rollout_id}.pt")
    dump_args = argparse.Namespace(
        save_debug_rollout_data=template, save_debug_trajectory_data=None
    )
    debug_data.save_debug_rollout_data(dump_args, samples, rollout_id=0, evaluation=False)
    with pytest.raises(ValueError, match="--unsafe-load with Miles on PYTHONPATH"):
        build([str(tmp_path / "d")], str(tmp_path / "o"), progress=False)
    build([str(tmp_path / "d")], str(tmp_path / "o"), progress=False, unsafe_load=True, force=True)
    load_args = SimpleNamespace(
        load_debug_rollout_data=str(tmp_path / "o" / "rollout_data" / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=None,
    )
    loaded, _ = debug_data.load_debug_rollout_data(load_args, rollout_id=1)
    assert loaded[0].reward_spec == RewardSpec(rm_type="math")
