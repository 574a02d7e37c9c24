"""The workspace's panels drawn from offline runs, laid out as wandb lays them out.

``draw(logs, out)`` writes one PNG: a row per section of ``workspace.SECTIONS`` (its name
and question as the row's title), its panels side by side, each plotting its keys against
its x axis for every wandb group of the runs (the seeds of a group averaged at each x, as
the workspace's groups show their mean): a colour per group, a line style per key. A panel
keyed by b (x = ``B_AXIS``) plots each row as a point, as wandb does for a custom x; the
shares of a ``pct-area`` panel are drawn as lines of each key's share. It is drawn with
matplotlib by rescue, not by wandb: a picture of what the saved workspace shows, made where
there is no wandb server (``rescue wandb preview``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rescue.tracking.history import RunLog
from rescue.tracking.metrics import B_AXIS
from rescue.tracking.workspace import SECTIONS, Panel

_STYLES = ("-", "--", ":", "-.")


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def series(logs: Sequence[RunLog], panel: Panel, key: str) -> dict[str, list[tuple[float, float]]]:
    """Per group, ``(x, y)`` of ``key`` in the rows that hold it and the panel's x; a step
    axis averages the group's runs at each x, a custom x keeps every row's point. In a
    ``pct-area`` panel y is the key's share of the panel's keys in that row."""
    out: dict[str, list[tuple[float, float]]] = {}
    for group, members in _groups(logs).items():
        points: dict[float, list[float]] = defaultdict(list)
        scattered = []
        for log in members:
            for row in log.rows:
                x, y = _number(row.get(panel.x)), _number(row.get(key))
                if x is None or y is None:
                    continue
                if panel.style == "pct-area":
                    total = sum(_number(row.get(k)) or 0.0 for k in panel.keys)
                    if total <= 0:
                        continue
                    y /= total
                if panel.x == B_AXIS:
                    scattered.append((x, y))
                else:
                    points[x].append(y)
        found = scattered or [(x, sum(v) / len(v)) for x, v in sorted(points.items())]
        if found:
            out[group] = found
    return out


def _groups(logs: Sequence[RunLog]) -> dict[str, list[RunLog]]:
    by: dict[str, list[RunLog]] = defaultdict(list)
    for log in logs:
        by[log.group or log.name or log.run_id].append(log)
    return dict(sorted(by.items()))


def draw(logs: Sequence[RunLog], out: Path, *, title: str = "") -> Path:
    """Draw every section's panels from ``logs`` into the PNG ``out`` (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(_groups(logs))
    colours = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    cols = max(len(s.panels) for s in SECTIONS)
    fig, axes = plt.subplots(
        len(SECTIONS), cols, figsize=(5.2 * cols, 3.1 * len(SECTIONS)), squeeze=False
    )
    for r, section in enumerate(SECTIONS):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(section.panels):
                ax.axis("off")
                continue
            panel = section.panels[c]
            drawn = False
            for i, key in enumerate(panel.keys):
                for group, pts in series(logs, panel, key).items():
                    xs, ys = zip(*pts, strict=True)
                    if panel.x == B_AXIS:
                        ax.scatter(xs, ys, s=6, color=colours[group], alpha=0.5)
                    else:
                        ax.plot(xs, ys, _STYLES[i % len(_STYLES)], color=colours[group], lw=1)
                    drawn = True
            ax.set_title(panel.title, fontsize=8)
            ax.set_xlabel(panel.x, fontsize=7)
            ax.tick_params(labelsize=6)
            legend = "\n".join(f"{_STYLES[i % 4]} {k.rsplit('/', 2)[-2:][-1]}" for i, k in
                               enumerate(panel.keys))  # fmt: skip
            ax.text(0.99, 0.98, legend, transform=ax.transAxes, fontsize=5, va="top",
                    ha="right", family="monospace", alpha=0.8)  # fmt: skip
            if not drawn:
                ax.text(0.5, 0.5, "not logged by these runs", transform=ax.transAxes,
                        ha="center", va="center", fontsize=7, color="grey")  # fmt: skip
        axes[r][0].annotate(
            f"{section.name}: {section.question}", xy=(0, 1.18), xycoords="axes fraction",
            fontsize=9, fontweight="bold",
        )  # fmt: skip
    handles = [plt.Line2D([], [], color=colours[g], label=g) for g in groups]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(groups), 8), fontsize=8)
    if title:
        fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97), h_pad=2.6)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
