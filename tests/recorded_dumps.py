"""Synthetic dumps of a never-drop run: groups tagged by rescue's own gate.

``recorded_step`` draws one step (``rescue.replay.synthetic.synthetic_step``), makes the
groups in ``stale`` older than ``--max-weight-staleness`` (their weight versions lag the
current one by ``K + 1``) and passes every group through ``rescue.gating.gate_group`` with
a never-drop gate, as rescue's buffer does in a recording run.
"""

from __future__ import annotations

from rescue.gate import Gate
from rescue.gating import gate_group
from rescue.replay.synthetic import synthetic_step

K = 1  # --max-weight-staleness of the recording run
SEED = 7  # RESCUE_SEED of the recording run


def recorded_step(rollout_id: int, *, stale: set[int], seed: int = 0, **kwargs) -> dict:
    """One recorded step's payload; group ``g`` is stale iff ``g in stale``."""
    payload = synthetic_step(rollout_id=rollout_id, seed=seed, **kwargs)
    current = rollout_id + K + 1
    groups: dict[int, list[dict]] = {}
    for s in payload["samples"]:
        g = s["group_index"]
        lag = K + 1 if g in stale else 0
        s["weight_versions"] = [str(current - lag)] * max(len(s["weight_versions"]), 1)
        groups.setdefault(g, []).append(s)
    gate = Gate(arm="never-drop", seed=SEED, max_staleness=K)
    for group in groups.values():
        assert gate_group(gate, group, current).kept
    return payload
