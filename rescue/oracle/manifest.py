"""The oracle directory: its manifest and where each file of a replay lives.

Layout of an oracle directory ``OUT`` (written by ``rescue oracle build``)::

    OUT/oracle.json                          the manifest (``Manifest``)
    OUT/rollout_data/{rollout_id}.pt         one replay input per (step, arm), Miles' dump format
    OUT/gradients/{rollout_id}/{shard}.pt    a captured gradient: {parameter name: tensor}
    OUT/stats/{rollout_id}.json              streamed: its squared norm and inner products
                                             with the earlier arms of its step
    OUT/compare.json, OUT/compare.md         ``rescue oracle compare``

Replay rollout ids run 0, 1, 2, ... over the entries in order; within a step the entries
are in the manifest's arm order (``all`` first), so a streamed capture can keep the earlier
arms of the step and take inner products as each new one arrives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from rescue.errors import InputError

#: Format tag of the manifest.
FORMAT = "rescue-oracle/1"
#: File names inside an oracle directory.
MANIFEST = "oracle.json"
ROLLOUT_DATA = "rollout_data"
GRADIENTS = "gradients"
STATS = "stats"
#: The manifest's replay path template (relative to the directory), Miles' ``{rollout_id}``.
ROLLOUT_TEMPLATE = ROLLOUT_DATA + "/{rollout_id}.pt"


@dataclass
class Entry:
    """One replay input: an arm's selection of one dumped step."""

    rollout_id: int  # replay rollout id (Miles' --load-debug-rollout-data {rollout_id})
    step: int  # the dumped step (the recording run's rollout id)
    arm: str  # all | drop | stale | protect-a<A>
    source: str  # the dump file it was built from
    rollouts: int  # rollouts in the batch (Miles' num_rollouts: masked ones count)
    groups: int
    stale_groups: int
    trained_groups: int  # groups whose samples are not all masked by the arm
    trained_rollouts: int


@dataclass
class Manifest:
    """What ``build`` wrote: the arms in order and one entry per (step, arm)."""

    arms: list[str]
    entries: list[Entry] = field(default_factory=list)
    format: str = FORMAT
    rollout_data: str = ROLLOUT_TEMPLATE

    def steps(self) -> list[int]:
        """The dumped steps in order."""
        return list(dict.fromkeys(e.step for e in self.entries))

    def by_rollout_id(self, rollout_id: int) -> Entry:
        """The entry replayed as ``rollout_id``; a clear error for an id not built."""
        for e in self.entries:
            if e.rollout_id == rollout_id:
                return e
        raise InputError(
            f"replay rollout id {rollout_id} is not in the oracle manifest (ids 0.."
            f"{len(self.entries) - 1}): replay with --start-rollout-id 0 --num-rollout "
            f"{len(self.entries)}"
        )

    def of_step(self, step: int) -> list[Entry]:
        """The entries of one dumped step, in arm order."""
        return [e for e in self.entries if e.step == step]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def write(self, directory: str) -> str:
        """Write ``oracle.json`` into ``directory``; its path."""
        path = os.path.join(directory, MANIFEST)
        data = {"format": self.format, "arms": self.arms, "rollout_data": self.rollout_data}
        data["entries"] = [asdict(e) for e in self.entries]
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: str) -> Manifest:
        """The manifest of an oracle directory; a clear error when there is none."""
        path = os.path.join(directory, MANIFEST)
        if not os.path.isfile(path):
            raise InputError(
                f"{directory}: no {MANIFEST}; build the oracle inputs first "
                "(rescue oracle build DUMP_DIR --out DIR)"
            )
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
        if data.get("format") != FORMAT:
            raise InputError(f"{path}: format {data.get('format')!r}; expected {FORMAT!r}")
        return cls(
            arms=list(data["arms"]),
            entries=[Entry(**e) for e in data["entries"]],
            rollout_data=data.get("rollout_data", ROLLOUT_TEMPLATE),
        )


def gradient_dir(directory: str, rollout_id: int) -> str:
    """Where the captured gradient shards of one replay rollout live."""
    return os.path.join(directory, GRADIENTS, str(rollout_id))


def stats_path(directory: str, rollout_id: int) -> str:
    """Where the streamed inner products of one replay rollout live."""
    return os.path.join(directory, STATS, f"{rollout_id}.json")
