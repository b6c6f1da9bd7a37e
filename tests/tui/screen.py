"""Read what a headless gputop shows, as text: the screen a person would see."""

from __future__ import annotations

import html
import re
from typing import Any

from textual.app import App

_TEXT = re.compile(r'<text class="[^"]*-r\d+" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>')
CELL_WIDTH = 12.2  # Textual's SVG export: pixels per terminal cell


def screen_text(app: App[Any]) -> str:
    """The current screen as lines of text (from Textual's own SVG export)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for match in _TEXT.finditer(app.export_screenshot()):
        x, y = float(match[1]), float(match[2])
        rows.setdefault(y, []).append((x, html.unescape(match[3]).replace("\xa0", " ")))
    lines = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / CELL_WIDTH)) + text
        lines.append(line.rstrip())
    return "\n".join(lines)


def region_text(app: App[Any], selector: str) -> str:
    """What the screen shows inside one widget's region (a dialog over a screen that stays
    visible behind it): the screen's text, cropped to that region."""
    region = app.screen.query_one(selector).region
    lines = screen_text(app).splitlines()[region.y : region.y + region.height]
    return "\n".join(line[region.x : region.x + region.width] for line in lines)
