"""Runs with known behaviour, in the keys the simulator and the cluster log, for judge tests.

``make_run(arm, seed, steps=..., **levels)`` writes one row per step with the census of
the trained groups (``rollout/census/*``, with ``b_all`` the level ``b``) and of every
generated rollout (``rollout/census/generated/*``); ``legacy=True`` writes what outputs of
earlier versions had instead: the simulator's ``sim/generated/*`` and no ``b_all``.
A level is a number or a function of the step array; each seed shifts every level by
``N(0, noise)`` (seed-to-seed variation) and each step by ``N(0, step_noise)``, from a
generator seeded by (arm, seed), so a test knows the true difference and its noise.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from rescue import arms
from rescue.judge.runs import Run, parse_name

C = "rollout/census/"
G = "rollout/census/generated/"
LEGACY_G = "sim/generated/"

Level = float | Callable[[np.ndarray], np.ndarray]

DEFAULTS: dict[str, Level] = {
    "success": 0.5,
    "cap_hit": 0.2,
    "turns_solved": 6.0,
    "turns_submitted": 10.0,
    "turns_capped": 20.0,
    "ran_tests": 0.8,
    "b": 0.5,
    "b_realized": 0.5,
    "b_paid": 0.4,
    "masked_frac": 0.0,
    "p_thorough": 0.5,
    "step_time": 10.0,
    "update_norm": 1.0,
}


def make_run(
    label: str,
    seed: int,
    *,
    steps: int = 40,
    rollouts: float = 128.0,
    noise: float = 0.01,
    step_noise: float = 0.0,
    family: str = "sim",
    drop: tuple[str, ...] = (),
    legacy: bool = False,
    trained_only: bool = False,
    two_outcome: bool = False,
    **levels: Level,
) -> Run:
    """One run of arm ``label`` (``protect-a0.5``), with ``levels`` over ``DEFAULTS``.

    ``drop``: keys left out of every row (an older run, a metric switched off);
    ``legacy``: the keys of earlier outputs (above); ``trained_only``: no generated view at
    all (a cluster run logged before the census had one); ``two_outcome``: every rollout
    is solved or capped (the cap-hit rate is 1 − success, no submitted failure).
    """
    unknown = set(levels) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown levels {sorted(unknown)}")
    rng = np.random.default_rng(zlib.crc32(f"{label}/{seed}".encode()))
    t = np.arange(steps, dtype=float)
    v = {}
    for name, default in DEFAULTS.items():
        level = levels.get(name, default)
        base = level(t) if callable(level) else np.full(steps, float(level))
        v[name] = base + rng.normal(0, noise) + rng.normal(0, step_noise, steps)
    for rate in ("success", "cap_hit", "ran_tests", "b", "b_realized", "b_paid", "masked_frac"):
        v[rate] = np.clip(v[rate], 0.0, 1.0)
    v["cap_hit"] = (
        1.0 - v["success"] if two_outcome else np.minimum(v["cap_hit"], 1.0 - v["success"])
    )
    clock = np.cumsum(np.maximum(v["step_time"], 0.0))
    rows = []
    for i in range(steps):
        solved = v["success"][i] * rollouts
        capped = v["cap_hit"][i] * rollouts
        submitted = 0.0 if two_outcome else rollouts - solved - capped
        row: dict[str, float] = {"rollout/step": float(i), "sim/time": float(clock[i])}
        views = (C,) if trained_only else (LEGACY_G if legacy else G, C)
        for p in views:
            row.update(
                {
                    f"{p}rollouts": rollouts,
                    f"{p}outcome/solved": solved,
                    f"{p}outcome/submitted_failure": submitted,
                    f"{p}outcome/budget_failure": capped,
                    f"{p}outcome/infra_no_result": 0.0,
                    f"{p}turns_mean/solved": v["turns_solved"][i],
                    f"{p}turns_mean/submitted_failure": v["turns_submitted"][i],
                    f"{p}turns_mean/budget_failure": v["turns_capped"][i],
                    f"{p}cap_hit_rate": capped / rollouts,
                    f"{p}ran_tests_rate/solved": v["ran_tests"][i],
                }
            )
        row[f"{C}masked_frac"] = v["masked_frac"][i]
        row[f"{C}b_realized"] = v["b_realized"][i]
        if not legacy:
            row[f"{C}b_all"] = v["b"][i]
        row["sim/update_norm"] = max(float(v["update_norm"][i]), 0.0)
        row[f"{C}groups/dropped_stale"] = 0.0
        row[f"{C}groups/trained_fresh"] = 16.0
        if getattr(arms.ARMS.get(parse_name(label)[0].base_arm), "mask", False):  # masked arms
            row[f"{C}b_paid/masked"] = v["b_paid"][i]
            row[f"{C}b_paid/masked_rollouts"] = capped
        row["sim/p_thorough"] = v["p_thorough"][i]
        for key in drop:
            row.pop(key, None)
        rows.append(row)
    cond = parse_name(label)[0]
    if family != "sim":
        cond = type(cond)(family, cond.arm, cond.a, cond.k, cond.cap)
    return Run(cond, seed, rows, source=f"synthetic {label} seed {seed}")


def arm(label: str, seeds: int | list[int] = 5, **kw) -> dict[int, Run]:
    """``{seed: run}`` of one arm over ``seeds`` (a count or a list)."""
    ss = range(seeds) if isinstance(seeds, int) else seeds
    return {s: make_run(label, s, **kw) for s in ss}


def cohort(**arms: dict[int, Run]) -> dict[str, dict[int, Run]]:
    """``cohort(mask=arm("mask"), zero=arm("zero"))`` keyed by the runs' labels."""
    return {next(iter(runs.values())).label: runs for runs in arms.values()}
