"""Checks of a finished rehearsal run, from what the run left on disk (no framework imports).

``check_run(out, arm, a, job_status)`` reads, under the run folder ``out``:

- the offline wandb history (``runs/*/wandb/**/offline-run-*/run-*.wandb``: wandb's
  LevelDB-log framing, parsed here since wandb 0.2x dropped its Python reader, and
  wandb's own protobuf ``Record``),
- the probes (``probes/train_data.jsonl``: every trained sample after the reward hook;
  ``probes/unused.jsonl``: every group Miles' unused handler received;
  ``probes/engine.jsonl``: every chat turn the stand-in engine served),
- the debug rollout dumps (``runs/*/dumps/rollout_data/*.pt``) through ``rescue replay
  census``'s loader.

A progress bar on stderr (``rescue.progress``; ``progress=False`` turns it off) counts the
checks as they finish: reading the wandb history and loading the dumps take the time.

Checks (each a line of the report; any failure makes the run fail):

1. ``job``: the Ray job succeeded.
2. ``steps``: every step has the ``rollout/census/*`` group keys and conservation holds:
   groups entered up to a step = groups settled in a bucket up to it + groups buffered.
3. ``weights``: protect: at least one protected sample was trained, each with weight 1/a,
   and every sample's reward after the hook is its weight times its group's GRPO
   advantage (``rescue.advantages.group_advantages`` on the raw rewards); other arms: no
   sample carries a weight.
4. ``unused``: every group the census counts as dropped stale or aborted reached Miles'
   unused handler (drop and protect: at least one dropped stale group).
5. ``outcomes``: each class appeared with its expected reason: solved/resolved,
   submitted_failure/unresolved, budget_failure/turn_cap, budget_failure/context_limit
   among the trained samples, and infra_no_result as groups aborted because their sandbox
   never started (before any model call, so Miles aborts them).
6. ``infra``: no ``infra_no_result`` rollout reached the loss (non-zero loss mask).
7. ``replay``: the dumps load with ``rescue replay census`` and their outcome counts equal
   the logged ``rollout/census/samples/*`` counts step by step.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXPECTED_REASONS = (
    ("solved", "resolved"),
    ("submitted_failure", "unresolved"),
    ("budget_failure", "turn_cap"),
    ("budget_failure", "context_limit"),
)
GROUPS = "rollout/census/groups/"
BUCKETS = (
    "trained_fresh",
    "trained_stale",
    "trained_protected",
    "dropped_stale",
    "aborted",
    "filtered",
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    on_add: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))
        if self.on_add is not None:
            self.on_add()

    def render(self, wall_s: float | None = None) -> str:
        lines = ["rehearsal report"]
        for c in self.checks:
            lines.append(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        for k, v in self.facts.items():
            lines.append(f"  {k}: {v}")
        if wall_s is not None:
            lines.append(f"  wall time: {wall_s:.0f} s")
        first = next((c for c in self.checks if not c.ok), None)
        lines.append(
            "rehearsal: PASSED"
            if self.ok
            else f"rehearsal: FAILED: {first.name}: {first.detail}"
            if first
            else "rehearsal: FAILED: nothing was checked"
        )
        return "\n".join(lines)

    def as_dict(self, wall_s: float | None = None) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "wall_s": wall_s,
            "checks": [c.__dict__ for c in self.checks],
            "facts": self.facts,
        }


def wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: wandb's LevelDB-log framing (32 KiB blocks of
    ``crc32 | length | type`` chunks after a 7-byte ``:W&B`` header)."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a wandb run file (no :W&B header)")
    block, pos, records, partial = 32768, 7, [], b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += block - pos % block if pos % block else 0
            continue
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            records.append(partial + chunk)
            partial = b""
    return records


def wandb_history(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """History rows of offline wandb run folders (``offline-run-*``), file by file."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for run_dir in run_dirs:
        for data in sorted(Path(run_dir).glob("*.wandb")):
            for raw in wandb_records(data):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(raw)
                if record.WhichOneof("record_type") != "history":
                    continue
                row = {}
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    row[key] = json.loads(item.value_json)
                rows.append(row)
    return rows


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(history: list[dict[str, Any]], key: str = "rollout/step") -> dict[int, dict]:
    """History merged per rollout step (Miles logs a step in several rows)."""
    merged: dict[int, dict] = defaultdict(dict)
    for row in history:
        if key in row:
            merged[int(row[key])].update(row)
    return dict(sorted(merged.items()))


#: The checks of the module docstring, in order (the progress bar's total).
CHECKS = ("job", "steps", "weights", "unused", "outcomes", "infra", "replay")


def check_run(
    out: Path,
    *,
    arm: str,
    a: float | None,
    job_status: str,
    steps_checked: int,
    progress: bool = True,
) -> Report:
    """Every check of the module docstring on the run folder ``out``, for rollout steps
    ``0 .. steps_checked-1`` (the run makes one more: Miles never finishes the rollout
    manager's wandb run, so the last step's rollout metrics can be lost at exit)."""
    from rescue.progress import progress_bar

    with progress_bar(len(CHECKS), unit="checks", desc="rehearsal report", enabled=progress) as bar:
        report = Report()
        report.on_add = lambda: bar.update(1)
        _check_all(report, Path(out), arm, a, job_status, steps_checked)
    report.on_add = None
    return report


def _check_all(
    report: Report, out: Path, arm: str, a: float | None, job_status: str, steps_checked: int
) -> None:
    report.add("job", job_status == "SUCCEEDED", f"Ray job {job_status}")
    history = wandb_history(sorted(out.glob("runs/*/wandb/**/offline-run-*")))
    logged = _steps(history)
    steps = {s: logged.get(s, {}) for s in range(steps_checked)}
    report.facts["rollout steps in wandb"] = sorted(logged)
    _check_steps(report, steps)
    report.facts["groups by bucket"] = {
        b: int(sum(row.get(GROUPS + b, 0) for row in steps.values())) for b in BUCKETS
    }
    per_step = [row["samples"] for row in _jsonl(out / "probes" / "train_data.jsonl")]
    train = [s for step in per_step for s in step]
    unused = _jsonl(out / "probes" / "unused.jsonl")
    _check_weights(report, per_step, arm, a)
    _check_unused(report, steps, unused, arm)
    _check_outcomes(report, train, steps, out)
    infra = [s for s in train if s.get("outcome") == "infra_no_result" and s["loss_mask_sum"] > 0]
    report.add(
        "infra",
        not infra,
        "no infra_no_result rollout reached the loss"
        if not infra
        else f"{len(infra)} infra_no_result rollouts reached the loss with reward 0 "
        f"(reasons: {dict(Counter(s.get('outcome_reason') for s in infra))})",
    )
    _check_replay(report, out, steps)
    engine = _jsonl(out / "probes" / "engine.jsonl")
    report.facts["engine turns"] = dict(Counter(r["behaviour"] for r in engine))
    report.facts["engine 400s"] = sum(r.get("status") == 400 for r in engine)


def _check_steps(report: Report, steps: dict[int, dict]) -> None:
    if not steps:
        report.add("steps", False, "no rollout step in the wandb history")
        return
    keys = [f"{GROUPS}entered", f"{GROUPS}buffered", *(GROUPS + b for b in BUCKETS)]
    missing = [s for s, row in steps.items() if any(k not in row for k in keys)]
    if missing == list(steps):
        report.add("steps", False, f"no step of 0..{len(steps) - 1} has the group census keys")
        return
    broken, entered, settled = [], 0.0, 0.0
    for s, row in steps.items():
        if s in missing:
            continue
        entered += row[f"{GROUPS}entered"]
        settled += sum(row[GROUPS + b] for b in BUCKETS)
        if entered != settled + row[f"{GROUPS}buffered"]:
            broken.append(s)
    ok = not missing and not broken
    detail = f"{len(steps)} steps with the group census, conservation held in each"
    if missing:
        detail = f"steps {missing} have no rollout/census/* group keys"
    elif broken:
        detail = f"conservation broken at steps {broken}"
    report.add("steps", ok, detail)


def _check_weights(report: Report, steps: list[list[dict]], arm: str, a: float | None) -> None:
    """Protect: the reward after the hook of every sample equals its weight times the GRPO
    advantage of its group (mean and std over all members, as the hook's default), and
    protected samples carry weight 1/a. Other arms: no sample carries a weight."""
    train = [s for step in steps for s in step]
    weighted = [s for s in train if s.get("rescue_weight") not in (None, 1, 1.0)]
    if arm != "protect":
        report.add(
            "weights",
            not weighted,
            "no sample carries a weight" if not weighted else f"{len(weighted)} weighted samples",
        )
        return
    import numpy as np

    from rescue.advantages import group_advantages

    assert a is not None
    wrong_weight = [s for s in weighted if abs(float(s["rescue_weight"]) - 1 / a) > 1e-9]
    off = 0
    for step in steps:
        if not step:
            continue
        raw = np.array([s["raw_reward"] for s in step], dtype=float)
        ids = np.array([s["group_index"] for s in step])
        w = np.array([float(s.get("rescue_weight") or 1.0) for s in step])
        expected = group_advantages(raw, ids) * w
        got = np.array([s["reward"] for s in step], dtype=float)
        off += int(np.sum(np.abs(expected - got) > 1e-4 * np.maximum(1.0, np.abs(expected))))
    ok = bool(weighted) and not wrong_weight and not off
    if not weighted:
        detail = "no protected sample was trained"
    elif wrong_weight:
        detail = f"{len(wrong_weight)} protected samples with a weight other than 1/a"
    elif off:
        detail = f"{off} samples whose trained reward is not weight x group advantage"
    else:
        detail = (
            f"{len(weighted)} protected samples trained with weight 1/a = {1 / a:g}, "
            "each reward = weight x its group's advantage"
        )
    report.add("weights", ok, detail)


def _check_unused(report: Report, steps: dict[int, dict], unused: list[dict], arm: str) -> None:
    dropped = sum(int(r.get("rollout/census/groups/dropped_stale", 0)) for r in steps.values())
    aborted = sum(int(r.get("rollout/census/groups/aborted", 0)) for r in steps.values())
    received = len(unused)
    need = dropped + aborted
    ok = received >= need and (arm == "never-drop" or dropped > 0)
    report.add(
        "unused",
        ok,
        f"{dropped} dropped stale + {aborted} aborted groups counted; the unused handler "
        f"received {received}"
        + ("" if arm == "never-drop" or dropped else " (no stale group was dropped)"),
    )


def _check_outcomes(report: Report, train: list[dict], steps: dict[int, dict], out: Path) -> None:
    """Scored classes from the trained samples; ``infra_no_result`` from the groups the
    census counted as aborted, whose sandbox failed to start (the stand-in docker's log):
    Miles replaces such a sample by an aborted copy of the prompt, so no reason survives."""
    seen = Counter((s.get("outcome"), s.get("outcome_reason")) for s in train)
    missing = [f"{o}/{r}" for o, r in EXPECTED_REASONS if not seen[(o, r)]]
    aborted = sum(int(r.get(f"{GROUPS}aborted", 0)) for r in steps.values())
    calls = out / "docker" / "calls.log"
    failed_starts = sum(
        1
        for line in (calls.read_text().splitlines() if calls.exists() else [])
        if json.loads(line)[0] == "run" and ".gone" in line
    )
    if not (aborted and failed_starts):
        missing.append("infra_no_result/sandbox_start (an aborted group)")
    report.add(
        "outcomes",
        not missing,
        "every outcome class appeared with its reason"
        if not missing
        else f"never seen: {', '.join(missing)}",
    )
    report.facts["outcomes trained"] = {
        f"{o}/{r}": n for (o, r), n in sorted(seen.items(), key=str)
    }
    report.facts["groups aborted (sandbox never started)"] = aborted


def _check_replay(report: Report, out: Path, steps: dict[int, dict]) -> None:
    dumps = sorted(out.glob("runs/*/dumps/rollout_data/*.pt"))
    if not dumps:
        report.add("replay", False, "no debug rollout dump was written")
        return
    from rescue.outcomes import OUTCOMES
    from rescue.replay.census import census_report
    from rescue.replay.dumps import load_dumps

    try:
        replayed = census_report(load_dumps([str(d) for d in dumps]))
    except Exception as e:
        report.add("replay", False, f"rescue replay census could not load the dumps: {e}")
        return
    mismatched = []
    for row in replayed["steps"]:
        if row["step"] not in steps:
            continue
        logged = steps[row["step"]]
        for o in OUTCOMES:
            key = f"rollout/census/samples/outcome/{o.value}"
            n = row["metrics"].get(f"outcome/{o.value}", 0.0)
            if logged.get(key) != n:
                mismatched.append((row["step"], o.value, n, logged.get(key)))
    report.add(
        "replay",
        not mismatched,
        f"{len(dumps)} dumps load with rescue replay census and agree with the logged census"
        if not mismatched
        else f"dump and log disagree: {mismatched[:3]}",
    )
