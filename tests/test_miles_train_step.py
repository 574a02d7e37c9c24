"""The before-train-step hook and its optimizer-step wrapper on megatron-core 0.16.1's real
classes (DDP, get_megatron_optimizer -> ChainedOptimizer, FP32 / distributed optimizer) on a
CPU, one gloo process, under the test-only CPU patch (tests/megatron_cpu.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from megatron_step import megatron as megatron  # a fixture
from miles_env import require_miles

from rescue.miles.loss import LOSS_PATH, STEP_HOOK_PATH, check_loss_flags
from rescue.miles.train_step import ENV_UPDATE_NORM, MOMENTS, before_train_step


def build(optimizer="adam", distributed=False, lr=0.05):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    class Tiny(MegatronModule):
        def __init__(self, config):
            super().__init__(config)
            self.a = torch.nn.Linear(4, 3)
            self.b = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

        def set_input_tensor(self, tensor):
            pass

    config = TransformerConfig(
        num_layers=1, hidden_size=4, num_attention_heads=1, use_cpu_initialization=True
    )
    torch.manual_seed(0)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=distributed
        ),
        Tiny(config),
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer=optimizer,
            lr=lr,
            bf16=False,
            fp16=False,
            use_distributed_optimizer=distributed,
            clip_grad=1.0,
            weight_decay=0.0,
        ),
        [ddp],
    )
    return ddp, opt


def train_step(ddp, opt, args, rollout_id, step_id, seed):
    import torch
    from megatron.core.distributed import finalize_model_grads

    opt.zero_grad()
    ddp.zero_grad_buffer()
    before_train_step(args, rollout_id, step_id, [ddp], opt, None)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))
    ddp(x).pow(2).sum().backward()
    finalize_model_grads([ddp])
    before = [p.detach().clone() for p in ddp.parameters()]
    result = opt.step()
    delta = math.sqrt(
        sum(
            float(((p.detach() - q) ** 2).sum())
            for p, q in zip(ddp.parameters(), before, strict=True)
        )
    )
    return result, delta


ARGS = SimpleNamespace(
    rollout_batch_size=4, n_samples_per_prompt=8, global_batch_size=16, num_steps_per_rollout=None
)


@pytest.mark.parametrize(
    ("optimizer", "distributed"), [("adam", False), ("sgd", False), ("adam", True)]
)
def test_update_norm_is_the_parameter_delta_of_each_step(megatron, optimizer, distributed):
    logged = megatron
    ddp, opt = build(optimizer, distributed)
    for k in range(3):
        result, delta = train_step(ddp, opt, ARGS, rollout_id=5, step_id=k % 2, seed=k)
        assert result[0] is True and delta > 0
        metrics, key = logged[-1]
        assert key == "train/step"
        assert metrics["train/rescue/update_norm"] == pytest.approx(delta, rel=1e-6)
        assert metrics["train/step"] == 5 * 2 + k % 2  # S = 4 * 8 // 16 = 2 steps per rollout


def test_the_wrapper_is_installed_once(megatron):
    ddp, opt = build()
    train_step(ddp, opt, ARGS, 0, 0, seed=0)
    wrapper = opt.step
    train_step(ddp, opt, ARGS, 0, 1, seed=1)
    train_step(ddp, opt, ARGS, 1, 0, seed=2)
    assert opt.step is wrapper and len(wrapper.layers) == 2
    inner = opt.chained_optimizers[0].optimizer
    assert all(int(s["step"]) == 3 for s in inner.state.values())  # one real step per call


def test_update_norm_off(megatron, monkeypatch):
    monkeypatch.setenv(ENV_UPDATE_NORM, "0")
    ddp, opt = build()
    MOMENTS.reset()
    train_step(ddp, opt, ARGS, 0, 0, seed=0)
    assert megatron == []  # no update norm, no advantage recorded: nothing to log
    monkeypatch.setenv(ENV_UPDATE_NORM, "yes")
    with pytest.raises(ValueError, match="RESCUE_UPDATE_NORM='yes'; allowed: 1"):
        train_step(ddp, opt, ARGS, 0, 1, seed=1)


def test_advantage_moments_of_the_trained_tokens_are_logged_once_per_micro_batch(megatron):
    import torch

    logged = megatron
    ddp, opt = build()
    a1, m1 = (
        [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, 5.0])],
        [torch.tensor([1, 0, 1]), torch.tensor([1, 1])],
    )
    a2, m2 = [torch.tensor([4.0])], [torch.tensor([1])]

    def step_with_records():
        before_train_step(ARGS, 0, 0, [ddp], opt, None)
        MOMENTS.record(a1, a1, m1)
        MOMENTS.record(a1, a1, m1)  # the same micro-batch recomputed: counted once
        MOMENTS.record(a2, a2, m2)
        ddp(torch.ones(1, 4)).sum().backward()
        opt.step()

    step_with_records()
    trained = np.array([1.0, 3.0, -1.0, 5.0, 4.0])
    metrics = logged[-1][0]
    assert metrics["train/rescue/adv_tokens"] == 5
    assert metrics["train/rescue/adv_mean"] == pytest.approx(trained.mean())
    assert metrics["train/rescue/adv_var"] == pytest.approx(trained.var())
    step_with_records()  # the next step starts from zero
    assert logged[-1][0]["train/rescue/adv_tokens"] == 5


def test_a_layer_can_measure_a_step_without_applying_it(megatron):
    """The wrapper's contract for controls that measure at one step and apply at another:
    a layer that restores parameters and optimizer state leaves both unchanged."""
    import copy

    import torch

    from rescue.miles.step import StepWrapper, UpdateNorm

    ddp, opt = build()
    train_step(ddp, opt, ARGS, 0, 0, seed=0)  # Adam state exists

    class MeasureOnly:
        def __call__(self, ctx, optimizer, step):
            params = [p.detach().clone() for p in ddp.parameters()]
            state = copy.deepcopy(optimizer.chained_optimizers[0].optimizer.state_dict())
            result = step()
            with torch.no_grad():
                for p, q in zip(ddp.parameters(), params, strict=True):
                    p.copy_(q)
            optimizer.chained_optimizers[0].optimizer.load_state_dict(state)
            return result

    wrapper = StepWrapper.install(opt)
    wrapper.layers = [wrapper.layers[0], MeasureOnly(), UpdateNorm()]
    before = [p.detach().clone() for p in ddp.parameters()]
    state = copy.deepcopy(opt.chained_optimizers[0].optimizer.state_dict()["state"])
    ddp(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ddp.parameters(), before, strict=True))
    after = opt.chained_optimizers[0].optimizer.state_dict()["state"]
    assert all(torch.equal(after[k]["exp_avg"], state[k]["exp_avg"]) for k in state)
    assert megatron[-1][0]["train/rescue/update_norm"] > 0  # measured inside, undone outside


def test_no_optimizer_installs_nothing(megatron):
    before_train_step(ARGS, 0, 0, [], None, None)  # --debug-disable-optimizer
    assert megatron == []


def test_loss_flags_are_checked():
    good = SimpleNamespace(
        use_opd=False, custom_megatron_before_train_step_hook_path=STEP_HOOK_PATH
    )
    check_loss_flags(good)
    with pytest.raises(ValueError, match=f"{LOSS_PATH} with --use-opd"):
        check_loss_flags(SimpleNamespace(**{**vars(good), "use_opd": True}))
    with pytest.raises(
        ValueError, match=f"--custom-megatron-before-train-step-hook-path {STEP_HOOK_PATH}"
    ):
        check_loss_flags(
            SimpleNamespace(use_opd=False, custom_megatron_before_train_step_hook_path=None)
        )


def test_loss_flags_are_checked_at_the_first_call_of_the_loss():
    require_miles()
    with pytest.raises(ValueError, match="--use-opd"):
        from rescue.miles.loss import policy_loss

        policy_loss(SimpleNamespace(use_opd=True), {}, None, None)
