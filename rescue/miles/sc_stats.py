"""The figures score centering records per step, shared by its loss and the train-step hook.

Specification
-------------
``SC_STATS`` (an ``SCStats``) accumulates, per optimizer step, the token count and the sums
of ``STAT_KEYS[1:]`` that ``rescue.miles.sc_loss.policy_loss`` records once per
micro-batch; ``rescue.miles.train_step`` reduces them over DP x CP after the step, logs
``train/rescue/sc/*`` and resets them. Both import it from here, so neither imports the
other (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Keys of ``train/rescue/sc/*``, in ``SCStats`` order.
STAT_KEYS = ("tokens", "head_mass_sampler", "head_mass_trainer", "truncated_frac", "correction_l1")


class SCStats:
    """Token count and sums of the per-token figures of the current step (``STAT_KEYS``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._seen: dict[int, Any] = {}
        self.sums: Any = None

    def record(self, key: Any, sums: Any) -> None:
        """Add one micro-batch's sums ``[5]`` (float64); ``key`` once per step."""
        if id(key) in self._seen:
            return
        self._seen[id(key)] = key
        self.sums = sums if self.sums is None else self.sums + sums

    def reduce(self, groups: Sequence[Any] = ()) -> dict[str, float]:
        """``sc/<key>`` means over the tokens of all ranks of ``groups`` (all-reduced);
        every rank must call it. Empty when no token was trained anywhere."""
        import torch
        import torch.distributed as dist

        sums = self.sums if self.sums is not None else torch.zeros(5, dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            for group in groups:
                dist.all_reduce(sums, group=group)
        values = [float(x) for x in sums.cpu()]
        n = values[0]
        if n <= 0:
            return {}
        means = {f"sc/{k}": v / n for k, v in zip(STAT_KEYS[1:], values[1:], strict=True)}
        return {"sc/tokens": n, **means}


#: The figures of the current step, recorded by ``policy_loss``.
SC_STATS = SCStats()
