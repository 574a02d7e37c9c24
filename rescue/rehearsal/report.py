"""Checks of a finished rehearsal run, from what the run left on disk (no framework imports).

``check_run(out, arm, a, job_status)`` reads, under the run folder ``out``:

- the offline wandb history (``runs/*/wandb/offline-run-*/run-*.wandb``, read with
  wandb's own ``DataStore`` and protobuf records),
- the probes (``probes/train_data.jsonl``: every trained sample after the reward hook;
  ``probes/unused.jsonl``: every group Miles' unused handler received;
  ``probes/engine.jsonl``: every chat turn the stand-in engine served),
- the debug rollout dumps (``runs/*/dumps/rollout_data/*.pt``) through ``rescue replay
  census``'s loader.

Checks (each a line of the report; any failure makes the run fail):

1. ``job``: the Ray job succeeded.
2. ``steps``: every step has the ``rollout/census/*`` group keys and conservation holds:
   groups entered up to a step = groups settled in a bucket up to it + groups buffered.
3. ``weights``: protect: protected samples trained with weight 1/a (their reward after the
   hook is 1/a times the unweighted group advantage), and at least one was; other arms:
   no sample carries a weight.
4. ``unused``: every group the census counts as dropped stale or aborted reached Miles'
   unused handler (drop and protect: at least one dropped stale group).
5. ``outcomes``: each class appeared with its expected reason: solved/resolved,
   submitted_failure/unresolved, budget_failure/turn_cap, budget_failure/context_limit,
   infra_no_result (a sandbox fault before any model call).
6. ``infra``: no ``infra_no_result`` rollout reached the loss (non-zero loss mask).
7. ``replay``: the dumps load with ``rescue replay census`` and their outcome counts equal
   the logged ``rollout/census/samples/*`` counts step by step.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
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

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

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


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """History rows of an offline wandb run folder (``offline-run-*``), in order."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (data,) = sorted(Path(run_dir).glob("*.wandb"))
    store = datastore.DataStore()
    store.open_for_scan(str(data))
    rows = []
    while (raw := store.scan_data()) is not None:
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


def check_run(out: Path, *, arm: str, a: float | None, job_status: str) -> Report:
    """Every check of the module docstring on the run folder ``out``."""
    out = Path(out)
    report = Report()
    report.add("job", job_status == "SUCCEEDED", f"Ray job {job_status}")
    runs = sorted(out.glob("runs/*/wandb/offline-run-*")) or sorted(
        out.glob("runs/*/wandb/wandb/offline-run-*")
    )
    history = wandb_history(runs[-1]) if runs else []
    steps = _steps(history)
    report.facts["steps logged"] = len(steps)
    _check_steps(report, steps)
    train = [s for row in _jsonl(out / "probes" / "train_data.jsonl") for s in row["samples"]]
    unused = _jsonl(out / "probes" / "unused.jsonl")
    _check_weights(report, train, arm, a)
    _check_unused(report, steps, unused, arm)
    _check_outcomes(report, train, unused)
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
    return report


def _check_steps(report: Report, steps: dict[int, dict]) -> None:
    if not steps:
        report.add("steps", False, "no rollout step in the wandb history")
        return
    keys = [f"{GROUPS}entered", f"{GROUPS}buffered", *(GROUPS + b for b in BUCKETS)]
    missing = [s for s, row in steps.items() if any(k not in row for k in keys)]
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


def _check_weights(report: Report, train: list[dict], arm: str, a: float | None) -> None:
    weighted = [s for s in train if s.get("rescue_weight") not in (None, 1, 1.0)]
    if arm != "protect":
        report.add(
            "weights",
            not weighted,
            "no sample carries a weight" if not weighted else f"{len(weighted)} weighted samples",
        )
        return
    assert a is not None
    wrong = [s for s in weighted if abs(float(s["rescue_weight"]) - 1 / a) > 1e-9]
    report.add(
        "weights",
        bool(weighted) and not wrong,
        f"{len(weighted)} protected samples trained with weight 1/a = {1 / a:g}"
        if weighted and not wrong
        else "no protected sample was trained"
        if not weighted
        else f"{len(wrong)} protected samples with a weight other than 1/a",
    )


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


def _check_outcomes(report: Report, train: list[dict], unused: list[dict]) -> None:
    seen = Counter((s.get("outcome"), s.get("outcome_reason")) for s in train)
    for row in unused:
        for s in row["samples"]:
            seen[(s.get("outcome"), s.get("outcome_reason"))] += 1
    missing = [f"{o}/{r}" for o, r in EXPECTED_REASONS if not seen[(o, r)]]
    infra = sum(n for (o, _), n in seen.items() if o == "infra_no_result")
    aborted = sum(
        1 for row in unused for s in row["samples"] if "ABORTED" in str(s.get("status"))
    )
    if not infra and not aborted:
        missing.append("infra_no_result")
    report.add(
        "outcomes",
        not missing,
        "every outcome class appeared with its reason"
        if not missing
        else f"never seen: {', '.join(missing)}",
    )
    report.facts["outcomes"] = {f"{o}/{r}": n for (o, r), n in sorted(seen.items(), key=str)}


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
        logged = steps.get(row["step"], {})
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
