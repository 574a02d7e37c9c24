"""One wrapper around a Megatron optimizer's ``step``, and the layers that run inside it.

Specification
-------------
``StepWrapper.install(optimizer)`` replaces ``optimizer.step`` (an instance attribute, so
Miles' call ``optimizer.step()`` reaches it) by a ``StepWrapper`` exactly once per
optimizer: a second call returns the installed wrapper. It works with Megatron's
``ChainedOptimizer`` (what ``get_megatron_optimizer`` returns) and with any single
``MegatronOptimizer``.

A call runs the layers outermost first, each as ``layer(ctx, optimizer, step)`` where
``step()`` runs the next layer and finally the original ``step``; every layer returns the
original's result ``(update_successful, grad_norm, num_zeros_in_grad)``. A layer may
measure around ``step()`` (``UpdateNorm``), skip it, call it on changed settings, or undo
its effect, which is what a control that measures a step without applying it needs.
``ctx`` (a ``StepContext``) carries the arguments, the rollout and step ids the
before-train-step hook saw, and a ``metrics`` dict the layers fill.

``UpdateNorm`` measures the parameter delta of the step, ``‖θ_after − θ_before‖₂``, on
the optimizer's main parameters (fp32 masters under mixed precision, this rank's shard
under the distributed optimizer), counting each parameter once as Megatron's grad norm
does (no shared duplicate, no tensor-parallel replica), with the squared norms of each
child optimizer all-reduced over its grad-stats group. It keeps one copy of the main
parameters during the step (4 bytes per fp32 element on each rank). Under
``--use-precision-aware-optimizer`` the optimizer's parameters are the low-precision ones
(the fp32 masters live in its state), so the norm is that of the change they received.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Attribute marking an optimizer whose ``step`` is wrapped.
ATTRIBUTE = "_rescue_step_wrapper"


@dataclass
class StepContext:
    """What the layers of one optimizer step know: the hook's arguments and their metrics."""

    args: Any = None
    rollout_id: int = 0
    step_id: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


Layer = Callable[[StepContext, Any, Callable[[], Any]], Any]


class StepWrapper:
    """``optimizer.step`` with layers around it (module docstring)."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.original = optimizer.step
        self.layers: list[Layer] = []
        self.context = StepContext()

    @classmethod
    def install(cls, optimizer: Any) -> StepWrapper:
        """The optimizer's wrapper, installing it on the first call only."""
        wrapper = optimizer.__dict__.get(ATTRIBUTE)
        if wrapper is None:
            wrapper = cls(optimizer)
            optimizer.step = wrapper
            setattr(optimizer, ATTRIBUTE, wrapper)
        return wrapper

    def ensure(self, layer_type: type, *args: Any, **kwargs: Any) -> Any:
        """The layer of this type, appended (innermost so far) if absent."""
        for layer in self.layers:
            if type(layer) is layer_type:
                return layer
        layer = layer_type(*args, **kwargs)
        self.layers.append(layer)
        return layer

    def __call__(self) -> Any:
        ctx = self.context

        def run(k: int) -> Any:
            if k == len(self.layers):
                return self.original()
            return self.layers[k](ctx, self.optimizer, lambda: run(k + 1))

        return run(0)


def child_optimizers(optimizer: Any) -> list:
    """The optimizers a ``ChainedOptimizer`` chains, or ``[optimizer]``."""
    chained = getattr(optimizer, "chained_optimizers", None)
    return list(chained) if chained is not None else [optimizer]


def main_parameters(child: Any) -> list:
    """The child's main parameters counted by the norm (no shared, no TP duplicate)."""
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import param_is_not_shared

    tp_group = getattr(child, "tp_group", None)
    return [
        p
        for p in child.get_parameters()
        if param_is_not_shared(p)
        and tensor_parallel.param_is_not_tensor_parallel_duplicate(p, tp_group)
    ]


def _all_reduce(value: Any, group: Any) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value, group=group)


class UpdateNorm:
    """Layer: ``metrics["update_norm"]``, the L2 norm of the step's parameter delta."""

    key = "update_norm"

    def __call__(self, ctx: StepContext, optimizer: Any, step: Callable[[], Any]) -> Any:
        import torch

        children = [(c, main_parameters(c)) for c in child_optimizers(optimizer)]
        with torch.no_grad():
            before = [[p.detach().clone() for p in params] for _, params in children]
        result = step()
        total = 0.0
        with torch.no_grad():
            for (child, params), old in zip(children, before, strict=True):
                device = params[0].device if params else torch.device("cpu")
                sq = torch.zeros((), dtype=torch.float64, device=device)
                for p, q in zip(params, old, strict=True):
                    sq += (p.detach().double() - q.double()).pow(2).sum()
                _all_reduce(sq, child.get_grad_stats_parallel_group())
                total += float(sq)
        ctx.metrics[self.key] = math.sqrt(total)
        return result
