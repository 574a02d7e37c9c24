"""Where a rehearsal's seconds go: start-up, each trained step, and CPU per component.

``profile(out)`` reads what a finished run left in its folder and returns a dict
(``report.json`` keeps it; ``render`` prints it):

- ``startup``: seconds from the start to the inputs written (tokenizer, checkpoint, task
  images), the engine's pre-flight passed, the Ray head up, the job submitted, the train
  actor initialized, Miles' first weight update (the trainer's initial weights reach the
  engine) and the first step trained (``marks.json`` of the driver and Miles' own log
  lines);
- ``steps``: per trained step after the first, from Miles' ``Timer`` lines of the train
  actor: the wall time between two steps' ends and its parts: ``wait`` (for the rollout's
  groups: generation, the agents and their sandboxes, the reward hook, the conversion,
  regeneration of dropped groups), ``log_probs`` (the forward pass for the old policy's
  log-probs), ``train`` (forward, backward and optimizer step), ``update`` (the weight
  update to the engine), ``save``;
- ``engine``: chat turns served and their seconds (the tiny model's forward passes);
- ``sandbox``: stand-in ``docker`` calls by kind and their seconds (exec of the tests'
  ``pytest`` apart);
- ``cpu``: CPU seconds per component (``rescue.rehearsal.verdict.processes.cpu_seconds``, taken
  just before the run's processes are stopped).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

_TIMER = re.compile(
    r"MegatronTrainRayActor.*?\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) [^\]]*\] timer\.py:\d+ - "
    r"Timer (\w+) end \(elapsed: ([\d.]+)s\)"
)
_INIT = re.compile(
    r"MegatronTrainRayActor.*?\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) [^\]]*\].*fn=init phase=end"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
PARTS = ("wait", "log_probs", "train", "update", "save")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def trainer_timers(job_log: Path) -> tuple[float | None, list[tuple[float, str, float]]]:
    """(the train actor's init end, [(time, timer, seconds)]) from Miles' log lines."""
    if not job_log.exists():
        return None, []
    init, timers = None, []
    for raw in job_log.read_text(errors="replace").splitlines():
        line = _ANSI.sub("", raw)
        if (m := _TIMER.search(line)) is not None:
            timers.append((_time(m.group(1)), m.group(2), float(m.group(3))))
        elif init is None and (m := _INIT.search(line)) is not None:
            init = _time(m.group(1))
    return init, timers


def steps(timers: list[tuple[float, str, float]]) -> list[dict[str, float]]:
    """Per step after the first: its wall time (between two ``train`` ends) and parts."""
    ends = [(t, s) for t, name, s in timers if name == "train"]
    out = []
    for (t0, _), (t1, _) in itertools.pairwise(ends):
        inside = [(name, s) for t, name, s in timers if t0 < t <= t1]
        part = defaultdict(float)
        for name, s in inside:
            key = {"train_wait": "wait", "log_probs": "log_probs", "actor_train": "train"}.get(
                name, {"update_weights": "update", "save_model": "save"}.get(name)
            )
            if key:
                part[key] += s
        part["wait"] = max(0.0, part["wait"] - part["update"] - part["save"])
        out.append({"wall": round(t1 - t0, 2), **{k: round(part[k], 2) for k in PARTS}})
    return out


def profile(out: Path) -> dict[str, Any]:
    """The profile of the run folder ``out`` (module docstring)."""
    out = Path(out)
    marks = json.loads((out / "marks.json").read_text()) if (out / "marks.json").exists() else {}
    start = marks.get("start")
    # the driver's log as Ray kept it; the tail's when Ray gave none
    driver = out / "driver.log"
    init, timers = trainer_timers(driver if driver.exists() else out / "job.log")
    startup: dict[str, float] = {}
    if start is not None:
        for name in ("inputs", "engine", "ray", "submitted"):
            if name in marks:
                startup[name] = round(marks[name] - start, 1)
        if init is not None:
            startup["trainer initialized"] = round(init - start, 1)
        first_update = next((t for t, name, _ in timers if name == "update_weights"), None)
        if first_update is not None:
            startup["initial weights on the engine"] = round(first_update - start, 1)
        first_train = next((t for t, name, _ in timers if name == "train"), None)
        if first_train is not None:
            startup["first step trained"] = round(first_train - start, 1)
    per_step = steps(timers)
    engine = _jsonl(out / "probes" / "engine.jsonl")
    sandbox: dict[str, list[float]] = defaultdict(list)
    for row in _jsonl(out / "docker" / "timing.log"):
        call = row["call"]
        kind = "exec pytest" if call.startswith("exec") and "pytest" in call else call.split()[0]
        sandbox[kind].append(row["s"])
    cpu = json.loads((out / "cpu.json").read_text()) if (out / "cpu.json").exists() else {}
    return {
        "startup": startup,
        "steps": per_step,
        "median step": _median(per_step),
        "engine": {
            "turns": len(engine),
            "seconds": round(sum(r.get("s", 0.0) for r in engine), 1),
        },
        "sandbox": {k: {"calls": len(v), "seconds": round(sum(v), 1)} for k, v in sandbox.items()},
        "cpu": cpu,
    }


def _median(per_step: list[dict[str, float]]) -> dict[str, float]:
    if not per_step:
        return {}
    return {k: round(statistics.median(s[k] for s in per_step), 2) for k in ("wall", *PARTS)}


def render(p: dict[str, Any]) -> str:
    """The profile as the report's lines."""
    lines = ["profile (seconds)"]
    if p["startup"]:
        lines.append("  start-up: " + ", ".join(f"{k} {v}" for k, v in p["startup"].items()))
    for i, s in enumerate(p["steps"], start=2):
        lines.append(f"  step {i}: " + ", ".join(f"{k} {v}" for k, v in s.items()))
    if p["median step"]:
        lines.append(
            "  median step after the first: "
            + ", ".join(f"{k} {v}" for k, v in p["median step"].items())
        )
    e = p["engine"]
    lines.append(f"  engine: {e['turns']} chat turns, {e['seconds']} s")
    if p["sandbox"]:
        lines.append(
            "  sandbox: "
            + ", ".join(f"{k} {v['calls']} calls {v['seconds']} s" for k, v in p["sandbox"].items())
        )
    if p["cpu"]:
        lines.append("  CPU: " + ", ".join(f"{k} {v}" for k, v in p["cpu"].items()))
    return "\n".join(lines)
