"""The matched-update control's step layer on megatron-core 0.16.1's real classes (DDP,
get_megatron_optimizer -> ChainedOptimizer of FP32Optimizer / the distributed optimizer,
OptimizerParamScheduler, finalize_model_grads) on a CPU, one gloo process, under the
test-only CPU patch (tests/megatron_cpu.py).

Each rollout runs Miles' per-step sequence twice (zero grads, before-train-step hook,
forward/backward, finalize, optimizer.step(), scheduler.step(increment)): step 0 on copy A
(every row trained), step 1 on copy B (some rows masked). A second, identically built
"plain" setup without rescue's hook is synchronized to the matched one at each rollout start
and takes Megatron's real step on each copy: the independent reference."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
from megatron_step import megatron as megatron  # a fixture

from rescue.miles.matched import CONVERT_PATH, STEP_CONVERT_PATH
from rescue.miles.train_step import before_train_step

N_ROLLOUTS = 16  # rollouts per step (the scheduler's increment)
ARGS = SimpleNamespace(
    rollout_batch_size=2,
    n_samples_per_prompt=8,
    global_batch_size=16,
    num_steps_per_rollout=None,
    custom_convert_samples_to_train_data_path=CONVERT_PATH,
)


def build(optimizer, *, weight_decay, clip, distributed=False, lr=None):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    class Tiny(MegatronModule):
        def __init__(self, config):
            super().__init__(config)
            self.a = torch.nn.Linear(4, 6)
            self.b = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

        def set_input_tensor(self, tensor):
            pass

    lr = lr if lr is not None else (0.05 if optimizer == "adam" else 0.2)
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
            min_lr=0.0,
            bf16=False,
            fp16=False,
            use_distributed_optimizer=distributed,
            clip_grad=clip,
            weight_decay=weight_decay,
        ),
        [ddp],
    )
    # linear warmup over 6 steps of N_ROLLOUTS: the learning rate changes at every increment
    sched = OptimizerParamScheduler(
        opt,
        init_lr=0.25 * lr,
        max_lr=lr,
        min_lr=0.0,
        lr_warmup_steps=6 * N_ROLLOUTS,
        lr_decay_steps=100 * N_ROLLOUTS,
        lr_decay_style="constant",
        start_wd=weight_decay,
        end_wd=weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return ddp, opt, sched


def batch(rollout, masked):
    """Copy A (masked=False) or B of rollout ``rollout``: 8 rows, rows 5..7 masked in B."""
    import torch

    g = torch.Generator().manual_seed(100 + rollout)
    x = torch.randn(8, 4, generator=g)
    w = torch.ones(8)
    if masked:
        w[5:] = 0.0
    return x, w


def backward(ddp, x, w):
    from megatron.core.distributed import finalize_model_grads

    out = ddp(x)
    ((out.pow(2).sum(dim=1) - out[:, 0]) * w).sum().backward()
    finalize_model_grads([ddp])


def inner(opt):
    return opt.chained_optimizers[0].optimizer


def params(ddp):
    return [p.detach().clone() for p in ddp.parameters()]


def state(opt):
    return copy.deepcopy(inner(opt).state_dict()["state"])


def synchronize(plain, matched):
    """Give the plain setup the matched setup's parameters and optimizer state."""
    import torch

    (pddp, popt, _), (mddp, mopt, _) = plain, matched
    with torch.no_grad():
        for p, q in zip(pddp.parameters(), mddp.parameters(), strict=True):
            p.copy_(q)
    popt.reload_model_params()  # main params <- model params (mixed-precision optimizers)
    inner(popt).load_state_dict(copy.deepcopy(inner(mopt).state_dict()))
    for pg, mg in zip(inner(popt).param_groups, inner(mopt).param_groups, strict=True):
        pg["lr"], pg["weight_decay"] = mg["lr"], mg["weight_decay"]


def plain_step(plain, x, w):
    """Megatron's own step on the plain setup: (delta per parameter, state after)."""
    ddp, opt, _ = plain
    opt.zero_grad()
    ddp.zero_grad_buffer()
    before = params(ddp)
    backward(ddp, x, w)
    opt.step()
    return [p.detach() - q for p, q in zip(ddp.parameters(), before, strict=True)], state(opt)


def norm(deltas):
    return math.sqrt(sum(float(d.double().pow(2).sum()) for d in deltas))


STEP_ARGS = SimpleNamespace(
    **{**vars(ARGS), "custom_convert_samples_to_train_data_path": STEP_CONVERT_PATH}
)


def matched_step(setup, rollout, step_id, x, w, args=ARGS):
    """Miles' train_one_step sequence with rescue's hook."""
    ddp, opt, sched = setup
    opt.zero_grad()
    ddp.zero_grad_buffer()
    before_train_step(args, rollout, step_id, [ddp], opt, sched)
    backward(ddp, x, w)
    result = opt.step()
    assert result[0] is True
    sched.step(increment=N_ROLLOUTS)
    return result


def states_equal(a, b):
    import torch

    if a.keys() != b.keys():
        return False
    for k in a:
        if a[k].keys() != b[k].keys():
            return False
        for key, v in a[k].items():
            if not torch.equal(torch.as_tensor(v), torch.as_tensor(b[k][key])):
                return False
    return True


CASES = [
    pytest.param("sgd", 0.0, 0.0, False, id="sgd"),
    pytest.param("sgd", 0.1, 0.05, False, id="sgd-decay-clip"),
    pytest.param("adam", 0.0, 0.0, False, id="adam"),
    pytest.param("adam", 0.1, 0.0, False, id="adam-decay"),
    pytest.param("adam", 0.0, 0.05, False, id="adam-clip"),
    pytest.param("adam", 0.1, 0.05, False, id="adam-decay-clip"),
    pytest.param("adam", 0.1, 0.05, True, id="adam-decay-clip-distributed"),
]


@pytest.mark.parametrize(("optimizer", "weight_decay", "clip", "distributed"), CASES)
def test_matched_step_measures_copy_a_and_applies_copy_b_at_its_norm(
    megatron, optimizer, weight_decay, clip, distributed
):
    import torch

    logged = megatron
    matched = build(optimizer, weight_decay=weight_decay, clip=clip, distributed=distributed)
    plain = build(optimizer, weight_decay=weight_decay, clip=clip, distributed=distributed)
    ddp, opt, sched = matched
    clipped = 0
    for rollout in range(3):
        xa, wa = batch(rollout, masked=False)
        xb, wb = batch(rollout, masked=True)
        synchronize(plain, matched)
        ref_deltas, _ = plain_step(plain, xa, wa)
        synchronize(plain, matched)
        mask_deltas, mask_state = plain_step(plain, xb, wb)
        lr = inner(opt).param_groups[0]["lr"]

        # step 0, copy A: measured, nothing changes
        before_p, before_s = params(ddp), state(opt)
        _, grad_norm, _ = matched_step(matched, rollout, 0, xa, wa)
        clipped += bool(clip and grad_norm > clip)
        assert all(torch.equal(p, q) for p, q in zip(ddp.parameters(), before_p, strict=True))
        assert states_equal(state(opt), before_s)  # Adam moments and step / SGD momentum
        assert inner(opt).param_groups[0]["lr"] == lr  # the scheduler did not advance
        row0 = logged[-1][0]
        assert row0["train/rescue/matched_copy"] == 0
        assert row0["train/step"] == rollout * 2
        assert row0["train/rescue/update_norm"] == 0.0
        ref = norm(ref_deltas)
        assert row0["train/rescue/update_norm_ref"] == pytest.approx(ref, rel=1e-6)

        # step 1, copy B: its own step, rescaled to the reference norm
        before_p = params(ddp)
        matched_step(matched, rollout, 1, xb, wb)
        realized = [p.detach() - q for p, q in zip(ddp.parameters(), before_p, strict=True)]
        row1 = logged[-1][0]
        assert row1["train/rescue/matched_copy"] == 1 and row1["train/step"] == rollout * 2 + 1
        assert norm(realized) == pytest.approx(ref, rel=1e-6)
        assert row1["train/rescue/update_norm"] == pytest.approx(ref, rel=1e-6)
        scale = row1["train/rescue/update_scale"]
        assert scale == pytest.approx(ref / norm(mask_deltas), rel=1e-6)
        assert row1["train/rescue/update_norm_mask"] == pytest.approx(norm(mask_deltas), rel=1e-6)
        for r, m in zip(realized, mask_deltas, strict=True):  # the mask arm's direction
            torch.testing.assert_close(r, scale * m, rtol=1e-4, atol=1e-7)
        assert states_equal(state(opt), mask_state)  # moments do not depend on the lr
    assert sched.num_steps == 3 * N_ROLLOUTS  # one increment per rollout, not two
    if clip:
        assert clipped > 0  # the clip was active


@pytest.mark.parametrize(
    ("optimizer", "weight_decay", "clip", "distributed"),
    [
        c
        for c in CASES
        if c.id in ("sgd-decay-clip", "adam-decay-clip", "adam-decay-clip-distributed")
    ],
)
def test_step_control_measures_the_mask_copy_and_applies_r0s_at_its_norm(
    megatron, optimizer, weight_decay, clip, distributed
):
    """The step-size control: the same schedule with the copies' roles swapped. Step 0 takes
    the mask copy (B), measured and undone; step 1 takes the R = 0 copy (A), applied in its
    own direction at the mask step's norm, against the plain setup's Megatron steps."""
    import torch

    logged = megatron
    ctl = build(optimizer, weight_decay=weight_decay, clip=clip, distributed=distributed)
    plain = build(optimizer, weight_decay=weight_decay, clip=clip, distributed=distributed)
    ddp, opt, sched = ctl
    for rollout in range(3):
        xa, wa = batch(rollout, masked=False)
        xb, wb = batch(rollout, masked=True)
        synchronize(plain, ctl)
        ref_deltas, ref_state = plain_step(plain, xa, wa)
        synchronize(plain, ctl)
        mask_deltas, _ = plain_step(plain, xb, wb)
        target = norm(mask_deltas)

        before_p, before_s = params(ddp), state(opt)
        matched_step(ctl, rollout, 0, xb, wb, args=STEP_ARGS)
        assert all(torch.equal(p, q) for p, q in zip(ddp.parameters(), before_p, strict=True))
        assert states_equal(state(opt), before_s)
        row0 = logged[-1][0]
        assert row0["train/rescue/matched_copy"] == 0 and row0["train/rescue/update_norm"] == 0
        assert row0["train/rescue/update_norm_mask"] == pytest.approx(target, rel=1e-6)

        before_p = params(ddp)
        matched_step(ctl, rollout, 1, xa, wa, args=STEP_ARGS)
        realized = [p.detach() - q for p, q in zip(ddp.parameters(), before_p, strict=True)]
        row1 = logged[-1][0]
        assert row1["train/rescue/matched_copy"] == 1
        # the realized update is a difference of fp32 parameters: each element rounded once
        # at |θ|, so the norm is exact to ε·‖θ‖ (relative to a step smaller than R = 0's)
        rel = max(1e-6, float(torch.finfo(torch.float32).eps) * norm(before_p) / target)
        assert norm(realized) == pytest.approx(target, rel=rel)
        assert row1["train/rescue/update_norm"] == pytest.approx(target, rel=rel)
        assert row1["train/rescue/update_norm_mask"] == pytest.approx(target, rel=1e-6)
        assert row1["train/rescue/update_norm_ref"] == pytest.approx(norm(ref_deltas), rel=1e-6)
        scale = row1["train/rescue/update_scale"]
        assert scale == pytest.approx(target / norm(ref_deltas), rel=1e-6)
        for r, d in zip(realized, ref_deltas, strict=True):  # R = 0's direction
            torch.testing.assert_close(r, scale * d, rtol=1e-4, atol=1e-7)
        assert states_equal(state(opt), ref_state)
    assert sched.num_steps == 3 * N_ROLLOUTS


def test_realized_norm_differs_from_the_reference_without_the_control(megatron):
    """The check above can fail: the plain mask step's norm misses the reference norm by far
    more than the 1e-6 tolerance (Adam's first step is nearly sign(g), the closest case)."""
    matched = build("adam", weight_decay=0.1, clip=0.0)
    plain = build("adam", weight_decay=0.1, clip=0.0)
    synchronize(plain, matched)
    ref, _ = plain_step(plain, *batch(0, masked=False))
    synchronize(plain, matched)
    mask, _ = plain_step(plain, *batch(0, masked=True))
    assert abs(norm(mask) / norm(ref) - 1) > 1e-3


def test_the_layer_is_installed_only_with_the_matched_convert(megatron):
    ddp, opt, sched = build("adam", weight_decay=0.0, clip=0.0)
    args = SimpleNamespace(**{**vars(ARGS), "custom_convert_samples_to_train_data_path": None})
    before = params(ddp)
    opt.zero_grad()
    ddp.zero_grad_buffer()
    before_train_step(args, 0, 0, [ddp], opt, sched)
    backward(ddp, *batch(0, masked=False))
    opt.step()
    sched.step(increment=N_ROLLOUTS)
    assert any(not p.equal(q) for p, q in zip(ddp.parameters(), before, strict=True))
    assert sched.num_steps == N_ROLLOUTS
    assert "train/rescue/matched_copy" not in megatron[-1][0]
    assert megatron[-1][0]["train/step"] == 0  # S = 1 without the two copies


def test_copy_b_without_its_reference_is_an_error(megatron):
    matched = build("sgd", weight_decay=0.0, clip=0.0)
    with pytest.raises(RuntimeError, match="no reference norm"):
        matched_step(matched, 0, 1, *batch(0, masked=True))


def test_an_asynchronous_gather_inside_the_step_is_refused(megatron):
    matched = build("adam", weight_decay=0.0, clip=0.0)
    matched[1].config.overlap_param_gather_with_optimizer_step = True
    with pytest.raises(ValueError, match="--overlap-param-gather-with-optimizer-step"):
        matched_step(matched, 0, 0, *batch(0, masked=False))
