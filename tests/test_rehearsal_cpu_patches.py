"""The rehearsal's CPU stand-ins for what a GPU gives Megatron: packed attention as Transformer
Engine computes it, and torch.cuda's calls on a CPU. Known answers: attention over packed
sequences equals causal attention over each sequence alone; the stand-in generator forks and
restores like the GPU's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rescue.rehearsal.miles.attention import packed_attention  # noqa: E402
from rescue.rehearsal.miles.attention import patch as attention_patch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def causal(q, k, v, scale):
    """Causal softmax attention of one sequence, ``[s, heads, d]``, in float64."""
    heads = q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))
    scores = (q @ k.transpose(1, 2)) * scale
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    return out.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_attention_is_each_sequences_own_causal_attention(dtype):
    torch.manual_seed(0)
    lengths = [5, 37, 1, 12]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q = torch.randn(int(cu[-1]), 4, 8, dtype=dtype)
    k = torch.randn(int(cu[-1]), 2, 8, dtype=dtype)  # grouped-query: 2 groups for 4 heads
    v = torch.randn(int(cu[-1]), 2, 8, dtype=dtype)
    out = packed_attention(q, k, v, cu, cu, scale=8**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        want = causal(q[a:b], k[a:b], v[a:b], 8**-0.5)
        assert torch.allclose(out[a:b].double(), want, atol=tol), (a, b)


def test_padded_packing_reads_each_sequence_from_its_padded_start_and_zeros_the_padding():
    torch.manual_seed(1)
    lengths, padded = [3, 4], [0, 8, 16]  # sequences at 0 and 8, each padded to 8
    cu = torch.tensor([0, 3, 7])
    q, k, v = (torch.randn(16, 2, 4) for _ in range(3))
    out = packed_attention(q, k, v, cu, cu, scale=0.5, starts_q=torch.tensor(padded),
                           starts_kv=torch.tensor(padded))  # fmt: skip
    assert torch.allclose(out[0:3].double(), causal(q[0:3], k[0:3], v[0:3], 0.5), atol=1e-5)
    assert torch.allclose(out[8:12].double(), causal(q[8:12], k[8:12], v[8:12], 0.5), atol=1e-5)
    assert torch.count_nonzero(out[3:8]) == 0 and torch.count_nonzero(out[12:]) == 0
    assert lengths == [3, 4]


def test_the_patched_forward_takes_packed_input_and_leaves_the_rest_to_megatron():
    calls = []

    class DotProductAttention:
        def __init__(self):
            self.softmax_scale = 0.5
            self.config = types.SimpleNamespace(context_parallel_size=1,
                                                attention_softmax_in_fp32=True)  # fmt: skip

        def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None):  # fmt: skip
            calls.append("megatron")
            return "megatron's"

    module = types.SimpleNamespace(DotProductAttention=DotProductAttention)
    attention_patch(module)
    layer = DotProductAttention()
    q = k = v = torch.randn(6, 2, 4)
    assert layer.forward(q, k, v, None) == "megatron's"
    cu = torch.tensor([0, 2, 6])
    packed = types.SimpleNamespace(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                   cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None)  # fmt: skip
    out = layer.forward(q, k, v, None, packed_seq_params=packed)
    assert calls == ["megatron"] and tuple(out.shape) == (6, 8)
    assert torch.allclose(out[2:6].reshape(4, 2, 4).double(), causal(q[2:6], k[2:6], v[2:6], 0.5),
                          atol=1e-5)  # fmt: skip
    layer.config.context_parallel_size = 2
    with pytest.raises(NotImplementedError, match="context parallelism"):
        layer.forward(q, k, v, None, packed_seq_params=packed)


DEVICE = textwrap.dedent(
    """
    import types, torch
    from rescue.rehearsal.miles import device
    device.install()
    out = {}
    out["device"] = torch.cuda.current_device()
    out["zeros"] = str(torch.zeros(2, device="cuda").device)
    out["to"] = str(torch.ones(1).to("cuda:0").device) + str(torch.ones(1).cuda().device)
    pinned = torch.empty_like(torch.ones(2), device=torch.device("cpu"), pin_memory=True)
    out["pinned"] = (str(pinned.device), pinned.is_pinned())
    out["type"] = torch.ones(1).type() + " " + torch.ones(1, dtype=torch.bfloat16).type()
    out["cast"] = torch.ones(1).type(torch.float64).dtype == torch.float64
    free, total = torch.cuda.mem_get_info()
    out["memory"] = 0 < free <= total
    torch.cuda.manual_seed(5)
    state = torch.cuda.get_rng_state()
    g = torch.cuda.default_generators[0]
    a = torch.rand(3, generator=g)
    torch.cuda.set_rng_state(state)
    b = torch.rand(3, generator=g)
    out["rng"] = bool(torch.equal(a, b))
    torch.cuda.manual_seed(5)
    out["seeded"] = bool(torch.equal(torch.rand(3, generator=g), a))
    rng = types.SimpleNamespace()
    device.patch_rng(rng)
    rng._set_cuda_rng_state(state)
    out["megatron_rng"] = bool(torch.equal(torch.rand(3, generator=g), a))
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda.current_stream().wait_stream(torch.cuda.Stream())
    torch.cuda.synchronize()
    print(out)
    """
)


def test_the_cuda_stand_ins_keep_each_calls_meaning_on_a_cpu():
    if torch.cuda.is_available():
        pytest.skip("the stand-ins install only where CUDA is missing")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", DEVICE], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = eval(done.stdout.strip().splitlines()[-1])  # the dict printed above
    assert out["device"] == "cpu" and out["zeros"] == "cpu" and out["to"] == "cpucpu"
    assert out["pinned"] == ("cpu", False)  # Miles' weight backup beside a reference model
    assert out["type"] == "torch.cuda.FloatTensor torch.cuda.BFloat16Tensor" and out["cast"]
    assert out["memory"] and out["rng"] and out["seeded"] and out["megatron_rng"]


def test_an_optimizer_before_its_first_step_gives_its_state_dict_with_step_zero():
    """Megatron's path without Apex or TE asserts one step count among the parameters' states;
    a new optimizer (a resumed run's template, before the checkpoint fills it) has none."""
    from rescue.rehearsal.miles.patches import optimizer_state_before_a_step

    class DistributedOptimizer:  # the part of Megatron's that asserts (distrib_optimizer ~672)
        def __init__(self, optimizer):
            self.optimizer, self.grad_scaler = optimizer, None

        def state_dict(self):
            steps = {s["step"].item() for s in self.optimizer.state_dict()["state"].values()}
            assert len(steps) == 1
            return {"step": steps.pop()}

    module = types.SimpleNamespace(DistributedOptimizer=DistributedOptimizer, HAVE_APEX_OR_TE=False)
    optimizer_state_before_a_step(module)
    p = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([p], lr=0.1)
    groups = DistributedOptimizer(adam).state_dict()["optimizer"]["param_groups"]
    assert [g["step"] for g in groups] == [0] and "params" not in groups[0]
    p.grad = torch.ones(3)
    adam.step()
    assert DistributedOptimizer(adam).state_dict() == {"step": 1.0}  # then Megatron's own
