"""``rescue oracle compare``: each arm's gradient against the all-groups gradient.

Specification
-------------
Input: an oracle directory (``rescue.oracle.manifest``) and, for every entry, either its
captured gradient shards (``gradients/{rollout_id}/*.pt``: ``{name: tensor}`` per shard, from
``rescue.miles.oracle`` or ``rescue replay gradients --trained``) or its streamed inner
products (``stats/{rollout_id}.json``). ``--gradients DIR`` reads the shards from ``DIR``
instead; without it the streamed statistics are used when ``stats/`` exists.

Per step, the Gram matrix ``G[i, j] = <g_i, g_j>`` of its arms (float64; over shards the
products add, since each parameter is counted once by the capture) gives, for each arm
``k`` other than ``all``:

``cos_all``              ``<g_k, g_all> / (‖g_k‖ ‖g_all‖)``;
``norm_ratio``           ``‖g_k‖ / ‖g_all‖`` (same rollouts and denominators in every arm);
``norm_ratio_refilled``  ``norm_ratio · rollouts / trained_rollouts``: the ratio had the arm
                         refilled its batch with rollouts like those it kept (Miles' drop
                         arm trains a full batch of fresh groups);

and, for drop, with ``d = g_all − g_drop`` (what the excluded groups took away):

``difference_ratio``     ``‖d‖ / ‖g_all‖``;
``cos_stale``            ``<d, g_stale> / (‖d‖ ‖g_stale‖)`` (needs the ``stale`` arm);
``explained``            ``1 − ‖d − g_stale‖² / ‖d‖²``: the share of the difference the
                         dropped groups' own gradient explains (1 up to rounding: Miles'
                         loss is linear in the groups at fixed denominators, so a value
                         below 1 says the replay was not deterministic or not linear).

``total`` is the same computed on the per-step gradients stacked into one vector (the
step Grams summed). Output: a JSON report and a markdown table (one row per step, then the
total), written as ``compare.json`` and ``compare.md`` in the oracle directory.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rescue.errors import InputError
from rescue.oracle.manifest import GRADIENTS, STATS, Entry, Manifest, stats_path
from rescue.output import write_text

#: Format tag of the report.
FORMAT = "rescue-oracle-compare/1"
#: Elements per block when gradients are multiplied (bounds the memory of one product).
BLOCK = 1 << 22


def _shards(grad_dir: str, entry: Entry) -> dict[str, str]:
    files = sorted(glob.glob(os.path.join(grad_dir, str(entry.rollout_id), "*.pt")))
    if not files:
        raise InputError(
            f"no gradient of replay rollout {entry.rollout_id} ({entry.arm}, step {entry.step}) "
            f"in {os.path.join(grad_dir, str(entry.rollout_id))}/: capture it "
            "(RESCUE_ORACLE_DIR replay) or compute it (rescue replay gradients --trained)"
        )
    return {os.path.basename(f)[:-3]: f for f in files}


def gram_from_gradients(entries: Sequence[Entry], grad_dir: str) -> np.ndarray:
    """The Gram matrix of the entries' gradient files (float64, in blocks of ``BLOCK``)."""
    import torch

    shards = [_shards(grad_dir, e) for e in entries]
    names = set(shards[0])
    for e, s in zip(entries, shards, strict=True):
        if set(s) != names:
            raise InputError(
                f"replay rollout {e.rollout_id} has gradient shards {sorted(s)}, replay rollout "
                f"{entries[0].rollout_id} {sorted(names)}: capture every arm with one layout"
            )
    n = len(entries)
    G = np.zeros((n, n))
    for shard in sorted(names):
        tensors = [
            torch.load(s[shard], map_location="cpu", weights_only=True, mmap=True) for s in shards
        ]
        keys = set(tensors[0])
        for e, t in zip(entries, tensors, strict=True):
            if set(t) != keys:
                raise InputError(
                    f"shard {shard} of replay rollout {e.rollout_id} names other parameters "
                    f"than that of replay rollout {entries[0].rollout_id}"
                )
        for key in sorted(keys):
            flats = [t[key].reshape(-1) for t in tensors]
            size = flats[0].numel()
            if any(f.numel() != size for f in flats):
                raise InputError(f"parameter {key} of shard {shard} differs in size between arms")
            for lo in range(0, size, BLOCK):
                M = torch.stack([f[lo : lo + BLOCK].double() for f in flats])
                G += (M @ M.T).numpy()
    return G


def gram_from_stats(entries: Sequence[Entry], directory: str) -> np.ndarray:
    """The Gram matrix from streamed statistics (each entry: its norm² and its products with
    the step's earlier entries)."""
    n = len(entries)
    G = np.zeros((n, n))
    for j, e in enumerate(entries):
        path = stats_path(directory, e.rollout_id)
        if not os.path.isfile(path):
            raise InputError(
                f"no streamed statistics of replay rollout {e.rollout_id} ({e.arm}, step "
                f"{e.step}): {path} is missing"
            )
        with open(path) as f:
            data = json.load(f)
        G[j, j] = float(data["sq_norm"])
        for i in range(j):
            key = str(entries[i].rollout_id)
            if key not in data["dots"]:
                raise InputError(f"{path}: no inner product with replay rollout {key}")
            G[i, j] = G[j, i] = float(data["dots"][key])
    return G


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def metrics(
    G: np.ndarray, arms: Sequence[str], scale: Sequence[float] | None = None
) -> dict[str, Any]:
    """Cosines, norm ratios and the drop difference from one Gram matrix (module docstring).

    ``scale[k]``: ``rollouts / trained_rollouts`` of arm ``k`` (for ``norm_ratio_refilled``;
    a scaled total passes the ratio of the scaled norms instead, in ``scale`` as None).
    """
    index = {a: i for i, a in enumerate(arms)}
    r = index["all"]
    norm_all = math.sqrt(max(G[r, r], 0.0))
    out: dict[str, Any] = {"norm_all": norm_all, "arms": {}}
    for arm, k in index.items():
        if arm == "all":
            continue
        nk = math.sqrt(max(G[k, k], 0.0))
        entry = {
            "norm": nk,
            "cos_all": _ratio(G[k, r], nk * norm_all),
            "norm_ratio": _ratio(nk, norm_all),
        }
        if scale is not None:
            entry["norm_ratio_refilled"] = entry["norm_ratio"] * scale[k]
        out["arms"][arm] = entry
    if "drop" in index:
        d = index["drop"]
        dd = max(G[r, r] - 2 * G[r, d] + G[d, d], 0.0)
        drop: dict[str, Any] = {"difference_ratio": _ratio(math.sqrt(dd), norm_all)}
        if "stale" in index:
            s = index["stale"]
            ds = G[r, s] - G[d, s]
            resid = max(dd - 2 * ds + G[s, s], 0.0)
            drop["cos_stale"] = _ratio(ds, math.sqrt(dd * max(G[s, s], 0.0)))
            drop["explained"] = 1.0 - resid / dd if dd > 0 else math.nan
        out["drop"] = drop
    return out


def compare(directory: str, gradients: str | None = None) -> dict[str, Any]:
    """The comparison report of an oracle directory (module docstring)."""
    manifest = Manifest.read(directory)
    use_stats = gradients is None and os.path.isdir(os.path.join(directory, STATS))
    grad_dir = gradients or os.path.join(directory, GRADIENTS)
    steps, total, total_scaled = [], None, None
    arms = manifest.arms
    for step in manifest.steps():
        entries = manifest.of_step(step)
        if [e.arm for e in entries] != arms:
            raise InputError(f"step {step} has arms {[e.arm for e in entries]}, not {arms}")
        G = (
            gram_from_stats(entries, directory)
            if use_stats
            else gram_from_gradients(entries, grad_dir)
        )
        scale = [_ratio(e.rollouts, e.trained_rollouts) for e in entries]
        row = {
            "step": step,
            "rollouts": entries[0].rollouts,
            "groups": entries[0].groups,
            "stale_groups": entries[0].stale_groups,
            **metrics(G, arms, scale),
        }
        steps.append(row)
        S = np.outer(scale, scale)
        total = G if total is None else total + G
        total_scaled = G * S if total_scaled is None else total_scaled + G * S
    report: dict[str, Any] = {
        "format": FORMAT,
        "directory": directory,
        "source": "stats" if use_stats else grad_dir,
        "arms": arms,
        "steps": steps,
    }
    if total is not None:
        t = metrics(total, arms)
        r = arms.index("all")
        for arm, k in ((a, i) for i, a in enumerate(arms) if a != "all"):
            # the refilled arm's stacked norm over the all-groups stacked norm
            t["arms"][arm]["norm_ratio_refilled"] = _ratio(
                math.sqrt(max(total_scaled[k, k], 0.0)), math.sqrt(max(total[r, r], 0.0))
            )
        report["total"] = {"steps": len(steps), **t}
    return report


def _fmt(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table: one row per step, then the total."""
    others = [a for a in report["arms"] if a != "all"]
    head = ["step", "stale / groups"]
    for arm in others:
        head += [f"cos({arm}, all)", f"‖{arm}‖/‖all‖"]
    has_drop = "drop" in report["arms"]
    if has_drop:
        head += ["‖all − drop‖/‖all‖"]
        if "stale" in report["arms"]:
            head += ["explained by the dropped groups"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, counts: str, m: dict[str, Any]) -> str:
        cells = [label, counts]
        for arm in others:
            cells += [_fmt(m["arms"][arm]["cos_all"]), _fmt(m["arms"][arm]["norm_ratio"])]
        if has_drop:
            cells.append(_fmt(m["drop"]["difference_ratio"]))
            if "stale" in report["arms"]:
                cells.append(_fmt(m["drop"].get("explained")))
        return "| " + " | ".join(cells) + " |"

    for s in report["steps"]:
        lines.append(row(str(s["step"]), f"{s['stale_groups']} / {s['groups']}", s))
    if "total" in report:
        stale = sum(s["stale_groups"] for s in report["steps"])
        groups = sum(s["groups"] for s in report["steps"])
        lines.append(row("**total**", f"{stale} / {groups}", report["total"]))
    lines.append("")
    lines.append(
        "Norm ratios at equal denominators (masked rollouts count, as in Miles); "
        "`norm_ratio_refilled` in compare.json rescales by rollouts / trained rollouts."
    )
    return "\n".join(lines)


def write(report: dict[str, Any], directory: str) -> tuple[str, str]:
    """``compare.json`` and ``compare.md`` in the oracle directory; their paths."""
    paths = (os.path.join(directory, "compare.json"), os.path.join(directory, "compare.md"))
    text = json.dumps(report, indent=1, default=float), markdown(report) + "\n"
    for path, content in zip(paths, text, strict=True):  # each replaced whole, or not at all
        write_text(path, content)
    return paths
