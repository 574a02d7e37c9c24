"""Checks of a finished rehearsal, from what the run left on disk (no framework imports).

``check_run(out, arm, a, offpolicy, job_status, steps_checked)`` reads, under the run folder
``out``:

- the offline wandb history (``runs/*/wandb/**/offline-run-*/run-*.wandb``) through
  ``rescue.tracking.history``, the reader ``rescue report`` uses (wandb's own reader of the
  transaction log; a nested key joined with ``.``),
- the probes (``rescue.rehearsal.miles.probes``: ``census``, ``unused``, ``train_data``,
  ``trainer_weights``, ``reducer``) and the engine's records (``engine.jsonl``: every chat
  turn; ``engine_weights.jsonl``: every weight update it received),
- the debug rollout dumps (``runs/*/dumps/rollout_data/*.pt``) through ``rescue replay
  census``'s loader, and the stand-in docker's log.

A progress bar on stderr (``rescue.progress``; ``progress=False`` turns it off) counts the
checks as they finish. The checks, in order (``CHECKS``; each a line of the report, any
failure fails the run; ``rescue.rehearsal.verdict.checks`` has each one's rule):

``job`` the Ray job succeeded; ``steps`` the steps trained; ``weights`` the engine received
the trainer's weights at every version and each update changed them; ``finite`` every
optimizer step's ``train/*`` finite with rescue's keys (score centering: a head at every
trained token); ``census`` exact conservation at every flush; ``unused`` every group Miles'
unused handler received is one the census counted in that step, and the other way round;
``stale`` stale groups happened and the arm handled them as it says; ``protect`` the 1/a
weights (other arms: none); ``advantages`` the loss trained exactly the train data's
advantages (the turn channel included); ``matched`` the control's two copies; ``drgrpo``
the constant divisor; ``judged`` the keys ``rescue report`` reads; ``outcomes`` each outcome
class with its reason; ``infra`` no infrastructure fault reached the loss; ``replay`` the
dumps load and agree with the logged census; ``checkpoint`` the checkpoint Miles wrote at the
last step is the last update's weights; and for a run killed and resumed (``--kill-at``)
``resume``, ``accounted``, ``coins`` and ``restarted`` (``rescue.rehearsal.verdict.lives``; "does
not apply" otherwise). A resumed run is read as one: each step from the last life that
logged it.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue import restart
from rescue.judge.lives import each_step_once
from rescue.rehearsal.verdict import checks, lives
from rescue.rehearsal.verdict.checks import GROUPS, RunFiles

#: The outcome classes (with their reasons) each launcher's runs must show.
EXPECTED_REASONS = {
    "swe": (
        ("solved", "resolved"),
        ("submitted_failure", "unresolved"),
        ("budget_failure", "turn_cap"),
        ("budget_failure", "context_limit"),
    ),
    "rlvr": (
        ("solved", "resolved"),
        ("submitted_failure", "unresolved"),
        ("budget_failure", "truncated"),
    ),
    "agent": (
        ("solved", "won"),
        ("submitted_failure", "lost"),
        ("budget_failure", "turn_cap"),
    ),
}
#: Why a class may be missing from a short run, said beside it (text games).
MISSING_WHY = {
    "solved/won": "the taught tiny model wins a level-1 game (five moves) in some episodes "
    "and almost never a harder one; a few steps of a few games may see no win",
    "submitted_failure/lost": "the model loses by eating an ingredient or cooking one wrongly, "
    "which it does in some episodes only",
}


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
            if k == "profile":  # printed on its own (rescue.rehearsal.verdict.profile.render)
                continue
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


def wandb_history(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """History rows of offline wandb run folders (``offline-run-*``), folder by folder,
    through ``rescue.tracking.history``, the one reader of wandb's records (the judge's)."""
    from rescue.tracking.history import history_rows

    return history_rows(run_dirs)


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


_ERROR = re.compile(r"\b((?:\w+\.)*\w*(?:Error|Exception|Stop)): (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def job_error(job_log: Path) -> str:
    """The exception that failed the job (``Name: message``), or ``""``: the last one a Ray
    task raised (``RayTaskError(Name)``) when there is one, else the log's last exception
    line (tear-down errors after a task's failure are passed over)."""
    if not job_log.exists():
        return ""
    text = _ANSI.sub("", job_log.read_text(errors="replace"))
    raised = set(re.findall(r"RayTaskError\((\w+)\)", text))
    found = last = ""
    for line in text.splitlines():
        m = _ERROR.search(line)
        if not m or m.group(1).startswith("ray."):
            continue
        name = m.group(1).rsplit(".", 1)[-1]
        last = f"{name}: {m.group(2).strip()}"
        if name in raised:
            found = last
    return (found or last)[:500]


def read_run(
    out: Path, *, arm: str, a: float | None, offpolicy: str, steps_checked: int,
    launcher: str = "swe", reference: Path | None = None,
) -> RunFiles:  # fmt: skip
    """Everything the checks read, from the run folder ``out``: a killed and resumed run
    read as one (``rescue.rehearsal.verdict.lives``), its history each step once."""
    command = out / "command.json"
    flags = json.loads(command.read_text())["flags"] if command.exists() else []

    def flag(name: str, default: int) -> int:
        return int(next((flags[i + 1] for i, x in enumerate(flags[:-1]) if x == name), default))

    per = flag("--rollout-batch-size", 1) * flag("--n-samples-per-prompt", 1)
    per //= max(1, flag("--global-batch-size", per))
    if any(x.startswith("rescue.miles.matched.convert_samples_to_train_data") for x in flags):
        per *= 2  # the matched or the step-size control: two copies of each step
    probes = out / "probes"
    history, note = each_step_once(wandb_history(sorted(out.glob("runs/*/wandb/**/offline-run-*"))))
    joined = lives.joined(out, copies=2 if arm == "matched" else 1, reference=reference)
    rows = {name: _jsonl(probes / f"{name}.jsonl") for name in lives.PROBES}
    if joined is not None and joined.probes:
        rows.update({name: joined.probes.get(name, []) for name in lives.PROBES})
    return RunFiles(
        arm=arm,
        a=a,
        offpolicy=offpolicy,
        steps_checked=steps_checked,
        launcher=launcher,
        max_response_len=flag("--rollout-max-response-len", 0),
        steps_per_rollout=max(1, per),
        history=history,
        census=rows["census"],
        unused=rows["unused"],
        train_data=[row["samples"] for row in rows["train_data"]],
        trainer_weights=rows["trainer_weights"],
        engine_weights=rows["engine_weights"],
        reducer=rows["reducer"],
        joined=joined,
        history_note=note,
    )


#: The checks of the module docstring, in order (the progress bar's total); ``job``,
#: ``start``, ``outcomes``, ``infra``, ``replay`` and ``checkpoint`` are this module's (the
#: last one the caller's), the rest ``checks``'.
CHECKS = (
    "job", "steps", "weights", "start", "finite", "census", "unused", "stale", "protect",
    "advantages", "capped", "matched", "drgrpo", "judged", "outcomes", "infra", "replay",
    "checkpoint", *lives.CHECKS,
)  # fmt: skip
_RULES = {
    "steps": checks.trained_steps,
    "weights": checks.weights,
    "start": None,
    "finite": checks.finite,
    "census": checks.census,
    "unused": checks.unused,
    "stale": checks.stale,
    "protect": checks.protect,
    "advantages": checks.advantages,
    "capped": checks.capped,
    "matched": checks.matched,
    "drgrpo": checks.drgrpo,
    "judged": checks.judged_keys,
}


def check_run(
    out: Path,
    *,
    arm: str,
    a: float | None,
    job_status: str,
    steps_checked: int,
    offpolicy: str = "tis-sc",
    launcher: str = "swe",
    model: Path | None = None,
    checkpoint: Callable[[RunFiles], tuple[bool, str]] | None = None,
    progress: bool = True,
    reference: Path | None = None,
) -> Report:
    """Every check of the module docstring on the run folder ``out``. ``model``: the
    checkpoint the trainer started from (single-turn and text-game runs; ``start`` compares
    the first weight update with it); ``checkpoint``: the rule comparing the checkpoint Miles
    wrote with the engine's last weights (it reads Megatron's format, so the caller's)."""
    from rescue.progress import progress_bar

    out = Path(out)
    with progress_bar(len(CHECKS), unit="checks", desc="rehearsal report", enabled=progress) as bar:
        report = Report()
        report.on_add = lambda: bar.update(1)
        ok = job_status == "SUCCEEDED"
        cause = "" if ok else job_error(out / "driver.log") or job_error(out / "job.log")
        report.add("job", ok, f"Ray job {job_status}" + (f": {cause}" if cause else ""))
        f = read_run(
            out, arm=arm, a=a, offpolicy=offpolicy, steps_checked=steps_checked,
            launcher=launcher, reference=reference,
        )  # fmt: skip
        rules = {**_RULES, "start": lambda f: started_from(f, model)}
        for name, rule in rules.items():
            try:
                ok, detail = rule(f)
            except Exception as e:  # a check that cannot read its input fails, saying why
                ok, detail = False, f"could not be checked: {type(e).__name__}: {e}"
            report.add(name, ok, detail)
        report.facts["groups by bucket"] = {b: int(v) for b, v in checks._totals(f).items()}
        train = [s for step in f.train_data for s in step]
        _check_outcomes(report, train, f.census, out, launcher)
        if launcher == "agent":
            report.facts["episodes"] = episodes(train)
        infra = [
            s for s in train if s.get("outcome") == "infra_no_result" and s["loss_mask_sum"] > 0
        ]
        report.add(
            "infra",
            not infra,
            "no infra_no_result rollout reached the loss"
            if not infra
            else f"{len(infra)} infra_no_result rollouts reached the loss with reward 0 "
            f"(reasons: {dict(Counter(s.get('outcome_reason') for s in infra))})",
        )
        logged = _steps(f.history)
        report.facts["rollout steps in wandb"] = sorted(logged)
        _check_replay(report, out, logged, need=steps_checked)
        try:
            ok, detail = checkpoint(f) if checkpoint else (False, "no checkpoint rule given")
        except Exception as e:
            ok, detail = False, f"could not be checked: {type(e).__name__}: {e}"
        report.add("checkpoint", ok, detail)
        try:
            ref = None
            if reference is not None and f.joined is not None:
                ref_history = wandb_history(sorted(reference.glob("runs/*/wandb/**/offline-run-*")))
                ref = lives.Reference(each_step_once(ref_history)[0], lives.gate_rows(reference))
            restart_checks = lives.checks_of(f, ref)
        except Exception as e:
            why = f"could not be checked: {type(e).__name__}: {e}"
            restart_checks = dict.fromkeys(lives.CHECKS, (False, why))
        for name, (ok, detail) in restart_checks.items():
            report.add(name, ok, detail)
        if f.joined is not None:
            report.facts["lives"] = [restart.describe(life) for life in f.joined.lives]
        engine = _jsonl(out / "probes" / "engine.jsonl")
        report.facts["engine turns"] = dict(Counter(r["behaviour"] for r in engine))
        report.facts["engine 400s"] = sum(r.get("status") == 400 for r in engine)
    report.on_add = None
    return report


def _check_outcomes(
    report: Report, train: list[dict], census: list[dict], out: Path, launcher: str = "swe"
) -> None:
    """Scored classes from the trained samples (``EXPECTED_REASONS`` of the launcher; a text
    game's episode counted once, not per step); for SWE runs ``infra_no_result`` from the
    groups the census counted as aborted, whose sandbox failed to start (the stand-in
    docker's log): Miles replaces such a sample by an aborted copy of the prompt, so no
    reason survives."""
    sample_list = train
    if launcher == "agent":  # one entry per episode: its steps share their episode's end
        sample_list = list({(s.get("group_index"), s.get("rollout_id")): s for s in train}.values())
    seen = Counter((s.get("outcome"), s.get("outcome_reason")) for s in sample_list)
    missing = [f"{o}/{r}" for o, r in EXPECTED_REASONS[launcher] if not seen[(o, r)]]
    if launcher == "swe":
        aborted = sum(int(r["groups"].get(f"{GROUPS}aborted", 0)) for r in census)
        calls = out / "docker" / "calls.log"
        failed_starts = sum(
            1
            for line in (calls.read_text().splitlines() if calls.exists() else [])
            if json.loads(line)[0] == "run" and ".gone" in line
        )
        if not (aborted and failed_starts):
            missing.append("infra_no_result/sandbox_start (an aborted group)")
        report.facts["groups aborted (sandbox never started)"] = aborted
    # A class the tiny policy reaches only by chance (MISSING_WHY) may be absent from a few
    # steps: the report names it and why; any other missing class fails the check.
    chance = [m for m in missing if m in MISSING_WHY]
    why = "; ".join(f"{m}: {MISSING_WHY[m]}" for m in chance)
    unexplained = [m for m in missing if m not in MISSING_WHY]
    if not missing:
        detail = "every outcome class appeared with its reason"
    elif unexplained:
        detail = f"never seen: {', '.join(missing)}" + (f" ({why})" if why else "")
    else:
        detail = f"every other class appeared; not in this run: {why}"
    report.add("outcomes", not unexplained, detail)
    what = "episodes" if launcher == "agent" else "samples"
    report.facts[f"outcomes trained ({what})"] = {
        f"{o}/{r}": n for (o, r), n in sorted(seen.items(), key=str)
    }


def episodes(train: list[dict]) -> dict[str, Any]:
    """A text-game run's episodes: count, ends per difficulty level, the invalid and the
    inadmissible actions (``rescue.envs.episode`` counts them; every step sample carries its
    episode's counts)."""
    by: dict[tuple, dict] = {}
    for s in train:
        by.setdefault((s.get("group_index"), s.get("rollout_id")), s)
    levels: dict[str, Counter] = defaultdict(Counter)
    for s in by.values():
        levels[f"level {s.get('difficulty', '?')}"][str(s.get("exit_status"))] += 1
    return {
        "episodes": len(by),
        "steps": len(train),
        "invalid_actions": sum(int(s.get("invalid_actions") or 0) for s in by.values()),
        "inadmissible_actions": sum(int(s.get("inadmissible_actions") or 0) for s in by.values()),
        "ends by level": {k: dict(v) for k, v in sorted(levels.items())},
    }


def started_from(f: RunFiles, model: Path | None) -> tuple[bool, str]:
    """The trainer started from ``model`` (single-turn and text-game runs): the first
    weight update (Miles' version 1, the trainer's initial weights) carries exactly the
    checkpoint's weights in bfloat16, the trainer's dtype, under Hugging Face names. SWE
    runs start from Megatron's seeded initialization: does not apply."""
    if model is None:
        return True, "does not apply: the trainer starts from Megatron's seeded initialization"
    import torch
    from safetensors.torch import load_file

    from rescue.rehearsal.tiny.policy import digest

    first = next((r for r in f.trainer_weights if str(r["version"]) == "1"), None)
    if first is None:
        return False, "no first weight update (version 1) was recorded"
    state = load_file(str(Path(model) / "model.safetensors"))
    want = digest({k: v.to(torch.bfloat16) for k, v in state.items()}.items())
    if first["digest"] != want:
        return False, (
            f"the first weight update is not {model}: the trainer did not start from the "
            "checkpoint the engine serves"
        )
    return True, f"the first weight update is the taught checkpoint, bit for bit ({model.name})"


def _check_replay(report: Report, out: Path, steps: dict[int, dict], need: int = 1) -> None:
    """The dumps load with ``rescue replay census`` and, at every step whose census reached
    wandb, agree with it; at least ``need`` steps' census reached it (a row Miles lost at
    exit is not a disagreement, but a run that logged too few is a failure)."""
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
    mismatched, compared = [], 0
    for row in replayed["steps"]:
        logged = steps.get(row["step"], {})
        keys = {o: f"rollout/census/samples/outcome/{o.value}" for o in OUTCOMES}
        if not all(k in logged for k in keys.values()):
            continue
        compared += 1
        for o, key in keys.items():
            n = row["metrics"].get(f"outcome/{o.value}", 0.0)
            if logged[key] != n:
                mismatched.append((row["step"], o.value, n, logged[key]))
    ok = not mismatched and compared >= need
    report.add(
        "replay",
        ok,
        f"{len(dumps)} dumps load with rescue replay census and agree with the census of the "
        f"{compared} steps logged"
        if ok
        else f"dump and log disagree: {mismatched[:3]}"
        if mismatched
        else f"the census of {compared} steps reached wandb (need {need})",
    )
