"""What the simulated arms showed: per-arm figures and the pre-registered predictions.

Specification
-------------
Every figure is pooled over a window of steps (counts summed, then divided) from the
step dicts of ``engine``; the policy's behaviour is read from all generated rollouts
(``sim/generated/*``: trained, dropped or aborted alike), the realized baseline b from
the census of trained rollouts. The *final window* is the last ``FINAL_FRACTION`` of the
steps. Across seeds we report the mean and the standard error SE = SD/√n; two arms are
compared by the per-seed (paired: same seed, same tasks at the start) difference, mean ±
SE. A difference counts as shown when it exceeds ``Z`` = 2 SE; a result is reported in
either direction and never hidden.

Predictions (see the README): P3 (mask vs R = 0 cap-hit rate once b > 0.3), P5 (drop vs
never-drop: shorter successes, longer failures, fewer test runs among successes), P6
(protect a = 0.5 matches never-drop; a = 0.1 noisier), P7 offline (per-token advantage
variance, turn-reached baseline vs group mean; >= 20% less supports, < 10% falsifies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rescue.census import PREFIX as C
from rescue.sim.config import SimConfig
from rescue.sim.engine import GENERATED_PREFIX as G
from rescue.sim.engine import SIM_PREFIX

#: Fraction of the steps that make the final window (default 0.2).
FINAL_FRACTION = 0.2
#: Standard errors a difference must exceed to count as shown.
Z = 2.0

Step = Mapping[str, float]


def _failed(m: Step) -> tuple[float, float]:
    num = den = 0.0
    for o in ("submitted_failure", "budget_failure"):
        n = m.get(f"{G}outcome/{o}", 0.0)
        if n:
            num += m.get(f"{G}turns_mean/{o}", 0.0) * n
            den += n
    return num, den


def _b(m: Step) -> tuple[float, float]:
    """The realized b weighted by the trained, unmasked rollouts it is the mean of (in the
    simulator every trained rollout has a reward: a lost one aborts its group)."""
    if f"{C}b_realized" not in m:
        return 0.0, 0.0
    n = round(m[f"{C}rollouts"] * (1.0 - m.get(f"{C}masked_frac", 0.0)))
    return m[f"{C}b_realized"] * n, float(n)


def _trained(m: Step) -> float:
    return sum(
        m.get(f"{C}groups/{b}", 0.0)
        for b in ("trained_fresh", "trained_stale", "trained_protected")
    )


#: name -> (title, per-step (numerator, denominator)). A window's value is Σnum / Σden.
METRICS: dict[str, tuple[str, Callable[[Step], tuple[float, float]]]] = {
    "success": (
        "success rate",
        lambda m: (m.get(f"{G}outcome/solved", 0.0), m.get(f"{G}rollouts", 0.0)),
    ),
    "cap_hit": (
        "cap-hit rate",
        lambda m: (
            m.get(f"{G}cap_hit_rate", 0.0) * m.get(f"{G}rollouts", 0.0),
            m.get(f"{G}rollouts", 0.0),
        ),
    ),
    "turns_solved": (
        "turns of successes",
        lambda m: (
            m.get(f"{G}turns_mean/solved", 0.0) * m.get(f"{G}outcome/solved", 0.0),
            m.get(f"{G}outcome/solved", 0.0),
        ),
    ),
    "turns_failed": ("turns of failures", _failed),
    "ran_tests_solved": (
        "test-run rate among successes",
        lambda m: (
            m.get(f"{G}ran_tests_rate/solved", 0.0) * m.get(f"{G}outcome/solved", 0.0),
            m.get(f"{G}outcome/solved", 0.0) if f"{G}ran_tests_rate/solved" in m else 0.0,
        ),
    ),
    "b": ("realized baseline b (trained)", _b),
    "dropped": (
        "dropped-stale share of groups",
        lambda m: (
            m.get(f"{C}groups/dropped_stale", 0.0),
            m.get(f"{C}groups/dropped_stale", 0.0) + _trained(m),
        ),
    ),
    "p_thorough": ("P(thorough)", lambda m: (m.get(f"{SIM_PREFIX}p_thorough", 0.0), 1.0)),
}


def window_value(
    steps: Sequence[Step], name: str, start: int = 0, stop: int | None = None
) -> float:
    """Pooled value of a metric over ``steps[start:stop]`` (NaN when its population is empty)."""
    f = METRICS[name][1]
    pairs = np.array([f(m) for m in steps[start:stop]], dtype=float).reshape(-1, 2)
    num, den = pairs.sum(axis=0)
    return float(num / den) if den > 0 else float("nan")


def smoothed(steps: Sequence[Step], name: str, window: int) -> np.ndarray:
    """Per-step series pooled over a trailing window of ``window`` steps (for plots)."""
    f = METRICS[name][1]
    pairs = np.array([f(m) for m in steps], dtype=float).reshape(-1, 2)
    c = np.cumsum(np.vstack([np.zeros((1, 2)), pairs]), axis=0)
    idx = np.arange(1, len(steps) + 1)
    lo = np.maximum(idx - window, 0)
    num, den = c[idx, 0] - c[lo, 0], c[idx, 1] - c[lo, 1]
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def final_start(n_steps: int) -> int:
    return n_steps - max(1, round(FINAL_FRACTION * n_steps))


def per_seed(runs, name: str, start: int | None = None) -> np.ndarray:
    """The metric's pooled value per seed over the final window (or from ``start``)."""
    return np.array(
        [
            window_value(r.steps, name, final_start(len(r.steps)) if start is None else start)
            for r in runs
        ]
    )


def mean_se(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    se = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan")
    return float(x.mean()), se


def verdict(diff: float, se: float, predicted_sign: int) -> str:
    """``as predicted`` / ``opposite`` / ``no difference within seed noise`` for a paired diff."""
    if not np.isfinite(diff):
        return "not measurable (no data)"
    if not np.isfinite(se):
        return "one seed: no seed noise estimate" + (
            " (direction as predicted)"
            if np.sign(diff) == predicted_sign
            else " (direction opposite)"
        )
    if abs(diff) <= Z * se:
        return "no difference within seed noise"
    return "as predicted" if np.sign(diff) == predicted_sign else "opposite to the prediction"


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.{digits}f}"


def _pm(m: float, se: float, digits: int = 3) -> str:
    return _fmt(m, digits) + ("" if not np.isfinite(se) else f" ± {_fmt(se, digits)}")


def _paired(
    results, arm: str, ref: str, name: str, start: int | None = None
) -> tuple[float, float]:
    return mean_se(per_seed(results[arm], name, start) - per_seed(results[ref], name, start))


def arm_table(results) -> list[str]:
    cols = [
        "success",
        "cap_hit",
        "turns_solved",
        "turns_failed",
        "ran_tests_solved",
        "b",
        "dropped",
    ]
    head = "| arm | " + " | ".join(METRICS[c][0] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for arm, runs in results.items():
        cells = [
            _pm(*mean_se(per_seed(runs, c)), digits=2 if c.startswith("turns") else 3) for c in cols
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _p3(results, lines: list[str]) -> None:
    lines += ["", "### P3: cap-hit rate under mask versus R = 0 once b exceeds about 0.3", ""]
    if "mask" not in results or "zero" not in results:
        lines.append("Not run: needs the arms `mask` and `zero`.")
        return
    runs = results["mask"]
    n = len(runs[0].steps)
    b = np.nanmean([smoothed(r.steps, "b", max(1, n // 30)) for r in runs], axis=0)
    above = np.flatnonzero(b > 0.3)
    if above.size == 0:
        lines.append(
            "b (mask arm, smoothed) never exceeded 0.3: the prediction's condition did not occur."
        )
        return
    t0 = int(above[0])
    d_after, se_after = _paired(results, "mask", "zero", "cap_hit", start=t0)
    d_fin, se_fin = _paired(results, "mask", "zero", "cap_hit")
    m_mask, _ = mean_se(per_seed(results["mask"], "cap_hit"))
    m_zero, _ = mean_se(per_seed(results["zero"], "cap_hit"))
    lines += [
        f"b (mask arm) first exceeded 0.3 at step {t0}. Cap-hit rate, mask − zero (paired by seed):",
        f"from step {t0} on {_pm(d_after, se_after)}; final window {_pm(d_fin, se_fin)} "
        f"(mask {_fmt(m_mask)}, zero {_fmt(m_zero)}).",
        f"Predicted: higher under mask. Shown: **{verdict(d_fin, se_fin, +1)}** (final window).",
        "",
        "Depends on: `difficulty` (the k = 15 tasks a persistent agent caps on, and the level of b), "
        "`informed_edit` / `blind_edit`, `max_turns`, the initial give-up logits, `lr`, `steps`.",
    ]


def _p5(results, lines: list[str]) -> None:
    lines += ["", "### P5: drop relative to never-drop", ""]
    if "drop" not in results or "never-drop" not in results:
        lines.append("Not run: needs the arms `drop` and `never-drop`.")
        return
    dropped, _ = mean_se(per_seed(results["drop"], "dropped", start=0))
    lines.append(f"Drop discarded {_fmt(100 * dropped, 1)}% of the groups it got (whole run).")
    lines += [
        "",
        "| quantity | predicted | drop − never-drop, final window | shown | whole run | shown |",
        "|---|---|---|---|---|---|",
    ]
    for name, sign, word in (
        ("turns_solved", -1, "shorter"),
        ("turns_failed", +1, "longer"),
        ("ran_tests_solved", -1, "lower"),
    ):
        d, se = _paired(results, "drop", "never-drop", name)
        d0, se0 = _paired(results, "drop", "never-drop", name, start=0)
        lines.append(
            f"| {METRICS[name][0]} | {word} | {_pm(d, se)} | {verdict(d, se, sign)} "
            f"| {_pm(d0, se0)} | {verdict(d0, se0, sign)} |"
        )
    b_drop, _ = mean_se(per_seed(results["drop"], "b", start=0))
    s_drop, _ = mean_se(per_seed(results["drop"], "success", start=0))
    lines += [
        "",
        f"What the census shows of it (whole run): under drop the trained rollouts' b = {_fmt(b_drop)} "
        f"against a success rate of {_fmt(s_drop)} over all generated rollouts; the difference is "
        "in the dropped groups (`rollout/census/dropped/outcome/*`).",
    ]
    lines += [
        "",
        "Depends on: the timing (`turn_time`, `context_growth`, `time_noise`, `concurrency`, "
        "`train_time`), `max_staleness`, `group_size` (a group waits for its slowest rollout), the "
        "fast/thorough length gap (`initial_logits`, edit probabilities), `lr`, `steps`.",
    ]


def _p6(results, lines: list[str]) -> None:
    lines += ["", "### P6: protect at a = 0.5 versus never-drop; a = 0.1", ""]
    if "never-drop" not in results or "protect-a0.5" not in results:
        lines.append("Not run: needs the arms `never-drop` and `protect:0.5` (and `protect:0.1`).")
        return
    d, se = _paired(results, "protect-a0.5", "never-drop", "success")
    ok = np.isfinite(se) and abs(d) <= Z * se
    lines.append(
        f"Final success, protect a=0.5 − never-drop: {_pm(d, se)}: "
        f"**{'matches within seed noise' if ok else 'differs beyond seed noise' if np.isfinite(se) else 'one seed'}**."
    )
    sds = []
    for arm in ("never-drop", "protect-a0.5", "protect-a0.1"):
        if arm in results:
            x = per_seed(results[arm], "success")
            sd = float(x.std(ddof=1)) if x.size > 1 else float("nan")
            sds.append((arm, sd))
    lines.append("Seed SD of final success: " + ", ".join(f"{a} {_fmt(s)}" for a, s in sds) + ".")
    if "protect-a0.1" in results:
        d1, se1 = _paired(results, "protect-a0.1", "never-drop", "success")
        sd = dict(sds)
        noisier = sd.get("protect-a0.1", np.nan) > sd.get("protect-a0.5", np.nan)
        lines.append(
            f"protect a=0.1 − never-drop: {_pm(d1, se1)}; a=0.1 is "
            f"**{'noisier' if noisier else 'not noisier'}** than a=0.5 across seeds "
            f"(an SD from {len(results['protect-a0.1'])} seeds is itself uncertain by about "
            f"{_fmt(100 / np.sqrt(2 * max(len(results['protect-a0.1']) - 1, 1)), 0)}%)."
        )
    lines += [
        "",
        "Depends on: the stale share (the timing parameters and `max_staleness`, as P5), `a`, the "
        "number of seeds, `lr` (the 1/a weights scale the step), `steps`.",
    ]


def _p7(results, cfg: SimConfig, lines: list[str]) -> None:
    lines += [
        "",
        "### P7 offline: per-token advantage variance, turn-reached baseline versus group mean",
        "",
        "Over the trained rollouts of each arm (R = 0 on cap, no std normalization; one token per "
        f"decision; κ = {cfg.kappa:g}). Reduction = 1 − Var(turn-reached) / Var(reference); "
        ">= 20% supports P7, < 10% falsifies it. The group mean includes the rollout's own reward, "
        "which shrinks its advantage by (G−1)/G; the leave-one-out mean is the same-scale unbiased "
        "reference.",
        "",
        "| arm | Var group mean | Var leave-one-out | Var turn-reached | reduction vs group mean | vs LOO | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, runs in results.items():
        v = {k: float(np.mean([r.p7[k] for r in runs])) for k in runs[0].p7}
        red = 1 - v["turn_reached"] / v["group_mean"]
        red_loo = 1 - v["turn_reached"] / v["leave_one_out"]
        word = "supports" if red >= 0.2 else "falsifies" if red < 0.1 else "inconclusive"
        lines.append(
            f"| {arm} | {v['group_mean']:.4f} | {v['leave_one_out']:.4f} | {v['turn_reached']:.4f} "
            f"| {100 * red:.1f}% | {100 * red_loo:.1f}% | {word} |"
        )
    lines += [
        "",
        "Depends on: how much the turns reached tell about the reward (`difficulty`, edit "
        "probabilities, `max_turns`, the policy's give-up logits), `group_size`, `kappa`.",
    ]


def summary_markdown(results, cfg: SimConfig, seeds: Sequence[int]) -> str:
    """The markdown summary: the arms table, then P3, P5, P6, P7 as the runs showed them."""
    n = cfg.steps
    lines = [
        "# rescue sim: summary",
        "",
        f"{len(results)} arms × {len(seeds)} seeds ({', '.join(map(str, seeds))}), {n} steps of "
        f"{cfg.groups_per_step} groups × {cfg.group_size} rollouts, turn cap {cfg.max_turns}, "
        f"K = {cfg.max_staleness}, concurrency {cfg.concurrency} groups. Final window: the last "
        f"{n - final_start(n)} steps. Mean ± SE over seeds; behaviour from all generated rollouts, "
        "b from the trained ones.",
        "",
        *arm_table(results),
        "",
        "## Predictions",
        "",
        "Reported as the runs came out; the simulator's parameters were set before any prediction "
        "was looked at and are not tuned to make one hold.",
    ]
    _p3(results, lines)
    _p5(results, lines)
    _p6(results, lines)
    _p7(results, cfg, lines)
    return "\n".join(lines) + "\n"
