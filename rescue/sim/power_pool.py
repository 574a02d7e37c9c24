"""Simulated runs as the noise of ``rescue power``: one arm's runs of a scenario, cached.

Specification
-------------
``rescue power --noise sim`` draws each replicate's runs from a pool of simulated runs of
one arm (``rescue.judge.power.pool_null``): their b is noisy and their cap-hit rate and b
are read off the same rollouts, as a real run's are, so the judge's per-seed values vary
as they would on the cluster. ``pool(scenario, arm, runs)`` simulates ``runs`` seeds
(0, 1, ...) of ``arm`` under the preset ``scenario`` with its settings (``steps`` and
``workers`` on top) and returns the judge's ``Run``s, keeping the keys the judge reads.

The pool is deterministic in (scenario settings, arm, seeds): it is cached in
``$XDG_CACHE_HOME/rescue/power`` (default ``~/.cache/rescue/power``), one JSON file named by
the hash of those, written whole (``rescue.output.write_text``); a later call with the same
settings reads it instead of simulating. ``SCENARIOS`` says which scenario a report's arms
are drawn from: the budget arms from ``budget-three-outcome``'s R = 0 arm, the stale-group
arms from ``swe-like``'s never-drop arm.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rescue import arms as arms_registry
from rescue.judge.runs import Run
from rescue.sim import scenario as sc
from rescue.sim.arms import ArmSpec

#: ``(scenario, the arm its pool is drawn from)`` per regime of a report's arms.
SCENARIOS: dict[str, tuple[str, str]] = {
    "budget": ("budget-three-outcome", "zero"),
    "stale": ("swe-like", "never-drop"),
}
#: The budget-regime arms (the rest are stale-group arms), from the registry.
BUDGET_ARMS = frozenset(arms_registry.names(regime="budget"))
#: The keys a pooled run keeps per step (prefixes): everything the judge's predictions read.
KEEP = ("rollout/census/", "sim/time", "sim/update_norm", "sim/p_thorough", "rollout/step")


def regime(arms: Sequence[str]) -> str:
    """``budget`` when every arm (launcher names, ``protect:0.5``) is a budget arm, else
    ``stale``."""
    names = {a.strip().partition(":")[0] for a in arms}
    return "budget" if names <= BUDGET_ARMS else "stale"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rescue" / "power"


def pool(
    scenario: str,
    arm: str,
    runs: int,
    *,
    steps: int | None = None,
    workers: int = 1,
    progress: bool = True,
) -> list[Run]:
    """``runs`` simulated runs (seeds 0..runs-1) of ``arm`` under ``scenario``, read from
    the cache when it holds them (module docstring)."""
    from rescue.output import write_text
    from rescue.sim.runner import run_arms

    overrides = {} if steps is None else {"steps": steps}
    cfg = sc.preset(scenario).sim_config(**overrides)
    spec = ArmSpec.parse(arm)
    key = json.dumps({"config": asdict(cfg), "arm": spec.label, "runs": runs}, sort_keys=True)
    path = (
        cache_dir()
        / f"{scenario}-{spec.label}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    )
    if path.is_file():
        data = json.loads(path.read_text())
    else:
        results = run_arms(cfg, [spec], list(range(runs)), workers=workers, progress=progress)
        data = [
            {
                "seed": r.seed,
                "rows": [{k: v for k, v in m.items() if k.startswith(KEEP)} for m in r.steps],
            }
            for r in results[spec.label]
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(data))
    return [Run(_condition(spec.label), r["seed"], r["rows"], source=str(path)) for r in data]


def _condition(label: str):
    from rescue.judge.runs import parse_name

    return parse_name(label)[0]
