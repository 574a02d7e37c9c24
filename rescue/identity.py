"""Exact enumeration of the masked-update identity on a finite table of trajectories.

Specification
-------------
A table lists trajectories ``k`` (rows). The policy is a softmax over actions with logits
``θ``; row ``k`` takes action ``a_k`` and then happens with environment probability
``q_k`` (independent of ``θ``; the ``q`` of one action sum to 1). Each row has a reward
``R_k`` and a keep probability ``κ_k`` (0/1 for a deterministic mask, in (0, 1) for a
randomized one such as a staleness drop). Everything is exact, no sampling::

    π_k      = softmax(θ)[a_k] · q_k                 probability of the row
    s_k      = ∇θ log π_k = e_{a_k} − softmax(θ)      score (exact)
    J        = Σ π R                                  ∇J = Σ π R s
    P(X)     = Σ π κ                                  inclusion X: the row is kept
    masked(b)= Σ π κ (R − b) s                        what a trainer's masked loss follows
    b        = J                                      all-members baseline (masked rows vote)
    b_S      = Σ π κ R / P(X)                         survivors' baseline
    survivor = masked(b_S) / P(X)                     mean over kept samples, as a trainer
                                                      computes it (large-group limit)
    IPW      = Σ π κ (1/κ)(R − b) s = ∇J              needs κ > 0 wherever π > 0

The identity: ``masked(b) = ∇E[R·1{X}] − b·∇P(X)``; when excluded rows score 0
(``R_k = 0`` wherever ``κ_k < 1``) this is ``∇J + b·∇P(¬X)``: masking pays the excluded
trajectory the baseline ``b``. A row with ``κ = 0`` and mass ``π > 0`` can never be seen,
so no reweighting repairs it: ``ipw_estimate`` refuses such a table (ValueError), and the
report prints the reason instead of a number.

Table file (``rescue identity --table FILE``): JSON, one table or a list of tables (one per
prompt, each with its own ``θ``)::

    {"name": "my table",                       optional
     "actions": ["fast", "thorough"],          optional names, default "0", "1", ...
     "theta": [0.0, 0.0],                      logits, one per action
     "rows": [{"action": "fast", "q": 0.6, "reward": 1, "keep": 1, "name": "fast solves"},
              ...]}                            action: a name (string) or an index
                                               (integer); q default 1;
                                               keep default 1; name optional
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rescue.errors import InputError


def _number(row: dict, field: str, k: int, default: float | None = None) -> float:
    try:
        return float(row.get(field, default))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"rows[{k}].{field}={row.get(field)!r} is not a number") from None


@dataclass(frozen=True)
class Table:
    """A finite set of trajectories under a softmax policy (see the module docstring)."""

    theta: np.ndarray  # [A] logits
    action: np.ndarray  # [K] action index of each row
    q: np.ndarray  # [K] environment probability of the row given its action
    reward: np.ndarray  # [K]
    keep: np.ndarray  # [K] keep probability κ
    actions: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()
    name: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> Table:
        """Build and validate a table from the JSON form of the module docstring."""
        if not isinstance(d, dict) or "theta" not in d or "rows" not in d:
            raise InputError('a table needs "theta" (logits) and "rows"')
        theta = np.asarray(d["theta"], dtype=np.float64).reshape(-1)
        names = tuple(str(a) for a in d.get("actions", range(theta.size)))
        if len(names) != theta.size:
            raise InputError(f'"actions" has {len(names)} names; "theta" has {theta.size} logits')
        act, q, r, keep, rows = [], [], [], [], []
        for k, row in enumerate(d["rows"]):
            if not isinstance(row, dict):
                raise InputError(f"rows[{k}] must be an object with action, q, reward, keep")
            a = row.get("action", k)
            # An integer is an index, a string a name: never the one read as the other.
            idx = names.index(a) if isinstance(a, str) and a in names else a
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < theta.size:
                raise InputError(
                    f"rows[{k}].action={a!r}; allowed: {', '.join(names)} or 0..{theta.size - 1}"
                )
            if "reward" not in row:
                raise InputError(f'rows[{k}] needs "reward"')
            act.append(idx)
            q.append(_number(row, "q", k, 1.0))
            r.append(_number(row, "reward", k))
            keep.append(_number(row, "keep", k, 1.0))
            rows.append(str(row.get("name", f"row {k}")))
        t = cls(
            theta=theta,
            action=np.array(act, dtype=np.int64),
            q=np.array(q),
            reward=np.array(r),
            keep=np.array(keep),
            actions=names,
            rows=tuple(rows),
            name=str(d.get("name", "")),
        )
        t.validate()
        return t

    def validate(self) -> None:
        K = self.action.shape[0]
        if K == 0:
            raise InputError("a table needs at least one row")
        for field in ("theta", "q", "reward", "keep"):
            x = getattr(self, field)
            if not np.all(np.isfinite(x)):
                raise InputError(
                    f"{field}[{int(np.flatnonzero(~np.isfinite(x))[0])}] is not finite"
                )
        for field in ("q", "keep"):
            x = getattr(self, field)
            if x.shape != (K,) or ((x < 0) | (x > 1)).any():
                raise InputError(f"{field} must be one probability in [0, 1] per row")
        total = np.bincount(self.action, weights=self.q, minlength=self.theta.size)
        for a, t in enumerate(total):
            if abs(t - 1.0) > 1e-9:
                raise InputError(
                    f"the rows of action {self.label(a)!r} have q summing to {t:.6g}; need 1"
                )

    def label(self, a: int) -> str:
        return self.actions[a] if self.actions else str(a)

    # --- the quantities, in the order of the module docstring ---
    def policy(self) -> np.ndarray:
        z = np.exp(self.theta - self.theta.max())
        return z / z.sum()

    def probability(self) -> np.ndarray:
        """π_k = softmax(θ)[a_k] · q_k."""
        return self.policy()[self.action] * self.q

    def score(self) -> np.ndarray:
        """s_k = e_{a_k} − softmax(θ), shape [K, A]."""
        return np.eye(self.theta.size)[self.action] - self.policy()


def _expect(t: Table, f: np.ndarray) -> np.ndarray:
    """Σ_k π_k f_k s_k: the exact expectation of f times the score."""
    return (t.probability() * f) @ t.score()


def objective(t: Table) -> float:
    """J = Σ π R."""
    return float(t.probability() @ t.reward)


def gradient(t: Table) -> np.ndarray:
    """∇J = Σ π R s."""
    return _expect(t, t.reward)


def kept_mass(t: Table) -> float:
    """P(X) = Σ π κ."""
    return float(t.probability() @ t.keep)


def survivors_baseline(t: Table) -> float:
    """b_S = Σ π κ R / P(X); 0 when nothing is kept (no survivor, no signal)."""
    p = t.probability() * t.keep
    total = p.sum()
    return float((p * t.reward).sum() / total) if total > 0 else 0.0


def masked_update(t: Table, baseline: str = "all") -> np.ndarray:
    """Σ π κ (R − b) s with b = J (``"all"``, default) or b = b_S (``"survivors"``)."""
    if baseline not in ("all", "survivors"):
        raise InputError(f"baseline={baseline!r}; allowed: all, survivors")
    b = objective(t) if baseline == "all" else survivors_baseline(t)
    return _expect(t, t.keep * (t.reward - b))


def survivor_estimate(t: Table) -> np.ndarray:
    """Mean over kept samples of (R − mean of kept R)·s: masked(b_S) / P(X); 0 if none kept."""
    P = kept_mass(t)
    return masked_update(t, "survivors") / P if P > 0 else np.zeros_like(t.theta)


def ipw_estimate(t: Table) -> np.ndarray:
    """Σ π κ (1/κ)(R − J) s. Refuses a row with κ = 0 and mass π > 0 (ValueError)."""
    pi = t.probability()
    unseen = np.flatnonzero((t.keep == 0) & (pi > 0))
    if unseen.size:
        k = int(unseen[0])
        raise InputError(
            f"row {t.rows[k] if t.rows else k!r} has keep probability 0 and mass {pi[k]:.4g}: "
            "it is never seen, so no inverse-probability weight can restore it"
        )
    # kept with probability κ, weighted 1/κ: in expectation κ·(1/κ), computed as κ/κ
    seen = np.divide(t.keep, t.keep, out=np.zeros_like(t.keep), where=t.keep > 0)
    return _expect(t, seen * (t.reward - objective(t)))


def report(t: Table) -> dict:
    """Every quantity of the module docstring, plus the identity's residuals."""
    J = b = objective(t)
    grad_P = _expect(t, t.keep)  # ∇P(X)
    m_all = masked_update(t, "all")
    out = {
        "name": t.name,
        "actions": [t.label(a) for a in range(t.theta.size)],
        "theta": t.theta.tolist(),
        "J": J,
        "P_kept": kept_mass(t),
        "b_all": b,
        "b_survivors": survivors_baseline(t),
        "grad_J": gradient(t).tolist(),
        "masked_all": m_all.tolist(),
        "masked_survivors": masked_update(t, "survivors").tolist(),
        "survivor_estimate": survivor_estimate(t).tolist(),
        # masked(b) − [∇E[R·1{X}] − b·∇P(X)]: zero on every table
        "identity_residual": float(
            np.abs(m_all - (_expect(t, t.keep * t.reward) - b * grad_P)).max()
        ),
    }
    try:
        out["ipw"], out["ipw_error"] = ipw_estimate(t).tolist(), None
    except ValueError as e:
        out["ipw"], out["ipw_error"] = None, str(e)
    if np.all(t.reward[t.keep < 1] == 0):  # excluded rows score 0: masked = ∇J + b·∇P(¬X)
        out["excluded_pays_b_residual"] = float(np.abs(m_all - (gradient(t) - b * grad_P)).max())
    if np.array_equal(t.keep, t.reward) and np.isin(t.reward, (0, 1)).all():  # solved or capped
        out["two_outcome_residual"] = float(np.abs(m_all - (1 - J) * gradient(t)).max())
    return out


# ---------------------------------------------------------------- the worked examples


def two_outcome() -> list[Table]:
    """Solved (R = 1, kept) or capped (R = 0, loss-masked: κ = 0), over three prompts.

    Each trajectory is its own action. Per prompt ``masked(b = J_x) = (1 − J_x)·∇J_x``
    and the survivors' variant is exactly 0 (every survivor scores 1 = b_S).
    """
    prompts = {
        "easy": ([1.0, 0.0, -0.5, 0.3], "SSCS"),
        "medium": ([0.2, -0.4, 0.7], "SCC"),
        "hard": ([0.0, 0.5, -1.0, 0.25], "CCSC"),
    }
    tables = []
    for name, (theta, outcomes) in prompts.items():
        rows = [
            {"action": k, "reward": float(o == "S"), "keep": float(o == "S"),
             "name": f"τ{k} {'solved' if o == 'S' else 'capped'}"}
            for k, o in enumerate(outcomes)
        ]  # fmt: skip
        tables.append(Table.from_dict({"name": name, "theta": theta, "rows": rows}))
    return tables


def fast_thorough(theta: float = 0.0, keep_late: float = 0.1) -> Table:
    """Fast/Thorough: ``p = sigmoid(θ)`` is the probability of Thorough (Fast's logit is 0).

    Fast solves 60%, Thorough 90%. Fast's outcomes and Thorough's failures finish early and
    are always kept; Thorough's successes finish late and survive the staleness drop with
    probability ``keep_late`` (default 0.1). At θ = 0: ∇J = +0.075, survivor estimate
    −0.017, IPW +0.075 (the ∂/∂θ_thorough column).
    """
    rows = [
        {"action": a, "q": q, "reward": r, "keep": k, "name": name}
        for a, q, r, k, name in [
            ("fast", 0.6, 1, 1, "fast solves"),
            ("fast", 0.4, 0, 1, "fast fails"),
            ("thorough", 0.9, 1, keep_late, "thorough solves (late)"),
            ("thorough", 0.1, 0, 1, "thorough fails"),
        ]
    ]
    actions = ["fast", "thorough"]
    return Table.from_dict(
        {"name": "fast-thorough", "actions": actions, "theta": [0.0, theta], "rows": rows}
    )


#: name -> (tables, one-line description): the commands ``rescue identity NAME``
EXAMPLES = {
    "two-outcome": (
        two_outcome,
        "solved or capped over three prompts: masked(all) = (1 − J)∇J, survivors' = 0",
    ),
    "fast-thorough": (
        lambda: [fast_thorough()],
        "a randomized staleness drop flips the survivor estimate's sign; IPW repairs it",
    ),
}


def load_tables(path: str) -> list[Table]:
    """Tables from a JSON file: one table object or a list of them (module docstring)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--table {path}: {e}") from None
    items = data if isinstance(data, list) else [data]
    tables = []
    for i, d in enumerate(items):
        try:
            tables.append(Table.from_dict(d))
        except ValueError as e:
            raise InputError(f"--table {path}, table {i}: {e}") from None
    return tables


# ---------------------------------------------------------------- rendering and the CLI


def _vec(v: Sequence[float]) -> str:
    return "".join(f"{x:>+16.4f}" for x in v)


def render(t: Table, r: dict) -> str:
    pi = t.probability()
    lines = [
        f"== {r['name'] or 'table'}",
        f"{'row':<26}{'action':>10}{'P(row)':>9}{'R':>8}{'keep κ':>9}",
    ]
    for k in range(t.action.size):
        lines.append(f"{t.rows[k]:<26}{t.label(int(t.action[k])):>10}{pi[k]:>9.4f}"
                     f"{t.reward[k]:>8.3f}{t.keep[k]:>9.3f}")  # fmt: skip
    lines.append(
        f"J = {r['J']:.4f}   P(kept) = {r['P_kept']:.4f}   b = J = {r['b_all']:.4f}   "
        f"b_S = {r['b_survivors']:.4f}"
    )
    lines.append(f"{'':<34}" + "".join(f"{'∂/∂θ_' + a:>16}" for a in r["actions"]))
    rows = [
        ("true gradient ∇J", r["grad_J"]),
        ("masked, all-members b = J", r["masked_all"]),
        ("masked, survivors' b_S", r["masked_survivors"]),
        ("survivor estimate (trainer)", r["survivor_estimate"]),
        ("IPW estimate", r["ipw"]),
    ]
    for label, v in rows:
        lines.append(f"{label:<34}" + (_vec(v) if v is not None else "   undefined"))
    if r["ipw_error"]:
        lines.append(f"  IPW refused: {r['ipw_error']}")
    lines.append(
        f"identity masked(b) = ∇E[R·1{{X}}] − b·∇P(X): max residual {r['identity_residual']:.1e}"
    )
    if "excluded_pays_b_residual" in r:
        lines.append(
            f"excluded rows score 0, so masked(b) = ∇J + b·∇P(¬X): max residual {r['excluded_pays_b_residual']:.1e}"
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "example",
        nargs="?",
        choices=list(EXAMPLES),
        help="a worked example: "
        + "; ".join(f"{k}: {v}" for k, (_, v) in EXAMPLES.items())
        + " (default: both)",
    )
    parser.add_argument(
        "--table",
        metavar="FILE",
        help="a JSON table, or a list of tables (one per prompt), instead of the examples; "
        "format in the rescue.identity module docstring (default: none)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of tables (default: off)"
    )


def main(args: argparse.Namespace) -> int:
    if args.table and args.example:
        raise InputError("give either an example name or --table FILE, not both")
    if args.table:
        sections = {args.table: load_tables(args.table)}
    else:
        names = [args.example] if args.example else list(EXAMPLES)
        sections = {n: EXAMPLES[n][0]() for n in names}
    result = {}
    for name, tables in sections.items():
        entry: dict = {"tables": [report(t) for t in tables]}
        if name == "fast-thorough":
            entry["d_dtheta"] = {
                k: entry["tables"][0][k][1] for k in ("grad_J", "survivor_estimate", "ipw")
            }
        result[name] = entry
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, entry in result.items():
        print(f"#### {name}: {EXAMPLES[name][1] if name in EXAMPLES else 'table from file'}\n")
        for t, r in zip(sections[name], entry["tables"], strict=True):
            print(render(t, r) + "\n")
        if name == "two-outcome":
            print(
                f"{'prompt':<10}{'J_x':>8}{'max|masked(all) − (1−J_x)∇J_x|':>34}{'max|masked(b_S)|':>19}"
            )
            for r in entry["tables"]:
                print(f"{r['name']:<10}{r['J']:>8.4f}{r['two_outcome_residual']:>34.1e}"
                      f"{np.abs(r['masked_survivors']).max():>19.1e}")  # fmt: skip
            print()
        if "d_dtheta" in entry:
            d, p = entry["d_dtheta"], sections[name][0].policy()[1]
            print(
                f"d/dθ (θ = Thorough's logit, p = sigmoid(θ) = {p:.3f}): ∇J = {d['grad_J']:+.3f}, "
                f"survivor estimate = {d['survivor_estimate']:+.3f}, IPW = {d['ipw']:+.3f}\n"
            )
    return 0
