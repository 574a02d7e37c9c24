"""The gradient of one dump as the trainer trains it: what the oracle's arms are compared on.

Specification
-------------
For a dump (one step's batch, e.g. an oracle replay input) and a causal LM ``π_θ``::

    g = ∇ Σ_i f_i · A_i · Σ_t m_{i,t} log π_θ(y_t | y_<t)

- ``A_i``: the rollout's group-normalized reward (``rescue.advantages.group_advantages``,
  population ``all``, so a masked rollout still votes as in Miles; divided by the group
  std unless ``std_normalize`` is off), times its loss weight ``metadata["rescue_weight"]``
  (default 1) after normalization, as rescue's reward hook does;
- ``m_{i,t}``: 1 on the response tokens the loss trains (loss mask 1, the sample not
  ``remove_sample``), 0 elsewhere;
- ``f_i = 1/N`` (``sum``) or ``1/(N n_i)`` (``sample-mean``: Miles' per-rollout token mean,
  ``n_i`` the rollout's trained tokens), with ``N`` every rollout of the dump, masked ones
  included, as Miles' ``num_rollouts``.

It is the ascent direction of the policy-gradient surrogate at ratio 1 (a fixed checkpoint,
no clipping, no importance weights); Miles' captured gradient is that of the loss, so the
two differ in sign and in those corrections. A rollout without a finite reward cannot be
trained and is an error naming it. The result maps each trainable parameter's name to its
gradient (zeros where no token reaches it), in the model's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rescue.advantages import group_advantages
from rescue.errors import InputError
from rescue.replay.dumps import Dump
from rescue.replay.gradients import REDUCTIONS
from rescue.samples import weight_of


def trained_gradient(
    dump: Dump,
    model: Any,
    *,
    std_normalize: bool = True,
    reduction: str = "sum",
    eps: float = 1e-6,
    device: str = "cpu",
) -> dict[str, Any]:
    """``{parameter name: gradient}`` of the dump's batch (module docstring).

    Defaults: GRPO std normalization, ``sum`` reduction, eps 1e-6, CPU.
    """
    import torch

    from rescue.replay.model import Scorer

    if reduction not in REDUCTIONS:
        raise InputError(f"--reduction={reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    trajectories = dump.trajectories
    for t in trajectories:
        if t.reward is None or not np.isfinite(t.reward):
            raise InputError(
                f"{dump.path}: rollout {t.key!r} of group {t.group[1]!r} has no finite reward; "
                "the trainer cannot train it"
            )
    codes: dict[Any, int] = {}
    group = np.array([codes.setdefault(t.group, len(codes)) for t in trajectories])
    weights = np.array([weight_of(dump.samples[t.samples[0]]) for t in trajectories])
    A = group_advantages(
        np.array([t.reward for t in trajectories], dtype=np.float64),
        group,
        std_normalize=std_normalize,
        weights=weights,
        eps=eps,
    )
    scorer = Scorer(model, device)
    model.zero_grad(set_to_none=True)
    N = max(len(trajectories), 1)
    for i, t in enumerate(trajectories):
        masks = [
            (turns > 0) & (not bool(dump.samples[p].get("remove_sample", False)))
            for p, turns in zip(t.samples, t.token_turns, strict=True)
        ]
        n_i = int(sum(int(m.sum()) for m in masks))
        if n_i == 0 or A[i] == 0.0:
            continue
        f = 1.0 / N if reduction == "sum" else 1.0 / (N * n_i)
        for p, m in zip(t.samples, masks, strict=True):
            if not m.any():
                continue
            logp = scorer.logprobs(dump.samples[p], f"{dump.path}: samples[{p}]")
            w = torch.as_tensor(f * A[i] * m, dtype=logp.dtype, device=logp.device)
            (w * logp).sum().backward()
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            out[name] = g.detach().clone()
    model.zero_grad(set_to_none=True)
    return out
