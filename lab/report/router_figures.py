"""The sweep report's expert-load figure (MoE runs): load by layer × expert, trunk layers and MTP depths side by side.

One heatmap per variant. Rows are the routers (trunk layers `l{i}` first, then the head's `h{k}`: DeepSeek depth
d is h{d+1}), columns the experts; a cell is the expert's load over the mean load of its row (1 = even, 0 = idle),
from `val/router/tokens/...` (the validation passes) when logged, else `train/router/tokens/...`, each summed
over the logged steps and averaged over seeds.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import numpy as np

from lab.report.plotting import figure, save_png, short
from lab.report.records import finite
from lab.report.table import Variant

ROUTER_TOKENS = re.compile(r"^(?P<stage>train|val)/router/tokens/(?P<place>[^/]+)/e(?P<expert>\d+)$")


def place_order(place: str) -> tuple:
    """Trunk layers first, then head places by horizon (`l2` < `l10` < `h2` < `h2_b1` < `h3`)."""
    numbers = [int(n) for n in re.findall(r"\d+", place)]
    return (place[0] != "l", *numbers)


def relative_load(records: list[dict]) -> tuple[list[str], np.ndarray] | None:
    """(places, [places, experts] load / mean load of the row) over the jobs of one variant, or None without router metrics."""
    names = {name: ROUTER_TOKENS.match(name) for r in records for name in r["history"]}
    names = {name: match for name, match in names.items() if match}
    if not names:
        return None
    stage = "val" if any(m.group("stage") == "val" for m in names.values()) else "train"
    names = {name: m for name, m in names.items() if m.group("stage") == stage}
    places = sorted({m.group("place") for m in names.values()}, key=place_order)
    experts = 1 + max(int(m.group("expert")) for m in names.values())
    totals = np.zeros((len(places), experts))
    for name, match in names.items():
        per_job = [sum(v for _, v in r["history"].get(name, []) if finite(v)) for r in records]
        totals[places.index(match.group("place")), int(match.group("expert"))] = statistics.fmean(per_job)
    means = totals.mean(axis=1, keepdims=True)
    return places, np.divide(totals, means, out=np.full_like(totals, np.nan), where=means > 0)


def expert_load_heatmaps(variants: list[Variant], path: Path) -> Path | None:
    panels = []
    for variant in sorted(variants, key=lambda v: (v.display_rank, v.k or 0)):
        load = relative_load(variant.ok)
        if load is not None:
            panels.append((variant.label, *load))
    if not panels:
        return None
    top = max(2.0, max(float(np.nanmax(matrix)) for _, _, matrix in panels))  # one colour scale: panels compare
    ncols = min(len(panels), 3)
    nrows = (len(panels) + ncols - 1) // ncols
    with figure(3.6 * ncols + 0.6, 0.45 * max(len(p[1]) for p in panels) * nrows + 1.6, nrows, ncols) as (fig, axes):
        for index, (label, places, matrix) in enumerate(panels):
            ax = axes[index // ncols][index % ncols]
            image = ax.imshow(matrix, vmin=0, vmax=top, cmap="viridis", aspect="auto")
            ax.set_xticks(range(matrix.shape[1]), [f"e{j}" for j in range(matrix.shape[1])], fontsize=7)
            ax.set_yticks(range(len(places)), [f"{p} (depth {int(p[1:].split('_')[0]) - 1})" if p.startswith("h") else p for p in places],
                          fontsize=7)
            ax.grid(False)
            for i in range(matrix.shape[0]):
                for j in range(matrix.shape[1]):
                    if np.isfinite(matrix[i, j]):
                        ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
                                color="black" if matrix[i, j] > 0.6 * top else "white")
            ax.set_title(short(label, 40), fontsize=8)
            fig.colorbar(image, ax=ax, shrink=0.8, label="load / mean load")
        for index in range(len(panels), nrows * ncols):
            axes[index // ncols][index % ncols].set_visible(False)
        fig.suptitle("Expert load by layer: trunk layers (l) and MTP depths (h) side by side")
        return save_png(fig, path)
