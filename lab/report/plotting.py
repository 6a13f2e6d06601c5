"""Deterministic matplotlib output shared by the sweep report and the paper figures: same data → the same bytes.

Agg backend, matplotlib's default style (a user's matplotlibrc cannot leak in), fixed size and
dpi, a fixed hash salt, no `Software` / date metadata. Text is never cut: labels wrap instead of
being shortened, and figures are saved with a tight bounding box that takes in every title,
label and legend. PDF and SVG keep text as text (TrueType in the PDF, <text> in the SVG), so a
paper's figure can be edited and searched.
"""

from __future__ import annotations

import contextlib
import textwrap
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
    "svg.fonttype": "none",  # SVG text stays text
    "pdf.fonttype": 42,  # TrueType: PDF text stays editable
}
# Byte-stable PDF/SVG: no creation date or producer version written into them.
VECTOR_METADATA = {"pdf": {"CreationDate": None, "Producer": None, "Creator": None}, "svg": {"Date": None, "Creator": None}}
PAPER_FORMATS = ("png", "pdf", "svg")
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


def save_png(fig, path: Path, format: str = "png") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = temp_beside(path)  # its own temp file: another lab-report on the same sweep may be drawing this figure too
    metadata = PNG_METADATA if format == "png" else VECTOR_METADATA[format]
    try:
        with matplotlib.rc_context(STYLE):  # the text-as-text settings apply when saving
            fig.savefig(tmp, format=format, dpi=DPI, metadata=metadata, bbox_inches="tight", pad_inches=0.05)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_formats(fig, stem: Path, formats=PAPER_FORMATS) -> list[Path]:
    """The figure as stem.png, stem.pdf and stem.svg."""
    return [save_png(fig, Path(stem).with_suffix(f".{fmt}"), fmt) for fmt in formats]


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
    """A label on lines of at most `width` characters (wrapped at spaces, long words broken): never cut."""
    return "\n".join(textwrap.wrap(str(label), width, break_long_words=True, break_on_hyphens=False)) or str(label)
