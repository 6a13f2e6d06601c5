"""Text boxes read back from a saved SVG, and the pairs that overlap: the check that no figure's text collides.

matplotlib writes SVG text as text (`svg.fonttype: none`, lab/report/plotting.py): one `<text>` per line, placed
by `x`/`y` (the baseline point, `text-anchor` start/middle/end) or by `transform="translate(x y) rotate(a)"`,
with its font size in the style. Each box is that line's advance width × its ascent and descent, measured with
matplotlib's own font metrics for the same font, turned by the text's rotation; two boxes overlap when no axis
separates the two rotated rectangles.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

TEXT = re.compile(r"<text(?P<attrs>[^>]*?)(?:/>|>(?P<body>.*?)</text>)", re.S)
ATTR = re.compile(r'(\w[\w-]*)="([^"]*)"')
TRANSLATE = re.compile(r"translate\(\s*([-\d.e]+)[ ,]+([-\d.e]+)\s*\)")
ROTATE = re.compile(r"rotate\(\s*([-\d.e]+)")
FONT_SIZE = re.compile(r"font-size:\s*([\d.]+)px")
ANCHOR = re.compile(r"text-anchor:\s*(start|middle|end)")
_MEASURE = TextToPath()


@dataclass(frozen=True)
class TextBox:
    text: str
    corners: tuple[tuple[float, float], ...]  # four corners in SVG coordinates (y down)


def _extent(text: str, size: float) -> tuple[float, float, float]:
    """(width, ascent, descent) of one line in points, by matplotlib's metrics of DejaVu Sans."""
    prop = FontProperties(family="DejaVu Sans", size=size)
    width, height, descent = _MEASURE.get_text_width_height_descent(text, prop, ismath=False)
    return width, height - descent, descent


def text_boxes(svg: str | Path) -> list[TextBox]:
    """Every non-blank `<text>` line of an SVG written by matplotlib, as its rotated box."""
    source = Path(svg).read_text() if not str(svg).lstrip().startswith("<") else str(svg)
    boxes = []
    for match in TEXT.finditer(source):
        body = html.unescape(re.sub(r"<[^>]+>", "", match.group("body") or ""))
        if not body.strip():
            continue
        attrs = dict(ATTR.findall(match.group("attrs")))
        style = attrs.get("style", "")
        size = float(FONT_SIZE.search(style).group(1)) if FONT_SIZE.search(style) else 10.0
        anchor = ANCHOR.search(style).group(1) if ANCHOR.search(style) else "start"
        transform = attrs.get("transform", "")
        if "x" in attrs:
            x, y = float(attrs["x"]), float(attrs.get("y", 0))
        elif TRANSLATE.search(transform):
            x, y = map(float, TRANSLATE.search(transform).groups())
        else:
            x = y = 0.0
        angle = math.radians(float(ROTATE.search(transform).group(1))) if ROTATE.search(transform) else 0.0
        width, ascent, descent = _extent(body, size)
        left = {"start": 0.0, "middle": -width / 2, "end": -width}[anchor]
        local = [(left, -ascent), (left + width, -ascent), (left + width, descent), (left, descent)]
        cos, sin = math.cos(angle), math.sin(angle)
        corners = tuple((x + u * cos - v * sin, y + u * sin + v * cos) for u, v in local)
        boxes.append(TextBox(body, corners))
    return boxes


def _separated(a: TextBox, b: TextBox, slack: float) -> bool:
    for shape in (a, b):
        for i in range(4):
            (x0, y0), (x1, y1) = shape.corners[i], shape.corners[(i + 1) % 4]
            nx, ny = y0 - y1, x1 - x0
            norm = math.hypot(nx, ny) or 1.0
            nx, ny = nx / norm, ny / norm
            pa = [x * nx + y * ny for x, y in a.corners]
            pb = [x * nx + y * ny for x, y in b.corners]
            if max(pa) <= min(pb) + slack or max(pb) <= min(pa) + slack:
                return True
    return False


def overlapping_texts(svg: str | Path, slack: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of text lines whose boxes overlap by more than `slack` points (touching boxes do not count)."""
    boxes = text_boxes(svg)
    return [(a.text, b.text) for i, a in enumerate(boxes) for b in boxes[i + 1:] if not _separated(a, b, slack)]
