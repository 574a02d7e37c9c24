"""The checks of a trained rehearsal, one function each, on what the run left on disk.

Each takes ``RunFiles`` (everything read once by ``rescue.rehearsal.report``) and returns
``(ok, detail)``; the report names them in ``CHECKS`` order. A check that does not apply to
the arm says so and passes.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

GROUPS = "rollout/census/groups/"
BUCKETS = (
    "trained_fresh",
    "trained_stale",
    "trained_protected",
    "dropped_stale",
    "aborted",
    "filtered",
    "lost",
)
#: Keys ``rescue.miles.train_step`` logs at every optimizer step.
TRAIN_KEYS = ("update_norm", "adv_mean", "adv_var", "adv_tokens")
#: ``train/rescue/sc/*`` under score centering (``rescue.miles.sc_stats``).
SC_KEYS = ("tokens", "head_mass_sampler", "head_mass_trainer", "truncated_frac", "correction_l1")
#: What ``rescue report`` reads from a SWE run (``rescue.judge.quantities``), every arm.
JUDGED = ("success", "cap_hit", "submitted_failure", "turns", "b", "b_realized", "dropped",
          "update_norm")  # fmt: skip
#: Relative tolerance of sums of the same float32 values taken in another order.
REL = 1e-3


@dataclass
class RunFiles:
    """What a finished rehearsal left, read once (``rescue.rehearsal.report.read_run``)."""

    arm: str
    a: float | None
    offpolicy: str
    steps_checked: int
    max_response_len: int
    #: Miles' optimizer steps per rollout (``rollout_batch_size * n_samples_per_prompt //
    #: global_batch_size``; twice that under the matched control).
    steps_per_rollout: int = 1
    history: list[dict[str, Any]] = field(default_factory=list)
    census: list[dict[str, Any]] = field(default_factory=list)
    unused: list[dict[str, Any]] = field(default_factory=list)
    train_data: list[list[dict[str, Any]]] = field(default_factory=list)
    trainer_weights: list[dict[str, Any]] = field(default_factory=list)
    engine_weights: list[dict[str, Any]] = field(default_factory=list)
    reducer: list[dict[str, Any]] = field(default_factory=list)

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        """History rows of Miles' optimizer steps (``train/step``), in step order."""
        rows: dict[int, dict[str, Any]] = defaultdict(dict)
        for row in self.history:
            if "train/step" in row:
                rows[int(row["train/step"])].update(row)
        return [rows[k] for k in sorted(rows)]

    @property
    def matched(self) -> bool:
        return self.arm == "matched"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def trained_steps(f: RunFiles) -> tuple[bool, str]:
    """Miles trained at least ``steps_checked`` steps: weight updates after the first (which
    only carries the initial weights), and as many rollouts' optimizer steps in wandb."""
    trained = max(0, len(f.trainer_weights) - 1)
    logged = len(f.train_rows) // f.steps_per_rollout
    ok = trained >= f.steps_checked and logged >= f.steps_checked
    return ok, (
        f"{trained} steps trained and followed by a weight update, {logged} rollouts' optimizer "
        f"steps logged (need {f.steps_checked})"
    )


def weights(f: RunFiles) -> tuple[bool, str]:
    """Every weight update: the engine received exactly what the trainer sent (digest per
    version), and each update changed the weights."""
    sent = {r["version"]: r["digest"] for r in f.trainer_weights}
    got = {r["version"]: r["digest"] for r in f.engine_weights}
    if not sent:
        return False, "no weight update was recorded on the trainer's side"
    differ = [v for v in sent if got.get(v) != sent[v]]
    if differ:
        return False, f"versions {differ}: the engine's digest differs from the trainer's"
    order = sorted(sent, key=int)
    same = [b for a, b in itertools.pairwise(order) if sent[a] == sent[b]]
    if same:
        return False, f"versions {same}: the weights equal the previous version's"
    return True, (
        f"versions {order[0]}..{order[-1]}: the engine received the trainer's weights "
        "(SHA-256 equal), and each update changed them"
    )


def finite(f: RunFiles) -> tuple[bool, str]:
    """Every optimizer step's ``train/*`` values are finite, with rescue's keys (and under
    score centering ``train/rescue/sc/*``, a head at every trained token)."""
    rows = f.train_rows
    if not rows:
        return False, "no optimizer step in the wandb history"
    want = [f"train/rescue/{k}" for k in TRAIN_KEYS]
    if f.offpolicy == "tis-sc":
        want += [f"train/rescue/sc/{k}" for k in SC_KEYS]
    missing = sorted({k for row in rows for k in want if k not in row})
    if missing:
        return False, f"optimizer steps without {', '.join(missing)}"
    bad = sorted(
        {k for row in rows for k, v in row.items() if k.startswith("train/") and not _finite(v)}
    )
    if bad:
        return False, f"not finite: {', '.join(bad)}"
    if f.offpolicy == "tis-sc":
        short = [
            int(r["train/step"])
            for r in rows
            if r["train/rescue/sc/tokens"] != r["train/rescue/adv_tokens"]
        ]
        if short:
            return False, f"steps {short}: fewer score-centering heads than trained tokens"
    extra = (
        " and train/rescue/sc/*, a head at every trained token" if f.offpolicy == "tis-sc" else ""
    )
    return True, f"{len(rows)} optimizer steps: train/* finite, train/rescue/* logged{extra}"


def census(f: RunFiles) -> tuple[bool, str]:
    """Exact conservation at every census flush (the last one included): groups entered
    so far = groups settled in a bucket so far + groups buffered."""
    if not f.census:
        return False, "the buffer handed Miles no census"
    entered = settled = 0.0
    broken = []
    for row in f.census:
        g = row["groups"]
        entered += g.get(GROUPS + "entered", 0.0)
        settled += sum(g.get(GROUPS + b, 0.0) for b in BUCKETS)
        if entered != settled + g.get(GROUPS + "buffered", 0.0):
            broken.append(row["flush"])
    if broken:
        return False, f"conservation broken at census flushes {broken}"
    return True, f"{len(f.census)} census flushes, conservation exact in each"


def unused(f: RunFiles) -> tuple[bool, str]:
    """Every group Miles' unused handler received is one the census counted dropped stale
    or aborted in the same step, and every such group reached it."""
    received = Counter(int(r["flush"]) for r in f.unused)
    counted = {
        int(r["flush"]): int(
            r["groups"].get(GROUPS + "dropped_stale", 0) + r["groups"].get(GROUPS + "aborted", 0)
        )
        for r in f.census
    }
    wrong = [
        (s, received.get(s, 0), counted[s])
        for s in sorted(counted)
        if received.get(s, 0) != counted[s]
    ]
    after = sum(n for s, n in received.items() if s not in counted)
    if wrong:
        s, got, want = wrong[0]
        return False, (
            f"census flush {s}: the unused handler received {got} groups, the census counted "
            f"{want} dropped stale or aborted"
        )
    return True, (
        f"{sum(counted.values())} dropped-stale or aborted groups, each received by the unused "
        f"handler in its step ({after} more after the last census, in flight at the end)"
    )


def _totals(f: RunFiles) -> dict[str, float]:
    return {b: sum(r["groups"].get(GROUPS + b, 0.0) for r in f.census) for b in BUCKETS}


def stale(f: RunFiles) -> tuple[bool, str]:
    """Stale groups happened, each handled as the arm says: drop drops them, never-drop (and
    the budget arms, which run never-drop) trains them, protect keeps some with weight 1/a
    and drops the rest; pace trains nothing past K."""
    t = _totals(f)
    dropped, trained, protected = t["dropped_stale"], t["trained_stale"], t["trained_protected"]
    summary = f"{dropped:.0f} dropped, {trained:.0f} trained stale, {protected:.0f} protected"
    if f.arm == "pace":
        ok = dropped == 0 and trained == 0 and protected == 0
        return ok, f"pace: no group past K ({summary})"
    if f.arm == "drop":
        ok = dropped > 0 and trained == 0 and protected == 0
    elif f.arm == "protect":
        ok = dropped > 0 and protected > 0 and trained == 0
    else:
        ok = trained > 0 and dropped == 0 and protected == 0
    return ok, f"{f.arm}: {summary}"


def protect(f: RunFiles) -> tuple[bool, str]:
    """Protect: protected samples trained with weight 1/a, every reward after the hook equal
    to its weight times its group's advantage; any other arm: no sample carries a weight."""
    train = [s for step in f.train_data for s in step]
    weighted = [s for s in train if s.get("rescue_weight") not in (None, 1, 1.0)]
    if f.arm != "protect":
        return not weighted, (
            "no sample carries a weight" if not weighted else f"{len(weighted)} weighted samples"
        )
    import numpy as np

    from rescue.advantages import group_advantages

    a = f.a or 0.5
    wrong_weight = [s for s in weighted if abs(float(s["rescue_weight"]) - 1 / a) > 1e-9]
    off = 0
    for step in f.train_data:
        if not step:
            continue
        raw = np.array([s["raw_reward"] for s in step], dtype=float)
        ids = np.array([s["group_index"] for s in step])
        w = np.array([float(s.get("rescue_weight") or 1.0) for s in step])
        expected = group_advantages(raw, ids) * w
        got = np.array([s["reward"] for s in step], dtype=float)
        off += int(np.sum(np.abs(expected - got) > 1e-4 * np.maximum(1.0, np.abs(expected))))
    if not weighted:
        return False, "no protected sample was trained"
    if wrong_weight:
        return False, f"{len(wrong_weight)} protected samples with a weight other than 1/a"
    if off:
        return False, f"{off} samples whose trained reward is not weight x group advantage"
    return True, (
        f"{len(weighted)} protected samples trained with weight 1/a = {1 / a:g}, each reward "
        "= weight x its group's advantage"
    )


def advantages(f: RunFiles) -> tuple[bool, str]:
    """The loss trained exactly the train data's advantages: per rollout, the sum over the
    trained tokens the loss recorded (``adv_mean x adv_tokens`` of its optimizer steps)
    equals the sum in Miles' train data (each sample's reward on each trained token, plus
    the turn channel), so a loss that ignores the channel fails here. Rollouts whose every
    optimizer step is in the wandb history are compared (Miles can lose the last one's row
    at exit); at least ``steps_checked`` of them."""
    per = f.steps_per_rollout
    copies = 2 if f.matched else 1
    by_rollout: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in f.train_rows:
        by_rollout[int(row["train/step"]) // per].append(row)
    compared, channel = 0, 0.0
    for r in range(len(f.train_data) // copies):
        steps = by_rollout.get(r, [])
        if len(steps) != per:
            continue
        data = [s for c in f.train_data[r * copies : (r + 1) * copies] for s in c]
        want = sum(s["reward"] * s["loss_mask_sum"] + s.get("channel_sum", 0.0) for s in data)
        channel += sum(abs(s.get("channel_sum", 0.0)) for s in data)
        got = sum(s["train/rescue/adv_mean"] * s["train/rescue/adv_tokens"] for s in steps)
        tokens = sum(s["train/rescue/adv_tokens"] for s in steps)
        want_tokens = sum(s["loss_mask_sum"] for s in data)
        if tokens != want_tokens or abs(got - want) > REL * max(1.0, abs(want)):
            return False, (
                f"rollout {r}: advantage sum trained {got:.4g} over {tokens:.0f} tokens, "
                f"train data {want:.4g} over {want_tokens} tokens"
            )
        compared += 1
    if compared < f.steps_checked:
        return False, (
            f"{compared} rollouts with every optimizer step logged and their train data "
            f"(need {f.steps_checked})"
        )
    if f.arm == "turn" and channel == 0:
        return False, "the turn arm's per-token channel is zero on every trained token"
    what = " (the turn channel included)" if f.arm == "turn" else ""
    return True, f"{compared} rollouts: the loss trained the train data's advantage sum{what}"


def matched(f: RunFiles) -> tuple[bool, str]:
    """Matched control: each rollout's step taken on two copies, copy A measured and not
    applied (update norm 0), copy B applied at copy A's update norm."""
    if not f.matched:
        return True, "does not apply to this arm"
    rows = f.train_rows
    copies = [r.get("train/rescue/matched_copy") for r in rows]
    if (
        not rows
        or copies[0::2] != [0] * len(copies[0::2])
        or copies[1::2] != [1] * len(copies[1::2])
    ):
        return False, f"optimizer steps' copies {copies}: expected 0, 1 alternating"
    for a, b in zip(rows[0::2], rows[1::2], strict=False):
        if a["train/rescue/update_norm"] != 0:
            return False, f"step {a['train/step']:.0f}: copy A's update was applied"
        ref, got = b["train/rescue/update_norm_ref"], b["train/rescue/update_norm"]
        if abs(got - ref) > REL * max(ref, 1e-12):
            return False, f"step {b['train/step']:.0f}: update norm {got:.4g}, copy A's {ref:.4g}"
    return True, f"{len(rows) // 2} rollouts: copy A measured, copy B applied at its update norm"


def drgrpo(f: RunFiles) -> tuple[bool, str]:
    """Dr. GRPO: the loss's reducer divided every micro-batch's token sum by the constant
    divisor (``--rollout-max-response-len``), not by the rollouts' token counts."""
    if f.arm != "drgrpo-mask":
        return (not f.reducer), (
            "does not apply to this arm" if not f.reducer else "Dr. GRPO's reducer ran"
        )
    if not f.reducer:
        return False, "Dr. GRPO's reducer never ran"
    d = float(f.max_response_len)
    off = [
        r
        for r in f.reducer
        if r["divisor"] != d or abs(r["ones"] * d - r["tokens"]) > REL * r["tokens"]
    ]
    if off:
        r = off[0]
        return False, (
            f"reducer of all-ones {r['ones']:.4g} over {r['tokens']:.0f} tokens: divisor "
            f"{r['tokens'] / r['ones'] if r['ones'] else math.inf:.4g}, not {d:g}"
        )
    return True, f"{len(f.reducer)} micro-batches reduced by the constant divisor {d:g}"


def judged_keys(f: RunFiles) -> tuple[bool, str]:
    """The wandb run holds every key ``rescue report`` reads for a SWE run."""
    from rescue.judge.quantities import QUANTITIES, MissingKey
    from rescue.judge.runs import Condition, Run

    run = Run(Condition(family="swe", arm=f.arm), 0, f.history)
    missing = []
    for name in JUDGED:
        try:
            QUANTITIES[name].source(run)
        except MissingKey as e:
            missing.append(f"{name} ({e})")
    if missing:
        return False, "rescue report cannot read: " + "; ".join(missing)
    return True, f"the wandb run holds what rescue report reads ({', '.join(JUDGED)})"
