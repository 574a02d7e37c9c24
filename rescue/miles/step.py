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

Measuring a step without applying it (``measured_inner_steps``): inside Megatron's
``step()`` each child calls its inner torch optimizer's ``step()`` once, after the
gradients are prepared and clipped and before the main parameters are copied to the
model. While the context is active that inner call becomes *snapshot, step, measure,
restore*: ``OptimizerSnapshot`` copies every tensor the child's torch optimizers hold (the
parameters of their groups and every state tensor: Adam's moments and step, SGD's
momentum, a precision-aware optimizer's master weights; with ``--optimizer-cpu-offload``
the hybrid optimizer's CPU sub-optimizers too) and their group settings, and restores them
in place, deleting state the step created. Megatron then copies the restored main
parameters to the model and gathers them as usual, so parameters and optimizer state are
exactly as before the step while the delta norm of the step is known. The gradients stay
prepared and clipped until Miles zeroes them, so ``step_with_ready_grads()`` can apply a
step afterwards (``rescue.miles.matched``). Cost: one copy of the parameters and state of
this rank's shard while the inner step runs (12 bytes per element for fp32 Adam).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
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


def delta_sq(child: Any, params: list, before: list) -> float:
    """``Σ ‖p − before‖²`` over ``params``, all-reduced over the child's grad-stats group."""
    import torch

    with torch.no_grad():
        device = params[0].device if params else torch.device("cpu")
        sq = torch.zeros((), dtype=torch.float64, device=device)
        for p, q in zip(params, before, strict=True):
            sq += (p.detach().double() - q.to(p.device).double()).pow(2).sum()
        _all_reduce(sq, child.get_grad_stats_parallel_group())
    return float(sq)


class UpdateNorm:
    """Layer: ``metrics["update_norm"]``, the L2 norm of the step's parameter delta."""

    key = "update_norm"

    def __call__(self, ctx: StepContext, optimizer: Any, step: Callable[[], Any]) -> Any:
        import torch

        children = [(c, main_parameters(c)) for c in child_optimizers(optimizer)]
        with torch.no_grad():
            before = [[p.detach().clone() for p in params] for _, params in children]
        result = step()
        total = sum(
            delta_sq(child, params, old)
            for (child, params), old in zip(children, before, strict=True)
        )
        ctx.metrics[self.key] = math.sqrt(total)
        return result


def inner_optimizers(child: Any) -> list:
    """The torch optimizers that hold a child's parameters and state: its inner optimizer
    and, for Megatron's hybrid CPU-offload optimizer, its sub-optimizers."""
    inner = getattr(child, "optimizer", None)
    if inner is None:
        return []
    return [inner, *getattr(inner, "sub_optimizers", ())]


def _clone(value: Any) -> Any:
    import torch

    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.copy(value)


class OptimizerSnapshot:
    """Every tensor and group setting a child's torch optimizers hold, restorable in place."""

    def __init__(self, child: Any) -> None:
        self.child = child
        self.optimizers = inner_optimizers(child)
        self.params: dict[int, tuple[Any, Any]] = {}
        self.groups: list[tuple[dict, dict]] = []
        self.states: list[tuple[Any, dict]] = []
        for opt in self.optimizers:
            for group in opt.param_groups:
                self.groups.append(
                    (group, {k: _clone(v) for k, v in group.items() if k != "params"})
                )
                for p in group["params"]:
                    self.params.setdefault(id(p), (p, p.detach().clone()))
            self.states.append(
                (opt, {p: {k: _clone(v) for k, v in st.items()} for p, st in opt.state.items()})
            )

    def before(self, param: Any) -> Any:
        """The saved value of one parameter of the snapshot."""
        return self.params[id(param)][1]

    def restore(self) -> None:
        """Put every saved tensor back in place; drop state and group keys added since."""
        import torch

        with torch.no_grad():
            for p, saved in self.params.values():
                p.detach().copy_(saved)
            for group, saved in self.groups:
                for key in [k for k in group if k != "params" and k not in saved]:
                    del group[key]
                group.update({k: _clone(v) for k, v in saved.items()})
            for opt, saved in self.states:
                for p in list(opt.state.keys()):
                    if p not in saved:
                        del opt.state[p]
                        continue
                    state, old = opt.state[p], saved[p]
                    for key in [k for k in state if k not in old]:
                        del state[key]
                    for key, value in old.items():
                        current = state.get(key)
                        if (
                            isinstance(value, torch.Tensor)
                            and isinstance(current, torch.Tensor)
                            and current.shape == value.shape
                            and current.dtype == value.dtype
                        ):
                            current.copy_(value)
                        else:
                            state[key] = _clone(value)
        inner = getattr(self.child, "optimizer", None)
        sync = getattr(inner, "_sync_sub_optimizers_state_to_hdo", None)
        if sync is not None:
            sync()  # the hybrid optimizer's own view of its sub-optimizers' state


@contextlib.contextmanager
def measured_inner_steps(optimizer: Any, record: Callable[[float], None]) -> Iterator[None]:
    """While active, each child's inner step is run, measured and undone (module docstring).

    ``record`` receives each child's ``‖Δθ‖²`` (all-reduced over its grad-stats group).
    """
    patched = []
    for child in child_optimizers(optimizer):
        inner = getattr(child, "optimizer", None)
        if inner is None:
            continue
        own = inner.__dict__.get("step")
        original = inner.step

        def measured(*args: Any, _child=child, _original=original, **kwargs: Any) -> Any:
            params = main_parameters(_child)
            snapshot = OptimizerSnapshot(_child)
            out = _original(*args, **kwargs)
            record(delta_sq(_child, params, [snapshot.before(p) for p in params]))
            snapshot.restore()
            return out

        inner.step = measured
        patched.append((inner, own))
    try:
        yield
    finally:
        for inner, own in patched:
            if own is None:
                del inner.step
            else:
                inner.step = own


@contextlib.contextmanager
def scaled_learning_rate(optimizer: Any, scale: float) -> Iterator[None]:
    """Every inner parameter group's ``lr`` multiplied by ``scale`` for the block."""
    groups = [
        g for c in child_optimizers(optimizer) for g in getattr(c.optimizer, "param_groups", ())
    ]
    saved = [g["lr"] for g in groups]
    for g in groups:
        g["lr"] = g["lr"] * scale
    try:
        yield
    finally:
        for g, lr in zip(groups, saved, strict=True):
            g["lr"] = lr
