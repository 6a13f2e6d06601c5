"""Deterministic matplotlib output: same data → byte-identical PNG.

Agg backend, matplotlib's default style (a user's matplotlibrc cannot leak in), fixed
size and dpi, a fixed hash salt, and no `Software` / date metadata in the PNG.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt  # noqa: E402 (after matplotlib.use)

DPI = 100
PNG_METADATA = {"Software": None}
STYLE = {
    "svg.hashsalt": "mtp-lab",
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 7,
    "legend.frameon": False,
}
# Colour-blind-safe cycle (Okabe-Ito), fixed order.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


@contextlib.contextmanager
def figure(width: float = 7.0, height: float = 4.0, nrows: int = 1, ncols: int = 1, **kwargs):
    with plt.style.context("default"), matplotlib.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kwargs)
        try:
            yield fig, axes
        finally:
            plt.close(fig)


def save_png(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_suffix(".png.tmp")
    fig.savefig(tmp, format="png", dpi=DPI, metadata=PNG_METADATA)
    tmp.replace(path)
    return path


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"
