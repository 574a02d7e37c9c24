"""The pilot's task subset: per-task success rate, Wilson interval, and the window rule.

Specification
-------------
Per task, over its finished trials ``t < n`` (outcomes from ``rescue.outcomes``):

- ``success = solved / (done - infra)``: the scored trials only, so a sandbox or grader
  fault neither counts for nor against the task;
- the Wilson score interval of ``success`` (``z`` default 1.96, 95 %);
- ``infra_fraction = infra_attempts / attempts``: over every attempt of its trials, a
  retried trial's earlier attempts included (``attempts``, from ``pilot.attempts``; without
  it, over the finished trials), so ``--retry-infra`` cannot wash a fault out of the rate.

Decision, first match: ``no_image`` (its image failed to pull: never tried, reported, not
booked as trial faults), ``incomplete`` (done < n), ``infra`` (infra_fraction >
``max_infra_fraction``, default 0.05, or no scored trial), ``too_hard`` (success < ``low``),
``too_easy`` (success > ``high``), else ``keep``. The window is closed, ``[low, high]``;
every task gets exactly one decision.

Why 5 %: an infrastructure fault is excluded from the success rate, and some faults track
the outcome (a long trajectory meets more of them); a task that has them often would be
piloted, and trained, on a truncated distribution. At ``n = 8`` one fault in eight
attempts (12.5 %) already rejects the task.

Outputs in the pilot directory: ``subset.txt`` (kept instance ids in task-file order,
``#`` header; what ``prepare --subset`` reads), ``tasks.jsonl`` (one ``TaskStats`` a line)
and ``summary.md``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.outcomes import OUTCOMES, Outcome

SUBSET, TASKS, SUMMARY = "subset.txt", "tasks.jsonl", "summary.md"
DECISIONS = ("keep", "too_hard", "too_easy", "infra", "incomplete", "no_image")
Key = tuple[str, int]


@dataclass(frozen=True)
class Window:
    """The subset rule. Defaults: keep success in [0.2, 0.5]; drop infra_fraction > 0.05."""

    low: float = 0.2
    high: float = 0.5
    max_infra_fraction: float = 0.05
    z: float = 1.96

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise InputError(f"--low {self.low} / --high {self.high}: need 0 <= low <= high <= 1")
        if not 0.0 <= self.max_infra_fraction <= 1.0:
            raise InputError(
                f"--max-infra-fraction {self.max_infra_fraction}: need a value in [0, 1]"
            )
        if self.z <= 0:
            raise InputError(f"--z {self.z}: must be > 0")


@dataclass(frozen=True)
class TaskStats:
    """One task's pilot statistics and the decision."""

    instance_id: str
    done: int
    counts: dict[str, int]
    solved: int
    scored: int
    success: float | None
    wilson_low: float | None
    wilson_high: float | None
    infra_fraction: float | None
    decision: str
    attempts: int = 0
    infra_attempts: int = 0
    note: str = ""


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (``(0, 1)`` when n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def summarize(
    instance_ids: Sequence[str],
    records: Mapping[Key, Mapping[str, Any]],
    n: int,
    window: Window = Window(),
    *,
    attempts: Mapping[Key, Sequence[str]] | None = None,
    no_image: Mapping[str, str] | None = None,
) -> list[TaskStats]:
    """Per-task statistics and decision (module specification), in the order given.

    ``records``: ``(instance_id, trial) -> result line`` (``pilot.load_results``); lines of
    other tasks, and trials ``>= n``, are not counted. ``attempts``: ``(instance_id, trial)
    -> outcomes of every attempt`` (``pilot.attempts``; default: the finished trials only).
    ``no_image``: ``instance_id -> error`` of the tasks whose image failed (default none).
    """
    no_image = no_image or {}
    per_task: dict[str, Counter[str]] = {iid: Counter() for iid in instance_ids}
    tried: dict[str, Counter[str]] = {iid: Counter() for iid in instance_ids}
    for (iid, trial), rec in records.items():
        if iid in per_task and trial < n:
            per_task[iid][Outcome.parse(rec["outcome"]).value] += 1
            if attempts is None:
                tried[iid][rec["outcome"]] += 1
    for (iid, trial), outcomes in (attempts or {}).items():
        if iid in tried and trial < n:
            tried[iid].update(outcomes)
    stats = []
    eps = 1e-12  # 1/5 must count as inside [0.2, 0.5] whatever the float rounding
    for iid in instance_ids:
        c = per_task[iid]
        done = sum(c.values())
        infra = c[Outcome.INFRA_NO_RESULT.value]
        solved, scored = c[Outcome.SOLVED.value], done - infra
        success = solved / scored if scored else None
        lo, hi = wilson_interval(solved, scored, window.z) if scored else (None, None)
        n_attempts = sum(tried[iid].values())
        infra_attempts = tried[iid][Outcome.INFRA_NO_RESULT.value]
        infra_fraction = infra_attempts / n_attempts if n_attempts else None
        if iid in no_image:
            decision = "no_image"
        elif done < n:
            decision = "incomplete"
        elif success is None or infra_fraction > window.max_infra_fraction + eps:
            decision = "infra"
        elif success < window.low - eps:
            decision = "too_hard"
        elif success > window.high + eps:
            decision = "too_easy"
        else:
            decision = "keep"
        counts = {o.value: c[o.value] for o in OUTCOMES}
        stats.append(
            TaskStats(
                iid,
                done,
                counts,
                solved,
                scored,
                success,
                lo,
                hi,
                infra_fraction,
                decision,
                n_attempts,
                infra_attempts,
                no_image.get(iid, "")[:300],
            )
        )
    return stats


def write_outputs(
    out_dir: str | os.PathLike[str],
    stats: Sequence[TaskStats],
    records: Mapping[Key, Mapping[str, Any]],
    *,
    n: int,
    window: Window,
    model: str | None = None,
) -> dict[str, Path]:
    """Write ``subset.txt``, ``tasks.jsonl`` and ``summary.md``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept = [s.instance_id for s in stats if s.decision == "keep"]
    header = (
        f"# pilot subset: success in [{window.low:g}, {window.high:g}], infra fraction <= "
        f"{window.max_infra_fraction:g}, n = {n}{f', model {model}' if model else ''}\n"
    )
    paths = {"subset": out / SUBSET, "tasks": out / TASKS, "summary": out / SUMMARY}
    paths["subset"].write_text(header + "".join(f"{i}\n" for i in kept))
    paths["tasks"].write_text("".join(json.dumps(asdict(s)) + "\n" for s in stats))
    paths["summary"].write_text(render_summary(stats, records, n=n, window=window, model=model))
    return paths


def render_summary(
    stats: Sequence[TaskStats],
    records: Mapping[Key, Mapping[str, Any]],
    *,
    n: int,
    window: Window,
    model: str | None = None,
) -> str:
    """The markdown summary: decisions, outcome mix, infra reasons, kept tasks."""
    ids = {s.instance_id for s in stats}
    recs = [r for (iid, t), r in records.items() if iid in ids and t < n]
    mix = Counter(r["outcome"] for r in recs)
    decisions = Counter(s.decision for s in stats)
    infra_reasons = Counter(
        r.get("reason", "?") for r in recs if r["outcome"] == Outcome.INFRA_NO_RESULT.value
    )
    total = max(len(recs), 1)
    lines = [
        "# Pilot summary",
        "",
        f"{f'Model `{model}`, ' if model else ''}{n} trials per task; keep success in "
        f"[{window.low:g}, {window.high:g}] with infra fraction <= {window.max_infra_fraction:g}; "
        f"Wilson z = {window.z:g}.",
        "",
        "| tasks | " + " | ".join(DECISIONS) + " |",
        "|---" * (len(DECISIONS) + 1) + "|",
        f"| {len(stats)} | " + " | ".join(str(decisions[d]) for d in DECISIONS) + " |",
        "",
        f"Outcomes over {len(recs)} trials: "
        + ", ".join(f"{o.value} {mix[o.value]} ({mix[o.value] / total:.0%})" for o in OUTCOMES),
        "",
    ]
    if infra_reasons:
        lines += [
            "Infrastructure reasons: "
            + ", ".join(f"{r} {k}" for r, k in infra_reasons.most_common(8)),
            "",
        ]
    kept = [s for s in stats if s.decision == "keep"]
    lines += ["## Kept tasks", ""]
    if not kept:
        lines.append("None.")
    else:
        lines.append(
            "| instance_id | solved/scored | success | Wilson interval | mix (S/F/B/I) "
            "| infra attempts |"
        )
        lines.append("|---|---|---|---|---|---|")
    for s in kept:
        mix_s = "/".join(str(s.counts[o.value]) for o in OUTCOMES)
        lines.append(
            f"| {s.instance_id} | {s.solved}/{s.scored} | {s.success:.2f} | "
            f"[{s.wilson_low:.2f}, {s.wilson_high:.2f}] | {mix_s} | "
            f"{s.infra_attempts}/{s.attempts} |"
        )
    rejected = [s for s in stats if s.decision == "infra"]
    if rejected:
        lines += ["", "## Rejected for infrastructure faults", ""]
        lines += [
            "| instance_id | infra attempts | infra fraction | reasons |",
            "|---|---|---|---|",
        ]
        for s in rejected:
            reasons = Counter(
                r.get("reason", "?")
                for (iid, t), r in records.items()
                if iid == s.instance_id and t < n and r["outcome"] == Outcome.INFRA_NO_RESULT.value
            )
            fraction = f"{s.infra_fraction:.2f}" if s.infra_fraction is not None else "-"
            lines.append(
                f"| {s.instance_id} | {s.infra_attempts}/{s.attempts} | {fraction} | "
                + ", ".join(f"{r} {k}" for r, k in reasons.most_common())
                + " |"
            )
    missing = [s for s in stats if s.decision == "no_image"]
    if missing:
        lines += ["", "## Not tried: the image failed to pull", ""]
        lines += [f"- {s.instance_id}: {s.note}" for s in missing]
    return "\n".join(lines) + "\n"
