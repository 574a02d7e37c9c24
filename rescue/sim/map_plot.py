"""The map's heat map: P3's effect per cell, its verdict and the subsidy ratio written in it.

Specification
-------------
One panel per combination of the grid's third and later axes (the third's values down,
the rest across); in each panel the first axis runs down and the second across. A cell's
colour is P3's effect (the mask arm's cap-hit trend against b at matched b minus the zero
arm's, in the zero arm's seed SDs), on a diverging scale centred at 0 and clipped at ±3;
written in it: the effect, the verdict's mark under the map's family-wise rule (✓ as
predicted, ✗ opposite, = no difference, ? inconclusive, — not judgeable), the mark alone
when it differs, and the subsidy ratio (r). A cell without an estimate is grey.
matplotlib (the ``sim`` extra) is imported here only, with the Agg backend.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

#: A verdict's mark in the heat map.
MARKS = {
    "as predicted": "✓",
    "opposite": "✗",
    "no difference": "=",
    "inconclusive": "?",
    "not judgeable": "—",
    None: "n/a",
}
#: The colour scale's end, in seed SDs.
CLIP = 3.0


def heatmap(grid, cells, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = grid.axes
    rows_axis = axes[0]
    cols_axis = axes[1] if len(axes) > 1 else None
    down = axes[2] if len(axes) > 2 else None
    across = axes[3:]
    panel_rows = len(down.values) if down else 1
    across_idx = list(itertools.product(*(range(len(a.values)) for a in across))) or [()]
    ny, nx = len(rows_axis.values), len(cols_axis.values) if cols_axis else 1
    fig, grid_axes = plt.subplots(
        panel_rows, len(across_idx), squeeze=False, layout="constrained",
        figsize=(max(10.0, 1.5 * nx * len(across_idx) + 2.5), 1.2 * ny * panel_rows + 1.8),
    )  # fmt: skip
    by_index = {c.cell.index: c for c in cells}
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    image = None
    for pr in range(panel_rows):
        for pc, rest in enumerate(across_idx):
            ax = grid_axes[pr][pc]
            z = np.full((ny, nx), np.nan)
            for i in range(ny):
                for j in range(nx):
                    index = (i,) + ((j,) if cols_axis else ()) + ((pr,) if down else ()) + rest
                    c = by_index[index]
                    z[i, j] = c.effect
                    mark = MARKS.get(c.verdict, "n/a")
                    if c.alone != c.verdict:
                        mark += f" ({MARKS.get(c.alone, 'n/a')})"
                    text = (f"{c.effect:+.1f}σ" if np.isfinite(c.effect) else "n/a") + f" {mark}"
                    text += f"\nr {c.ratio:.2f}" if np.isfinite(c.ratio) else "\nr n/a"
                    dark = np.isfinite(c.effect) and abs(c.effect) > 0.6 * CLIP
                    ax.text(j, i, text, ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")  # fmt: skip
            image = ax.imshow(
                np.ma.masked_invalid(np.clip(z, -CLIP, CLIP)), cmap=cmap, vmin=-CLIP, vmax=CLIP
            )
            ax.set_yticks(range(ny), rows_axis.labels, fontsize=7)
            ax.set_xticks(range(nx), cols_axis.labels if cols_axis else [""], fontsize=7)
            ax.set_ylabel(rows_axis.setting.replace("_", "-"), fontsize=8)
            if cols_axis:
                ax.set_xlabel(cols_axis.setting.replace("_", "-"), fontsize=8)
            title = [f"{down.setting.replace('_', '-')} {down.labels[pr]}"] if down else []
            title += [
                f"{a.setting.replace('_', '-')} {a.labels[k]}"
                for a, k in zip(across, rest, strict=True)
            ]
            ax.set_title(", ".join(title), fontsize=8)
    cbar = fig.colorbar(image, ax=grid_axes, shrink=0.8)
    cbar.set_label("P3 effect: mask − zero cap-hit trend at matched b (σ of zero)", fontsize=8)
    fig.suptitle(
        "P3 across the grid: effect in σ of zero (colour); verdict under the map's rule, "
        "(alone) where it differs;\nr: the subsidy ratio (exact b·∇P(cap) term / |∇J term|, "
        "mask runs). ✓ as predicted  ✗ opposite  = no difference  ? inconclusive  — not judgeable",
        fontsize=9,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
