"""Packed sequences for Megatron's local attention, as Transformer Engine's kernel computes them.

Miles trains on packed batches (``--qkv-format thd``): the micro-batch is one row of several
sequences back to back, with their boundaries in ``PackedSeqParams.cu_seqlens_q``. On a GPU,
Transformer Engine's fused attention masks across the boundaries. Megatron's own
``DotProductAttention`` (``--transformer-impl local``, the only attention without TE) refuses
packed input. ``forward`` takes its place for packed input only: causal softmax attention
inside each sequence (torch's fused ``scaled_dot_product_attention``), grouped-query heads
repeated, in float32 when the config asks for the softmax in float32, zeros at padding between
sequences; unpacked input goes to Megatron's own forward.
"""

from __future__ import annotations

import types
from typing import Any


def packed_attention(
    query: Any,
    key: Any,
    value: Any,
    cu_seqlens_q: Any,
    cu_seqlens_kv: Any,
    *,
    scale: float,
    starts_q: Any = None,
    starts_kv: Any = None,
    softmax_in_fp32: bool = True,
) -> Any:
    """Causal attention per packed sequence. ``query`` ``[t, np, hn]``, ``key``/``value``
    ``[t, ng, hn]``; sequence ``i`` has ``cu[i+1] - cu[i]`` tokens starting at ``starts[i]``
    (``cu[i]`` unless the layout is padded). Returns ``[t, np, hn]``."""
    import torch

    out = torch.zeros_like(query)
    heads, groups = query.shape[1], key.shape[1]
    starts_q = cu_seqlens_q if starts_q is None else starts_q
    starts_kv = cu_seqlens_kv if starts_kv is None else starts_kv
    dtype = torch.float32 if softmax_in_fp32 else query.dtype
    for i in range(len(cu_seqlens_q) - 1):
        n_q = int(cu_seqlens_q[i + 1] - cu_seqlens_q[i])
        n_kv = int(cu_seqlens_kv[i + 1] - cu_seqlens_kv[i])
        if n_q == 0:
            continue
        a, b = int(starts_q[i]), int(starts_kv[i])
        q = query[a : a + n_q].transpose(0, 1).to(dtype)  # [np, sq, hn]
        k = key[b : b + n_kv].transpose(0, 1).to(dtype)
        v = value[b : b + n_kv].transpose(0, 1).to(dtype)
        if heads != groups:
            k = k.repeat_interleave(heads // groups, dim=0)
            v = v.repeat_interleave(heads // groups, dim=0)
        if n_q == n_kv:  # torch's fused kernel (4-d input): no [sq, sk] matrix held
            o = torch.nn.functional.scaled_dot_product_attention(
                q[None], k[None], v[None], is_causal=True, scale=scale
            )[0]
        else:  # queries at the end of the keys (aligned bottom-right)
            causal = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril(n_kv - n_q)
            scores = (q @ k.transpose(1, 2)) * scale
            o = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        out[a : a + n_q] = o.transpose(0, 1).to(out.dtype)
    return out


def patch(module: types.ModuleType) -> None:
    """The row's ``apply`` on ``megatron.core.transformer.dot_product_attention``."""
    cls = module.DotProductAttention
    original = cls.forward

    def forward(
        self: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> Any:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            return original(
                self, query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                attention_bias=attention_bias, packed_seq_params=packed_seq_params,
            )  # fmt: skip
        if self.config.context_parallel_size > 1:
            raise NotImplementedError(
                "CPU rehearsal: packed attention with context parallelism is not rehearsed"
            )
        p = packed_seq_params
        out = packed_attention(
            query, key, value, p.cu_seqlens_q, p.cu_seqlens_kv,
            scale=self.softmax_scale,
            starts_q=getattr(p, "cu_seqlens_q_padded", None),
            starts_kv=getattr(p, "cu_seqlens_kv_padded", None),
            softmax_in_fp32=bool(self.config.attention_softmax_in_fp32),
        )  # fmt: skip
        return out.reshape(out.size(0), -1)

    cls.forward = forward
