"""Deterministic matplotlib output shared by the sweep report and the paper figures: same data → the same bytes.

Agg backend, matplotlib's default style (a user's matplotlibrc cannot leak in), fixed size and
dpi, a fixed hash salt, no `Software` / date metadata. Text is never cut: labels wrap instead of
being shortened, and figures are saved with a tight bounding box that takes in every title,
label and legend. PDF and SVG keep text as text (TrueType in the PDF, <text> in the SVG), so a
paper's figure can be edited and searched.
"""

from __future__ import annotations

import contextlib
import math
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
# Colour-blind-safe cycle (Okabe-Ito, with Tol's olive in place of black), fixed order: the first six are six
# different hues (the two blues sit far apart, so a six-variant sweep such as quick_ablation never shows two blues).
# Black and greys are never a variant's: they mark references (baseline, zero, means) and the series inside a
# variant's panel (horizons, horizon pairs: `series_style`).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#999933", "#56B4E9", "#F0E442"]
# After every colour has been used once, the next variants repeat them with another line style.
LINE_STYLES = ["-", "--", ":", "-."]
# Series *inside* a variant's panel (horizons, horizon pairs, bar kinds) are never drawn in a variant colour:
# shades of grey with their own line style and marker, so blue always means the same variant.
SERIES_GREYS = ["#1a1a1a", "#5a5a5a", "#8c8c8c", "#b0b0b0"]
SERIES_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


@contextlib.contextmanager
def figure(width: float = 7.0, height: float = 4.0, nrows: int = 1, ncols: int = 1, **kwargs):
    with plt.style.context("default"), matplotlib.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kwargs)
        try:
            yield fig, axes
        finally:
            plt.close(fig)


# Extra formats every saved figure is also written in (`also_save_as`): a test renders the report's PNG figures to SVG.
_EXTRA_FORMATS: list[str] = []


@contextlib.contextmanager
def also_save_as(*formats: str):
    """Inside this block every `save_png(fig, x.png)` also writes x.<format> for each format given (e.g. "svg")."""
    _EXTRA_FORMATS.extend(formats)
    try:
        yield
    finally:
        del _EXTRA_FORMATS[len(_EXTRA_FORMATS) - len(formats):]


def save_png(fig, path: Path, format: str = "png") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    declutter(fig)
    if format == "png":
        for extra in dict.fromkeys(_EXTRA_FORMATS):
            if extra != "png":
                _save(fig, path.with_suffix(f".{extra}"), extra)
    return _save(fig, path, format)


def _save(fig, path: Path, format: str) -> Path:
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


def series_style(index: int) -> dict:
    """matplotlib keyword arguments of the index-th series inside one variant's panel (horizon k = index k − 1,
    or a horizon pair): a grey, a line style and a marker, never a variant's colour."""
    return {"color": SERIES_GREYS[index % len(SERIES_GREYS)], "linestyle": LINE_STYLES[(index // len(SERIES_GREYS)) % len(LINE_STYLES)],
            "marker": SERIES_MARKERS[index % len(SERIES_MARKERS)]}


def padded_range(values, pad: float = 0.08, minimum_span: float = 0.0) -> tuple[float, float] | None:
    """An axis range that shows the differences between `values`: their span padded by `pad` of it on each side
    (at least `minimum_span` wide, centred), not stretched to zero. None when there is nothing finite."""
    finite_values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite_values:
        return None
    low, high = min(finite_values), max(finite_values)
    span = max(high - low, minimum_span, 1e-9 * max(1.0, abs(high)))
    middle = (low + high) / 2
    low, high = min(low, middle - span / 2), max(high, middle + span / 2)
    return low - pad * span, high + pad * span


def variant_style(index: int) -> tuple[str, str]:
    """(colour, line style) of the index-th variant: unique for the first len(PALETTE) × len(LINE_STYLES)."""
    return PALETTE[index % len(PALETTE)], LINE_STYLES[(index // len(PALETTE)) % len(LINE_STYLES)]


def style_map(ordered_labels) -> dict[str, tuple[str, str]]:
    """(colour, line style) per label by its place in one fixed order: every figure that draws a label
    looks it up here, so a variant keeps its colour whichever variants a figure shows."""
    return {label: variant_style(index) for index, label in enumerate(ordered_labels)}


# ---- text that does not collide ----------------------------------------------------------------------------------

def _in_view(axis, text) -> bool:
    """Whether a tick label of `axis` is drawn (its tick lies inside the view interval)."""
    low, high = sorted(axis.get_view_interval())
    x, y = text.get_position()
    where = x if axis.axis_name == "x" else y
    return low - 1e-9 * max(1.0, abs(high)) <= where <= high + 1e-9 * max(1.0, abs(high))


def drawn_texts(fig) -> list:
    """Every Text artist the figure draws with some text: titles, axis labels, tick labels in view, legend texts,
    annotations and free texts (after `fig.canvas.draw()`)."""
    out = [t for t in (fig._suptitle, getattr(fig, "_supxlabel", None), getattr(fig, "_supylabel", None)) if t is not None]
    out += list(fig.texts)
    for legend in fig.legends:
        out += legend.get_texts() + [legend.get_title()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            out += [t for t in axis.get_ticklabels() if _in_view(axis, t)]
            out.append(axis.get_offset_text())
        legend = ax.get_legend()
        if legend is not None:
            out += legend.get_texts() + [legend.get_title()]
    return [t for t in dict.fromkeys(out) if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())]


def _overlap(a, b, slack: float = 0.5) -> bool:
    return a.x0 + slack < b.x1 and b.x0 + slack < a.x1 and a.y0 + slack < b.y1 and b.y0 + slack < a.y1


def text_collisions(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap, as (text, text); the artist-side twin of the SVG check
    (lab/report/text_boxes.py)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t, t.get_window_extent(renderer)) for t in drawn_texts(fig)]
    return [(a.get_text(), b.get_text()) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if _overlap(box_a, box_b)]


# Where a point or bar label may go instead (points from its anchor), tried in this order.
NUDGES = [(4, 4), (4, -10), (-4, 4), (-4, -10), (8, 12), (8, -18), (-8, 12), (-8, -18), (0, 16), (0, -22)]


def declutter(fig) -> None:
    """Move text out of each other's way before saving: x tick labels that touch are rotated (then made smaller),
    a point/bar label (annotation) on another text or on a legend is moved to the first free place of NUDGES.
    Deterministic: the same figure always comes out the same."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.xaxis.get_ticklabels() if t.get_visible() and t.get_text().strip() and _in_view(ax.xaxis, t)]
        for attempt in range(4):
            boxes = [t.get_window_extent(renderer) for t in labels]
            if not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]):
                break
            if attempt == 0 and not labels[0].get_rotation():
                for t in labels:
                    t.set_rotation(30)
                    t.set_horizontalalignment("right")
                    t.set_rotation_mode("anchor")
            else:
                for t in labels:
                    t.set_fontsize(max(5.0, t.get_fontsize() - 1))
    fig.canvas.draw()
    movable = [t for ax in fig.axes for t in ax.texts if getattr(t, "anncoords", None) == "offset points" and t.get_visible() and t.get_text().strip()]
    if not movable:
        return
    legends = [lg for lg in [ax.get_legend() for ax in fig.axes] + list(fig.legends) if lg is not None]
    for text in movable:
        def crowded() -> bool:
            box = text.get_window_extent(renderer)
            others = [t.get_window_extent(renderer) for t in drawn_texts(fig) if t is not text]
            others += [lg.get_window_extent(renderer) for lg in legends]
            return any(_overlap(box, other) for other in others)

        if not crowded():
            continue
        original = text.xyann
        for offset in NUDGES:
            text.xyann = offset
            text.set_horizontalalignment("left" if offset[0] > 0 else "right" if offset[0] < 0 else "center")
            if not crowded():
                break
        else:
            text.xyann = original


def short(label: str, width: int = 28) -> str:
    """A label on lines of at most `width` characters (wrapped at spaces, long words broken): never cut."""
    return "\n".join(textwrap.wrap(str(label), width, break_long_words=True, break_on_hyphens=False)) or str(label)
