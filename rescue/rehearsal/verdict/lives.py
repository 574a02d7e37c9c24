"""A killed and resumed rehearsal read as one run, and the checks of its restart.

A run killed with ``--kill-at`` (``rescue.rehearsal.miles.resume``) leaves its lives in one
folder: the probes of each life one after the other (``lives.json`` says where each later
life's rows begin), Miles' checkpoints and rescue's ledger of the lives (``rescue.restart``)
in the save directory, the wandb folders of both lives under one run id, and the dumps
(a later life writes over the steps it trains again).

``joined(out, ...)`` reads them as the run the judge reads: each step from the last life
that logged it. A life's census, unused and gate rows count flushes of its own process, so
flush ``k`` of a life that started at rollout ``S`` is rollout ``S + k``; its train data's
``k``-th rollout is ``S + k``; its weight version ``v`` is the run's ``S + v`` (Miles counts
versions from 1 in each life, and a life's first version is the checkpoint's weights, the
earlier life's version ``S + 1``). Rows of a step a later life trained again are left out.

The checks (``CHECKS``; each ``(ok, detail)``, "does not apply" for a run not killed):

``resume``     Miles resumed from the checkpoint the kill left (``start_rollout_id`` = its
               step + 1), its first weight update the checkpoint's weights bit for bit (the
               earlier life's at that version), the wandb folders of every life under one run
               id, and the judge reads each step once, the later life's: the steps of an
               uninterrupted run (0, 1, ... each once; with ``--reference``, the reference's);
``accounted``  every group the checkpoint had drawn (Miles' data-source counter) settled once
               in the joined history: trained, dropped or aborted in the earlier life's steps
               (from the probes), or lost at the restart in the later life's first census
               (the ledger's count, the census bucket); no group trained twice; the later
               life trains only groups drawn after the checkpoint;
``coins``      protect: each stale decision is the group's coin (``coin(seed, id) < a``), so a
               group id that meets the gate in both lives meets the same coin (and with
               ``--reference`` the same as there); other arms: does not apply;
``restarted``  no group of the later life reads stale by the restart alone (at its first
               weight version every group has staleness 0, and every staleness counts the
               later life's versions), pace trains nothing past K in any life, and under
               score centering every step of the later life trained a head at every token.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue import restart

#: The rehearsal's file of a killed run's lives (``rescue.rehearsal.miles.resume``).
LIVES = "lives.json"
#: The checks of this module, in the report's order.
CHECKS = ("resume", "accounted", "coins", "restarted")
NOT_KILLED = "does not apply: the run was not killed and resumed"
#: Probe files whose rows count census flushes (``flush``).
BY_FLUSH = ("census", "unused", "gate")
#: The probes the report's checks read (``rescue.rehearsal.miles.probes``).
PROBES = ("census", "unused", "train_data", "trainer_weights", "engine_weights", "reducer")


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Joined:
    """A killed and resumed run: its lives and the probes read as one run."""

    lives: list[restart.Life]
    kills: list[dict[str, Any]]
    #: probe name -> the rows of each life (list per life, in order).
    per_life: dict[str, list[list[dict[str, Any]]]]
    #: probe name -> the joined rows (module docstring).
    probes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The wandb run ids of the run's offline folders, by the life that wrote them.
    wandb_ids: dict[int, set[str]] = field(default_factory=dict)
    seed: int = 0
    staleness: int | None = None
    reference: Path | None = None

    @property
    def starts(self) -> list[int]:
        return [life.start for life in self.lives]

    def later_start(self, life: int) -> float:
        """The first rollout a later life trained again (inf: none)."""
        later = [s for i, s in enumerate(self.starts) if i > life]
        return min(later) if later else float("inf")


def joined(out: Path, *, copies: int = 1, reference: Path | None = None) -> Joined | None:
    """The run in ``out`` read as one (module docstring); None when it was not killed.
    ``copies``: conversions per rollout (2 under the matched control)."""
    out = Path(out)
    if not (out / LIVES).is_file():
        return None
    info = json.loads((out / LIVES).read_text())
    kills = info.get("kills") or []
    ledgers = sorted(out.glob(f"runs/*/checkpoints/{restart.LEDGER}"))
    ledger = restart.read(ledgers[0]) if ledgers else restart.Ledger()
    per_life: dict[str, list[list[dict[str, Any]]]] = {}
    for path in sorted((out / "probes").glob("*.jsonl")):
        rows = _rows(path)
        cuts = [0, *(int(k["probes"].get(path.name, 0)) for k in kills), len(rows)]
        per_life[path.stem] = [rows[a:b] for a, b in itertools.pairwise(cuts)]
    command = (
        json.loads((out / "command.json").read_text()) if (out / "command.json").exists() else {}
    )
    env = (command.get("runtime_env") or {}).get("env_vars") or {}
    flags = command.get("flags") or []
    k = next(
        (flags[i + 1] for i, x in enumerate(flags[:-1]) if x == "--max-weight-staleness"), None
    )
    j = Joined(ledger.lives, kills, per_life, seed=int(env.get("RESCUE_SEED", 0) or 0),
               staleness=int(k) if k is not None else None, reference=reference)  # fmt: skip
    if len(j.lives) != len(kills) + 1:
        return j  # the checks say the lives do not match; nothing to join
    for name, lives in per_life.items():
        j.probes[name] = _join(j, name, lives, copies)
    j.wandb_ids = _wandb_ids(out, kills)
    return j


def _join(j: Joined, name: str, lives: list[list[dict]], copies: int) -> list[dict]:
    out: list[dict] = []
    for i, rows in enumerate(lives):
        start, stop = j.starts[i], j.later_start(i)
        for n, row in enumerate(rows):
            row = {**row, "life": i + 1}
            if name in BY_FLUSH:
                row["flush"] = start + int(row["flush"])
                keep = row["flush"] < stop
            elif name == "train_data":
                keep = start + n // copies < stop
            elif name in ("trainer_weights", "engine_weights"):
                row["version"] = str(start + int(row["version"]))
                keep = int(row["version"]) <= stop  # the later life sends stop + 1 again
            else:
                keep = True
            if keep:
                out.append(row)
    return out


def _wandb_ids(out: Path, kills: list[dict[str, Any]]) -> dict[int, set[str]]:
    """The run ids of the offline folders (``offline-run-<local time>-<id>``), by life: a
    folder started before a kill belongs to the life that kill ended."""
    ids: dict[int, set[str]] = defaultdict(set)
    times = [float(k["time"]) for k in kills]
    for folder in out.glob("runs/*/wandb/**/offline-run-*"):
        _, stamp, run_id = folder.name.rsplit("-", 2)
        started = time.mktime(time.strptime(stamp, "%Y%m%d_%H%M%S"))
        ids[1 + sum(started > t for t in times)].add(run_id)
    return dict(ids)


# ── the checks ───────────────────────────────────────────────────────────────


def resume_check(j: Joined | None, history_note: str | None, steps_read: dict[str, list[int]],
                 steps: int, reference_steps: dict[str, list[int]] | None = None) -> tuple[bool, str]:  # fmt: skip
    """``resume`` (module docstring). ``steps_read``: the steps the judge reads per step key
    (rollout/step, train/step); ``steps``: the trained steps checked (the run makes one more)."""
    if j is None:
        return True, NOT_KILLED
    if (bad := _lives_mismatch(j)) is not None:
        return False, bad
    said = []
    for kill, life in zip(j.kills, j.lives[1:], strict=True):
        n = kill.get("checkpoint")
        if life.checkpoint != n or life.start != (n if n is not None else -1) + 1:
            return False, (
                f"life {life.life} resumed from the checkpoint of step {life.checkpoint} at "
                f"step {life.start}; the kill left the checkpoint of step {n}"
            )
        # the earlier life's own numbering: its versions count from its start
        version = str(life.start + 1 - j.lives[life.life - 2].start)
        before = {r["version"]: r["digest"] for r in j.per_life["trainer_weights"][life.life - 2]}
        after = j.per_life["trainer_weights"][life.life - 1]
        if not after or version not in before:
            return False, f"life {life.life}: no weights at the resume point (version {version})"
        if after[0]["digest"] != before[version]:
            return False, (
                f"life {life.life}'s first weight update is not the checkpoint's weights (life "
                f"{life.life - 1}'s version {version})"
            )
        said.append(f"life {life.life} resumed at step {life.start} (Miles' start_rollout_id) "
                    f"from the checkpoint of step {n}, its first weights bit for bit life "
                    f"{life.life - 1}'s after step {n}")  # fmt: skip
    ids = set().union(*j.wandb_ids.values()) if j.wandb_ids else set()
    if len(ids) != 1 or len(j.wandb_ids) != len(j.lives):
        return False, f"the wandb folders of the lives carry run ids {dict(j.wandb_ids)}"
    rollout = steps_read.get("rollout/step", [])
    if rollout[:steps] != list(range(steps)) or len(set(rollout)) != len(rollout):
        return False, f"the judge reads rollout steps {rollout}, not 0..{steps - 1} each once"
    if not history_note:
        return False, "no step was logged twice: the kill left nothing for the judge to pass over"
    if reference_steps is not None:
        for key, ref in reference_steps.items():
            if steps_read.get(key, [])[: len(ref)] != ref[: len(steps_read.get(key, []))]:
                return False, f"the judge reads {key} {steps_read.get(key)}; the reference {ref}"
    return True, "; ".join(said) + (
        f"; one wandb run id ({next(iter(ids))}) in every life; the judge reads rollout steps "
        f"{rollout[0]}..{rollout[-1]} once each, as an uninterrupted run: {history_note}"
    )


def _lives_mismatch(j: Joined) -> str | None:
    if len(j.lives) != len(j.kills) + 1:
        return (
            f"the ledger of the lives has {len(j.lives)} lives, the rehearsal killed "
            f"{len(j.kills)} times"
        )
    return None


def accounted(j: Joined | None) -> tuple[bool, str]:
    """``accounted`` (module docstring)."""
    if j is None:
        return True, NOT_KILLED
    if (bad := _lives_mismatch(j)) is not None:
        return False, bad
    trained_in: dict[Any, set[int]] = defaultdict(set)
    train = j.probes.get("train_data", [])
    for n, row in enumerate(train):
        for s in row["samples"]:
            trained_in[s["group_index"]].add(row["life"] * 10**6 + n)
    twice = sorted(g for g, where in trained_in.items() if len(where) > 1)
    if twice:
        return False, f"groups trained twice in the joined history: {twice[:5]}"
    said = []
    census = j.probes.get("census", [])
    g = "rollout/census/groups/"
    for life in j.lives[1:]:
        if life.unknown:
            return False, f"life {life.life}: {life.unknown}"
        earlier = [r for r in census if r["life"] < life.life and r["flush"] < life.start]
        first = [r for r in census if r["life"] == life.life]
        if not first:
            return False, f"life {life.life} logged no census"
        lost = first[0]["groups"].get(g + "lost_at_restart", 0)
        later = sum(r["groups"].get(g + "lost_at_restart", 0) for r in first[1:])
        if lost != life.lost or later:
            return False, (
                f"life {life.life}: its first census counts {lost:g} groups lost at the "
                f"restart (later ones {later:g}), the ledger {life.lost}"
            )
        kept_ids = {s["group_index"] for row in train if row["life"] < life.life
                    for s in row["samples"]}  # fmt: skip
        unused = {s["group_index"] for r in j.probes.get("unused", [])
                  if r["life"] < life.life for s in r["samples"]}  # fmt: skip
        filtered = sum(r["groups"].get(g + "filtered", 0) for r in earlier)
        settled = len(kept_ids | unused) + int(filtered)
        if settled + life.lost != life.drawn:
            return False, (
                f"life {life.life}: the checkpoint had drawn {life.drawn} groups; the earlier "
                f"steps settled {settled} (trained {len(kept_ids)}, dropped or aborted "
                f"{len(unused)}, filtered {filtered:g}) and {life.lost} were lost at the "
                "restart"
            )
        again = sorted(
            s["group_index"] for row in train if row["life"] == life.life
            for s in row["samples"] if s["group_index"] < life.drawn
        )  # fmt: skip
        if again:
            return (
                False,
                f"life {life.life} trained groups drawn before its checkpoint: {again[:5]}",
            )
        said.append(
            f"the checkpoint of step {life.checkpoint} had drawn {life.drawn} groups: "
            f"{len(kept_ids)} trained and {len(unused)} dropped or aborted in steps "
            f"0..{life.checkpoint}, {life.lost} lost at the restart ({life.carried} buffered, "
            f"{life.unseen} in flight or settled only after the checkpoint), counted once in "
            f"step {life.start}'s census"
        )
    return True, "; ".join(said) + (
        f"; {len(trained_in)} groups trained, none twice; the later life trains only groups "
        "drawn after the checkpoint"
    )


def coins(j: Joined | None, arm: str, a: float | None,
          reference_gate: list[dict[str, Any]] | None = None) -> tuple[bool, str]:  # fmt: skip
    """``coins`` (module docstring)."""
    if j is None:
        return True, NOT_KILLED
    if arm != "protect":
        return True, "does not apply: only protect draws a coin"
    from rescue.gate import coin

    a = a or 0.5
    rows = [r for life in j.per_life.get("gate", []) for r in life]
    if not rows:
        return False, "the gate decided on no group"
    k = j.staleness or 0
    stale = [r for r in rows if r["staleness"] is not None and r["staleness"] > k]
    wrong = [r for r in stale if (r["bucket"] != "dropped_stale") != (coin(j.seed, r["gid"]) < a)]
    if wrong:
        return False, f"stale decisions that are not the group's coin: {wrong[:3]}"
    weights = {r["weight"] for r in stale if r["bucket"] == "trained_protected"}
    if weights and weights != {1 / a}:
        return False, f"protected groups weighted {sorted(weights)}, not 1/a = {1 / a:g}"
    by_gid: dict[Any, set[int]] = defaultdict(set)
    for i, life in enumerate(j.per_life.get("gate", [])):
        for r in life:
            by_gid[r["gid"]].add(i)
    both = [gid for gid, lives in by_gid.items() if len(lives) > 1]
    stale_both = {r["gid"] for r in stale if r["gid"] in both}
    ref = ""
    if reference_gate is not None:
        theirs = {r["gid"]: r["bucket"] != "dropped_stale" for r in reference_gate
                  if r["staleness"] is not None and r["staleness"] > k}  # fmt: skip
        ours = {r["gid"]: r["bucket"] != "dropped_stale" for r in stale}
        shared = set(theirs) & set(ours)
        differ = sorted(g for g in shared if theirs[g] != ours[g])
        if differ:
            return False, f"groups stale here and in the reference with other coins: {differ[:5]}"
        ref = f"; {len(shared)} stale in the reference run too, the same coin each"
    return True, (
        f"{len(stale)} stale decisions, each the group's coin u(seed={j.seed}, id) < a = {a:g}, "
        f"kept ones weighted 1/a = {1 / a:g}; {len(both)} group ids met the gate in two lives "
        f"({len(stale_both)} stale there: the same coin, by construction){ref}"
    )


def restarted(j: Joined | None, arm: str, offpolicy: str,
              train_rows: list[dict[str, Any]], steps_per_rollout: int) -> tuple[bool, str]:  # fmt: skip
    """``restarted`` (module docstring). ``train_rows``: the optimizer steps the judge reads."""
    if j is None:
        return True, NOT_KILLED
    if (bad := _lives_mismatch(j)) is not None:
        return False, bad
    said = []
    for life, rows in zip(j.lives[1:], j.per_life.get("gate", [])[1:], strict=False):
        if not rows:
            return False, f"life {life.life}: the gate decided on no group"
        first = [r for r in rows if r["current"] == 1]
        odd = [r for r in rows if r["staleness"] is not None
               and not 0 <= r["staleness"] < max(int(r["current"] or 1), 1)]  # fmt: skip
        stale_first = [r for r in first if r["staleness"]]
        if stale_first or odd:
            return False, (
                f"life {life.life}: groups stale by the restart alone: {(stale_first or odd)[:3]}"
            )
        worst = max((r["staleness"] or 0 for r in rows), default=0)
        said.append(f"life {life.life}: {len(first)} groups gated at its first version, all "
                    f"fresh; staleness counts its own versions (at most {worst})")  # fmt: skip
    if arm == "pace":
        past = [r["flush"] for r in j.probes.get("census", []) if r["life"] > 1
                and any(r["groups"].get(f"rollout/census/groups/{b}", 0)
                        for b in ("trained_stale", "trained_protected", "dropped_stale"))]  # fmt: skip
        if past:
            return False, f"pace: the later life had groups past K at rollouts {past}"
        said.append("pace: the later life's schedule kept every group within K, as the first")
    if offpolicy == "tis-sc":
        start = j.lives[-1].start * steps_per_rollout
        later = [r for r in train_rows if int(r.get("train/step", -1)) >= start]
        short = [int(r["train/step"]) for r in later
                 if r.get("train/rescue/sc/tokens") != r.get("train/rescue/adv_tokens")]  # fmt: skip
        if not later or short:
            return (
                False,
                f"score centering: the later life's steps {short or 'none'} without a head at every token",
            )
        said.append(f"score centering: each of the later life's {len(later)} optimizer steps "
                    "trained a head at every token")  # fmt: skip
    return True, "; ".join(said)


def trained_counts(j: Joined) -> Counter[int]:
    """Groups trained per life (for the report's facts)."""
    return Counter(row["life"] for row in j.probes.get("train_data", []) for _ in row["samples"])


def steps_read(history: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The steps the judge reads from a history read each step once: the census's rollout
    steps (one census row a step) and the optimizer steps (one ``train/rescue`` row each)."""
    return {
        "rollout/step": sorted(int(r["rollout/step"]) for r in history
                               if "rollout/step" in r and "rollout/census/groups/entered" in r),
        "train/step": sorted(int(r["train/step"]) for r in history
                             if "train/step" in r and "train/rescue/update_norm" in r),
    }  # fmt: skip


@dataclass
class Reference:
    """The same arm's uninterrupted rehearsal (``--reference``): its history read each step
    once, and its gate's decisions."""

    history: list[dict[str, Any]]
    gate: list[dict[str, Any]]


def gate_rows(out: Path) -> list[dict[str, Any]]:
    """The gate probe's rows of a run folder."""
    return _rows(Path(out) / "probes" / "gate.jsonl")


def checks_of(f: Any, reference: Reference | None = None) -> dict[str, tuple[bool, str]]:
    """Every check of this module on the run read by the report (``RunFiles``), compared
    with ``reference`` when given."""
    j = f.joined
    ref_steps = steps_read(reference.history) if reference is not None else None
    return {
        "resume": resume_check(
            j, f.history_note, steps_read(f.history), f.steps_checked, ref_steps
        ),
        "accounted": accounted(j),
        "coins": coins(j, f.arm, f.a, reference.gate if reference is not None else None),
        "restarted": restarted(j, f.arm, f.offpolicy, f.train_rows, f.steps_per_rollout),
    }
