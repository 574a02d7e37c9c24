"""The ``probe`` rows' functions: what the report reads, recorded where Miles computes it.

Each appends JSON lines under ``$RESCUE_REHEARSAL_DIR/probes/`` and changes nothing Miles
does:

- ``census.jsonl``: the group census of every step as rescue's buffer hands it to Miles
  (``get_metrics``), numbered by flush, whether or not Miles' wandb run keeps it;
- ``unused.jsonl``: every group Miles' unused handler receives, with the number of census
  flushes before it (so each lands in exactly one step's census);
- ``train_data.jsonl``: every trained sample after the reward hook, with the advantages
  Miles' train data holds for it on the tokens it trains;
- ``trainer_weights.jsonl``: the digest of what the trainer sends at each weight update,
  compared with what the engine received;
- ``reducer.jsonl``: what the Dr. GRPO reducer returns for all-ones, beside the tokens it
  masks in and its divisor (so the report sees the constant divisor at work);
- ``gate.jsonl``: every group rescue's buffer passes through the gate: its id, staleness,
  the engine's version then, the bucket and the weight, after how many census flushes
  (the report compares the coins of a group id across the lives of a resumed run).
"""

from __future__ import annotations

import json
import os
import threading
import types
from pathlib import Path
from typing import Any

_WRITE = threading.Lock()
#: Census flushes (``get_metrics`` calls) of rescue's buffer in this process so far.
_flushes = 0


def record(name: str, row: dict[str, Any]) -> None:
    """Append ``row`` to ``probes/<name>.jsonl`` of the run (nothing outside a rehearsal)."""
    folder = os.environ.get("RESCUE_REHEARSAL_DIR")
    if not folder:
        return
    with _WRITE, open(Path(folder) / "probes" / f"{name}.jsonl", "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def sample_row(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None) or {}
    return {
        "index": getattr(sample, "index", None),
        "group_index": getattr(sample, "group_index", None),
        "rollout_id": getattr(sample, "rollout_id", None),
        "status": str(getattr(sample, "status", "")),
        "outcome": metadata.get("outcome"),
        "outcome_reason": metadata.get("outcome_reason"),
        "rescue_weight": metadata.get("rescue_weight"),
        "weight_versions": list(getattr(sample, "weight_versions", None) or []),
    }


def unused_handler(module: types.ModuleType) -> None:
    """``FullyAsyncRolloutFn``: every group its unused handler receives."""
    cls = module.FullyAsyncRolloutFn
    original = cls.__init__

    def __init__(self: Any, input: Any) -> None:
        original(self, input)
        handle = self._handle_unused

        def recorded(prompt_group: list[Any]) -> None:
            rows = [sample_row(s) for s in prompt_group]
            record("unused", {"flush": _flushes, "samples": rows})
            handle(prompt_group)

        self._handle_unused = recorded

    cls.__init__ = __init__


def census(module: types.ModuleType) -> None:
    """``rescue.miles.buffer.RescueDataBuffer.get_metrics``: the step's group census."""
    cls = module.RescueDataBuffer
    original = cls.get_metrics

    def get_metrics(self: Any) -> dict[str, float]:
        global _flushes
        metrics = original(self)
        groups = {k: v for k, v in metrics.items() if k.startswith("rollout/census/groups/")}
        record("census", {"flush": _flushes, "groups": groups})
        _flushes += 1
        return metrics

    cls.get_metrics = get_metrics


def gate(module: types.ModuleType) -> None:
    """``rescue.miles.buffer``'s ``gate_group``: every group the gate decides on."""
    original = module.gate_group

    def gate_group(gate: Any, group: Any, current_version: Any) -> Any:
        gated = original(gate, group, current_version)
        record("gate", {"flush": _flushes, "gid": gated.gid, "staleness": gated.staleness,
                        "current": current_version, "bucket": gated.bucket.value,
                        "weight": gated.weight})  # fmt: skip
        return gated

    module.gate_group = gate_group


def _channel_sum(data: dict, i: int, mask: list) -> float:
    """The per-token channel of sample ``i`` summed over the tokens its loss mask trains."""
    channel = (data.get("opd_reverse_kl") or [None] * (i + 1))[i]
    if channel is None:
        return 0.0
    values = [float(x) for x in channel]
    return float(sum(v for v, m in zip(values[-len(mask) :], mask, strict=False) if m))


def train_data(module: types.ModuleType) -> None:
    """Miles' conversion to train data: each trained sample's reward after the hook, and the
    sum of the advantages its trained tokens carry (the reward on each, plus the turn
    channel where the run has one). A call that hands over to a custom converter is not
    recorded: the converter's own calls are (the matched control's two copies)."""
    original = module.convert_samples_to_train_data

    def convert(
        args: Any,
        samples: Any,
        metadata: Any,
        custom_convert_samples_to_train_data_func: Any,
        custom_reward_post_process_func: Any,
    ) -> Any:
        custom = custom_convert_samples_to_train_data_func
        data = original(args, samples, metadata, custom, custom_reward_post_process_func)
        if custom is None:
            _write_train_data(samples, data)
        return data

    module.convert_samples_to_train_data = convert


#: Episode fields of a text game's samples the report counts (``rescue.envs.episode``).
EPISODE_KEYS = ("exit_status", "turns", "step", "invalid_actions", "inadmissible_actions",
                "difficulty")  # fmt: skip


def _write_train_data(samples: Any, data: dict) -> None:
    from rescue.outcomes import classify

    rows = [sample_row(s) for s in samples]
    for i, (row, sample) in enumerate(zip(rows, samples, strict=True)):
        mask = [int(m) for m in data["loss_masks"][i]]
        row["reward"] = float(data["rewards"][i])
        row["raw_reward"] = float(data["raw_reward"][i])
        row["loss_mask_sum"] = sum(mask)
        row["channel_sum"] = _channel_sum(data, i, mask)
        metadata = getattr(sample, "metadata", None) or {}
        if row["outcome"] is None:  # rescue's one classifier, as the census classifies it
            c = classify(status=sample.status, reward=row["raw_reward"], metadata=metadata)
            row["outcome"], row["outcome_reason"] = c.outcome.value, c.reason
        row.update({k: metadata[k] for k in EPISODE_KEYS if k in metadata})
    record("train_data", {"samples": rows})


def reducer(module: types.ModuleType) -> None:
    """``rescue.miles.drgrpo.pg_loss_reducer``: the reducer Miles builds, applied once per
    micro-batch to all-ones, beside the mask's token count and the divisor."""
    original = module.pg_loss_reducer

    def pg_loss_reducer(
        total_lengths: Any, response_lengths: Any, loss_masks: Any, *a: Any, **k: Any
    ):
        import torch

        reduce = original(total_lengths, response_lengths, loss_masks, *a, **k)

        def reduced(x: Any) -> Any:
            ones = float(reduce(torch.ones_like(x)))
            tokens = float(sum(float(m.sum()) for m in loss_masks))
            record(
                "reducer",
                {"ones": ones, "tokens": tokens, "divisor": module.divisor(module.megatron_args())},
            )
            return reduce(x)

        return reduced

    module.pg_loss_reducer = pg_loss_reducer


def trainer_weights(module: types.ModuleType) -> None:
    """``UpdateWeightFromDistributed``: the digest of every tensor one update broadcasts."""
    from rescue.rehearsal.tiny.policy import digest

    cls = module.UpdateWeightFromDistributed
    send = cls._update_weight_implementation
    update = cls.update_weights

    def _update_weight_implementation(self: Any, converted: list, pbar: Any = None) -> None:
        sent = getattr(self, "_rescue_sent", None)
        if sent is None:
            sent = self._rescue_sent = {}
        sent.update((name, tensor.detach().clone()) for name, tensor in converted)
        return send(self, converted, pbar)

    def update_weights(self: Any) -> None:
        self._rescue_sent = {}
        update(self)
        if self._rescue_sent:
            record(
                "trainer_weights",
                {
                    "version": str(self.weight_version),
                    "digest": digest(self._rescue_sent.items()),
                    "tensors": len(self._rescue_sent),
                },
            )
        self._rescue_sent = {}

    cls._update_weight_implementation = _update_weight_implementation
    cls.update_weights = update_weights
