"""A run's lives: what a restart from a checkpoint loses, counted once.

A run killed on the cluster (a node, an engine or the trainer dies) is launched again with
``RESUME=1``, and Miles resumes it from its last checkpoint, of step N. What comes back:
the trainer's weights and optimizer, and the data source's counters (``G`` prompt groups
drawn so far: group ids ``0 .. G-1``). What does not: the buffer, the groups in flight,
and the steps trained after N, which Miles trains again (its ``start_rollout_id`` is
N + 1), drawing the groups after the G-th again, with the same ids and prompts.

Invariant: every group id the run drew is settled once in the *joined* history, where each
step's census comes from the last life that logged it:

- an id < G that a census up to step N settled for good is in the earlier life's steps;
- every other id < G never comes back: it is lost at the restart (the census bucket
  ``lost_at_restart``, an infrastructure bucket), in the first census of the later life:
  ``carried`` of them were open at step N's census (buffered), the ``unseen`` rest had not
  entered then (in flight at the checkpoint, waiting to be generated again, or settled
  only in a step after N);
- an id >= G is in the later life's steps.

The ledger (``LEDGER``, in the run's save directory beside Miles' checkpoints; one JSON
object a line, each appended and synced to disk before the step goes on, so a SIGKILL
leaves at most a torn last line, which ``read`` passes over):

- a life, written when it starts: ``{"life": L, "start": S, "time": T, "checkpoint": N,
  "drawn": G, "carried": b, "unseen": i}`` (``checkpoint`` and ``drawn`` null for a life
  that starts from nothing);
- a census, written at each census flush: ``{"life": L, "rollout": r, "open": O, "final":
  F}``: after the census of rollout r, O entries open (buffered), and F groups settled for
  good in the joined history so far: trained, filtered, lost, lost at a restart, and
  dropped stale or aborted unless a retry handler sends them back to be generated again.

``joined(ledger)`` is the census rows of the joined history (each life's rows less those
at or after a later life's start); ``restart(ledger, checkpoint, drawn)`` is what a life
that starts after ``checkpoint`` loses. ``LifeLog`` is one life's writer, which the Miles
buffer (``rescue.miles.buffer``) keeps. Framework-free: the Miles side reads its
checkpoint's step and counters (``rescue.miles.restart``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The ledger's file name in the run's save directory.
LEDGER = "rescue-ledger.jsonl"
#: The census key that says which life logged a step (1, 2, ...; absent: 1).
LIFE_KEY = "rollout/census/life"
#: Census buckets settled for good whatever the unused handler does.
FINAL_BUCKETS = ("trained_fresh", "trained_stale", "trained_protected", "filtered", "lost",
                 "lost_at_restart")  # fmt: skip
#: Buckets whose groups a retry handler sends back to be generated again.
RECYCLED_BUCKETS = ("dropped_stale", "aborted")


@dataclass(frozen=True)
class Life:
    """One life of a run: where it started and what its restart lost (module docstring)."""

    life: int
    start: int
    time: float = 0.0
    checkpoint: int | None = None
    drawn: int | None = None
    carried: int = 0
    unseen: int = 0
    #: Why the counts are not known (``""`` when they are).
    unknown: str = ""

    @property
    def lost(self) -> int:
        """Groups lost at this life's restart."""
        return self.carried + self.unseen

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None


@dataclass(frozen=True)
class Flush:
    """One census flush of a life (module docstring)."""

    life: int
    rollout: int
    open: int
    final: int


@dataclass
class Ledger:
    """What a ledger file holds: its lives and census rows, in the order written."""

    lives: list[Life] = field(default_factory=list)
    flushes: list[Flush] = field(default_factory=list)


def read(path: str | os.PathLike[str]) -> Ledger:
    """The ledger at ``path`` (empty when there is none); a line that does not parse (a
    write a kill cut short) is passed over."""
    ledger = Ledger()
    p = Path(path)
    if not p.is_file():
        return ledger
    for line in p.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or "life" not in row:
            continue
        if "start" in row:
            ledger.lives.append(Life(**{k: row[k] for k in Life.__dataclass_fields__ if k in row}))
        elif "rollout" in row:
            ledger.flushes.append(Flush(int(row["life"]), int(row["rollout"]), int(row["open"]),
                                        int(row["final"])))  # fmt: skip
    return ledger


def joined(ledger: Ledger) -> list[Flush]:
    """The census rows of the joined history: life by life, a life's start dropping the
    earlier rows at or after it (the steps it trains again)."""
    rows: list[Flush] = []
    starts = {life.life: life.start for life in ledger.lives}
    for life in sorted(starts):
        rows = [r for r in rows if r.rollout < starts[life]]
        rows += sorted((r for r in ledger.flushes if r.life == life), key=lambda r: r.rollout)
    return rows


def restart(
    ledger: Ledger,
    checkpoint: int | None,
    drawn: int | None,
    *,
    clock: Callable[[], float] = time.time,
) -> tuple[Life, int]:
    """The next life of the run in ``ledger`` and the groups settled for good before it (its
    census rows count on from there). ``checkpoint``: the step Miles resumes from (None: it
    starts from nothing, step 0); ``drawn``: the groups drawn by that checkpoint (Miles' data
    source counter; None when its state is missing)."""
    number = max((life.life for life in ledger.lives), default=0) + 1
    if checkpoint is None:
        return Life(number, 0, clock()), 0
    start = checkpoint + 1
    row = next((r for r in reversed(joined(ledger)) if r.rollout == checkpoint), None)
    if row is None:
        why = (
            f"the ledger has no census of step {checkpoint} (a run started before rescue kept "
            "one, or its file was removed)"
        )
        return Life(number, start, clock(), checkpoint, drawn, unknown=why), 0
    if drawn is None:
        why = f"Miles' checkpoint of step {checkpoint} holds no data-source counters"
        return Life(number, start, clock(), checkpoint, None, row.open, unknown=why), row.final
    unseen = drawn - row.final - row.open
    if unseen < 0:
        why = (
            f"the checkpoint of step {checkpoint} counts {drawn} groups drawn, fewer than the "
            f"{row.final} settled and {row.open} open in the ledger"
        )
        return Life(number, start, clock(), checkpoint, drawn, row.open, unknown=why), row.final
    return Life(number, start, clock(), checkpoint, drawn, row.open, unseen), row.final


def final_count(totals: Mapping[str, int], *, retry: bool) -> int:
    """Groups a census settled for good (module docstring), from its ``totals()``."""
    buckets = FINAL_BUCKETS if retry else (*FINAL_BUCKETS, *RECYCLED_BUCKETS)
    return sum(int(totals.get(b, 0)) for b in buckets)


def append(path: Path, row: Mapping[str, Any]) -> None:
    """Append one line to the ledger and sync it to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(row, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


class LifeLog:
    """One life's ledger: reads the earlier lives when it starts, writes its own.

    Args:
        folder: the run's save directory (None: the run keeps no ledger and cannot be
            counted across a restart; said once in the log).
        checkpoint, drawn: what Miles resumed from (``restart``).
        retry: the run's unused handler sends dropped and aborted groups back.
        clock: seconds since the epoch, for the life's ``time``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None,
        *,
        checkpoint: int | None,
        drawn: int | None,
        retry: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(folder) / LEDGER if folder else None
        self.retry = retry
        earlier = read(self.path) if self.path else Ledger()
        self.life, self._base = restart(earlier, checkpoint, drawn, clock=clock)
        self._flushes = 0
        if self.life.unknown:
            logger.warning("restart: groups lost unknown: %s", self.life.unknown)
        if self.path is None:
            logger.warning("no save directory (--save): the run keeps no ledger of its lives")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append(self.path, asdict(self.life))

    @property
    def rollout(self) -> int:
        """The rollout the next census flush belongs to."""
        return self.life.start + self._flushes

    def flush(self, totals: Mapping[str, int], buffered: int) -> None:
        """Write the census of the rollout being flushed (``totals``: the life's census
        ``totals()``), then count it."""
        if self.path is not None:
            final = self._base + final_count(totals, retry=self.retry)
            append(self.path, {"life": self.life.life, "rollout": self.rollout,
                               "open": int(buffered), "final": final})  # fmt: skip
        self._flushes += 1

    def describe(self) -> str:
        """One line: which life this is and what its restart lost."""
        return describe(self.life)


def describe(life: Life) -> str:
    """One line for a life: fresh, or resumed from which step and what it lost."""
    if not life.resumed:
        return f"life {life.life}: started at step {life.start}"
    lost = (
        f"groups lost at the restart unknown ({life.unknown})"
        if life.unknown
        else f"{life.lost} groups lost at the restart ({life.carried} buffered, "
        f"{life.unseen} in flight or not settled by then)"
    )
    return (
        f"life {life.life}: resumed from the checkpoint of step {life.checkpoint} at step "
        f"{life.start}; {lost}"
    )


def lives_of(ledger: Ledger) -> Iterable[str]:
    """One line per life of a ledger (``describe``)."""
    return (describe(life) for life in ledger.lives)
