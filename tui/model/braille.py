"""A braille plot, laid out as text: 2×4 dots per terminal cell, axes, ticks and markers.

Pure (no Textual, no Rich): `plot()` turns a downsampled series into rows of
(text, colour) runs that a widget paints as they are. Each cell takes the colour of the
last line drawn through it. Vertical markers (resume points) are drawn as dotted lines.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tui.model.series import Drawn

BRAILLE = 0x2800
#: The dot bit of (row 0..3, column 0..1) inside one braille cell.
DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
#: Colour indexes a widget maps to styles.
AXIS, TEXT, MARKER = 0, 1, 2
SERIES = 3  # the first attempt's colour; attempt k uses SERIES + (k - 1) % SERIES_COLORS
SERIES_COLORS = 6

Run = tuple[str, int]  # text, colour index
Row = list[Run]


class Canvas:
    """`cols` × `rows` cells of braille dots."""

    def __init__(self, cols: int, rows: int) -> None:
        self.cols = cols
        self.rows = rows
        self.width = cols * 2
        self.height = rows * 4
        self.dots = bytearray(cols * rows)
        self.colors = bytearray(cols * rows)

    def dot(self, x: int, y: int, color: int) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y >> 2) * self.cols + (x >> 1)
            self.dots[i] |= DOTS[y & 3][x & 1]
            self.colors[i] = color

    def line(self, x0: int, y0: int, x1: int, y1: int, color: int) -> None:
        """Bresenham between two dots."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.dot(x0, y0, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def vline(self, x: int, color: int) -> None:
        for y in range(0, self.height, 2):
            self.dot(x, y, color)

    def row(self, r: int) -> Row:
        runs: Row = []
        text: list[str] = []
        current = -1
        base = r * self.cols
        for i in range(base, base + self.cols):
            bits = self.dots[i]
            color = self.colors[i] if bits else AXIS
            if color != current and text:
                runs.append(("".join(text), current))
                text = []
            current = color
            text.append(chr(BRAILLE + bits) if bits else " ")
        if text:
            runs.append(("".join(text), current))
        return runs


def ticks(low: float, high: float, count: int) -> list[float]:
    """About `count` round values between low and high."""
    if high <= low:
        return [low]
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    values = []
    value = first
    while value <= high + step * 1e-9:
        values.append(round(value, 12))
        value += step
    return values


def label(value: float) -> str:
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.1e}"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


@dataclass(frozen=True)
class Plot:
    rows: list[Row]  # the whole widget, title to x labels
    width: int


def plot(drawn: Drawn, width: int, height: int, title: str) -> Plot:
    """Lay out `drawn` in `width` × `height` cells: title, y axis, braille body, x axis."""
    if width < 12 or height < 5:
        return Plot([[(title[:width], TEXT)]], width)
    xs = [x for _, seg_x, _ in drawn.segments for x in seg_x]
    ys = [y for _, _, seg_y in drawn.segments for y in seg_y]
    if not xs:
        return Plot([[(title[:width], TEXT)]], width)
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(ys), max(ys)
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    body_rows = height - 3  # title, x axis, x labels
    y_ticks = ticks(y_low, y_high, max(2, body_rows // 3))
    y_labels = [label(v) for v in y_ticks]
    gutter = max(len(t) for t in y_labels) + 1
    cols = width - gutter - 1
    canvas = Canvas(cols, body_rows)
    x_span = (x_high - x_low) or 1.0
    y_span = y_high - y_low

    def px(x: float) -> int:
        return round((x - x_low) / x_span * (canvas.width - 1))

    def py(y: float) -> int:
        return round((y_high - y) / y_span * (canvas.height - 1))

    for x in drawn.resumed_at:
        canvas.vline(px(x), MARKER)
    for attempt, seg_x, seg_y in drawn.segments:
        color = SERIES + (attempt - 1) % SERIES_COLORS
        points = [(px(x), py(y)) for x, y in zip(seg_x, seg_y, strict=True)]
        if len(points) == 1:
            canvas.dot(*points[0], color)
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            canvas.line(x0, y0, x1, y1, color)

    rows: list[Row] = [[(title.center(width)[:width], TEXT)]]
    tick_rows = {
        min(body_rows - 1, round((y_high - v) / y_span * (body_rows - 1))): t
        for v, t in zip(y_ticks, y_labels, strict=True)
    }
    for r in range(body_rows):
        tick = tick_rows.get(r)
        left = (tick.rjust(gutter - 1) + " ┤") if tick is not None else " " * gutter + "│"
        rows.append([(left, AXIS), *canvas.row(r)])
    x_ticks = ticks(x_low, x_high, max(2, cols // 14))
    axis = ["─"] * cols
    labels = [" "] * (cols + 8)
    for value in x_ticks:
        c = round((value - x_low) / x_span * (cols - 1))
        axis[c] = "┬"
        text = label(value)
        start = max(0, min(cols - len(text), c - len(text) // 2))
        if all(ch == " " for ch in labels[max(0, start - 1) : start + len(text) + 1]):
            labels[start : start + len(text)] = list(text)
    rows.append([(" " * gutter + "└" + "".join(axis), AXIS)])
    rows.append([(" " * (gutter + 1) + "".join(labels[:cols]).rstrip(), AXIS)])
    return Plot(rows, width)
