"""The map's heat map: P3's effect per cell as judged and as it is, side by side.

Specification
-------------
Two panels per combination of the grid's third and later axes (the third's values down,
the rest across): the judged effect, then the exact one on the same runs; in each panel
the first axis runs down and the second across. A cell's colour is the effect (the mask
arm's cap-hit trend against b at matched b minus the zero arm's, in the zero arm's seed SDs
of the judged trend; the exact one is the slope of the simulator's exact P(cap) on its
exact J over the same steps, in the same unit), on a diverging scale centred at 0 and
clipped at ±3. Written in a judged cell: the effect, the verdict's mark under the map's
family-wise rule (✓ as predicted, ✗ opposite, = no difference, ? inconclusive, — not
judgeable), the mark alone when it differs, and the subsidy ratio (r); in an exact cell:
the effect, and the judged trend over the exact one with the share of runs of the exact
sign. A cell without an estimate is grey. matplotlib (the ``sim`` extra) is imported here
only, with the Agg backend.
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
    columns = [(rest, kind) for rest in across_idx for kind in ("judged", "exact")]
    ny, nx = len(rows_axis.values), len(cols_axis.values) if cols_axis else 1
    fig, grid_axes = plt.subplots(
        panel_rows, len(columns), squeeze=False, layout="constrained",
        figsize=(max(10.0, 1.5 * nx * len(columns) + 2.5), 1.2 * ny * panel_rows + 2.0),
    )  # fmt: skip
    by_index = {c.cell.index: c for c in cells}
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    image = None
    for pr in range(panel_rows):
        for pc, (rest, kind) in enumerate(columns):
            ax = grid_axes[pr][pc]
            z = np.full((ny, nx), np.nan)
            for i in range(ny):
                for j in range(nx):
                    index = (i,) + ((j,) if cols_axis else ()) + ((pr,) if down else ()) + rest
                    c = by_index[index]
                    value = c.effect if kind == "judged" else c.exact
                    z[i, j] = value
                    text = f"{value:+.1f}σ" if np.isfinite(value) else "n/a"
                    if kind == "judged":
                        mark = MARKS.get(c.verdict, "n/a")
                        if c.alone != c.verdict:
                            mark += f" ({MARKS.get(c.alone, 'n/a')})"
                        text += f" {mark}"
                        text += f"\nr {c.ratio:.2f}" if np.isfinite(c.ratio) else "\nr n/a"
                    elif np.isfinite(c.fidelity):
                        text += f"\n{c.fidelity:.2f} ({c.same_sign:.0%})"
                    dark = np.isfinite(value) and abs(value) > 0.6 * CLIP
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
            ax.set_title(f"{kind}: " + ", ".join(title), fontsize=8)
    cbar = fig.colorbar(image, ax=grid_axes, shrink=0.8)
    cbar.set_label("P3 effect: mask − zero cap-hit trend at matched b (σ of zero)", fontsize=8)
    fig.suptitle(
        "P3 across the grid: judged (left of each pair) and exact (right: the simulator's "
        "P(cap) on J, same runs),\nin σ of zero's judged trend. judged: verdict under the "
        "map's rule, (alone) where it differs; r: the subsidy ratio\n(exact b·∇P(cap) / |∇J| "
        "terms). exact: judged / exact trend (runs of the exact sign).\n✓ as predicted  "
        "✗ opposite  = no difference  ? inconclusive  — not judgeable",
        fontsize=9,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cap_against_b(grid, cells, path: Path) -> Path | None:
    """Each arm's cap-hit rate against the prior b (binned, mean over seeds with its t band)
    in every cell of the grid's longest run length: one panel per cell, the first axis down
    and the rest across. None when no cell has curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [c for c in cells if c.curves]
    if not drawn:
        return None
    rows_axis = grid.axes[0]
    rest = sorted({c.cell.index[1:] for c in drawn})
    ny, nx = len(rows_axis.values), len(rest)
    fig, axes = plt.subplots(ny, nx, squeeze=False, sharey=True, layout="constrained",
                             figsize=(max(8.0, 2.6 * nx), 2.2 * ny + 1.2))  # fmt: skip
    by_index = {c.cell.index: c for c in drawn}
    colors = {}
    for i in range(ny):
        for j, tail in enumerate(rest):
            ax = axes[i][j]
            c = by_index.get((i, *tail))
            if c is None:
                ax.set_axis_off()
                continue
            for label, (x, mean, lo, hi) in c.curves.items():
                line = ax.plot(x, mean, lw=1.2, label=label, color=colors.get(label))[0]
                colors[label] = line.get_color()
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
            ax.set_title(c.cell.label(grid), fontsize=7)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if i == ny - 1:
                ax.set_xlabel("prior b", fontsize=7)
            if j == 0:
                ax.set_ylabel("cap-hit rate", fontsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(
        "Cap-hit rate against b per arm and cell (b over the 10 steps before each step; mean "
        "over seeds per 0.05 bin, 95% t band)",
        fontsize=9,
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
