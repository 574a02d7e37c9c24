"""The stand-in engine's end of Miles' weight update by broadcast (``--rollout-external``).

Miles' trainer (``update_weight_from_distributed/broadcast.py``) asks every engine to join a
process group of its own (``/init_weights_update_group``: address, port, the engine's first
rank, world size, group name, backend), joins it as rank 0, then per bucket posts the names,
dtypes and shapes (``/update_weights_from_distributed``) and broadcasts each tensor in that
order. ``Receiver`` does what SGLang's ``init_custom_process_group`` and its receiving loop do,
on gloo: the group is built as the trainer's side builds it (torch's
``_new_process_group_helper`` over a ``PrefixStore`` named after the group), and each tensor
is received by a broadcast from rank 0 of that group.

What SGLang refuses is refused here with its reason: a backend other than gloo (no NCCL
without a GPU), a second group of the same name, a bucket for a group never joined, an
unknown dtype.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any


class WeightUpdateError(RuntimeError):
    """A refused weight-update request; its text is the reply's ``message``."""


class Receiver:
    """Process groups joined by name, and the tensors received through them."""

    def __init__(self, timeout_s: float = 600) -> None:
        self.groups: dict[str, Any] = {}
        self.timeout = timedelta(seconds=timeout_s)
        self._lock = threading.Lock()

    def join(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
        group_name: str, backend: str,
    ) -> None:  # fmt: skip
        """Join ``group_name`` as rank ``rank_offset`` (blocks until every rank joined)."""
        from torch.distributed.distributed_c10d import (
            Backend,
            PrefixStore,
            _new_process_group_helper,
            _world,
            rendezvous,
        )

        if backend != "gloo":
            raise WeightUpdateError(
                f"backend {backend!r}: this engine runs on a CPU, where only gloo exists"
            )
        if group_name in self.groups:
            raise WeightUpdateError(f"group {group_name!r} already exists")
        url = f"tcp://{master_address}:{master_port}"
        store, rank, size = next(rendezvous(url, rank_offset, world_size, timeout=self.timeout))
        store.set_timeout(self.timeout)
        # as the trainer's side builds it (Miles' distributed_utils.init_process_group, a copy
        # of torch's): one gloo backend per device type, each with its own store prefix
        group, _ = _new_process_group_helper(
            size, rank, [], Backend("gloo"), PrefixStore(group_name, store),
            group_name=group_name, backend_options=None, timeout=self.timeout,
        )  # fmt: skip
        _world.pg_group_ranks[group] = {i: i for i in range(size)}
        self.groups[group_name] = group

    def leave(self, group_name: str) -> None:
        import torch

        group = self.groups.pop(group_name, None)
        if group is None:
            raise WeightUpdateError(f"group {group_name!r} does not exist")
        torch.distributed.destroy_process_group(group)

    def receive(
        self, group_name: str, names: list[str], dtypes: list[str], shapes: list[list[int]]
    ) -> list[tuple[str, Any]]:
        """The tensors of one bucket, received in order from rank 0 of ``group_name``."""
        import torch

        group = self.groups.get(group_name)
        if group is None:
            raise WeightUpdateError(f"group {group_name!r} was never joined")
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightUpdateError("names, dtypes and shapes differ in length")
        out = []
        with self._lock:
            for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
                kind = getattr(torch, str(dtype).replace("torch.", ""), None)
                if not isinstance(kind, torch.dtype):
                    raise WeightUpdateError(f"weight {name!r}: unknown dtype {dtype!r}")
                tensor = torch.empty([int(x) for x in shape], dtype=kind)
                torch.distributed.broadcast(tensor, 0, group=group)
                out.append((name, tensor))
        return out
