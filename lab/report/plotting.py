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

from lab.report.atomic import temp_beside  # noqa: E402

DPI = 150  # sharp on high-density screens and in print
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
# Colour-blind-safe cycle (Okabe-Ito), fixed order: the first six are six different hues (the
# two blues sit far apart, so a six-variant sweep such as quick_ablation never shows two blues).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#000000", "#56B4E9", "#F0E442"]
# After every colour has been used once, the next variants repeat them with another line style.
LINE_STYLES = ["-", "--", ":", "-."]


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
    tmp = temp_beside(path)  # its own temp file: another lab-report on the same sweep may be drawing this figure too
    try:
        fig.savefig(tmp, format="png", dpi=DPI, metadata=PNG_METADATA)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def variant_style(index: int) -> tuple[str, str]:
    """(colour, line style) of the index-th variant: unique for the first len(PALETTE) × len(LINE_STYLES)."""
    return PALETTE[index % len(PALETTE)], LINE_STYLES[(index // len(PALETTE)) % len(LINE_STYLES)]


def style_map(ordered_labels) -> dict[str, tuple[str, str]]:
    """(colour, line style) per label by its place in one fixed order: every figure that draws a label
    looks it up here, so a variant keeps its colour whichever variants a figure shows."""
    return {label: variant_style(index) for index, label in enumerate(ordered_labels)}


def short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"
