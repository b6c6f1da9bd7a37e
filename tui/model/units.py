"""Numbers as a person reads them in a terminal cell: short, with units, n/a for None.

Pure functions shared by every screen; `None` (not available) is always shown as `n/a`
and never as zero.
"""

from __future__ import annotations

import math

NA = "n/a"
#: Eight levels, one cell: the compact per-GPU bars of the fleet view.
LEVELS = "▁▂▃▄▅▆▇█"
SPARKS = " ▁▂▃▄▅▆▇█"


def pct(value: float | None, width: int = 0) -> str:
    text = NA if value is None else f"{value:.0f}%"
    return text.rjust(width) if width else text


def bytes_(value: float | None) -> str:
    if value is None:
        return NA
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop always returns


def gib(value: float | None) -> str:
    return NA if value is None else f"{value / 2**30:.0f}G"


def rate(value: float | None) -> str:
    """Bytes per second."""
    return NA if value is None else f"{bytes_(value)}/s"


def number(value: float | None, digits: int = 4) -> str:
    """A metric value: compact, scientific when very small or large."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-3 or magnitude >= 1e6):
        return f"{value:.2e}"
    return f"{value:.{digits}g}"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0 or math.isinf(seconds):
        return NA
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def level(fraction: float | None) -> str:
    """One cell for a 0..1 fraction; `·` when not available."""
    if fraction is None:
        return "·"
    index = int(max(0.0, min(1.0, fraction)) * (len(LEVELS) - 1) + 0.5)
    return LEVELS[index]


def sparkline(values: list[float | None], width: int, top: float | None = None) -> str:
    """The last `width` values as a text sparkline.

    With `top` the scale is 0..top (a percentage, a power limit); without it the scale is
    the values' own min..max, so a slowly decaying learning rate still shows its shape.
    """
    values = values[-width:]
    present = [v for v in values if v is not None]
    if top is not None:
        low, high = 0.0, top
    elif present:
        low, high = min(present), max(present)
    else:
        low = high = 0.0
    span = high - low
    cells = []
    for v in values:
        if v is None:
            cells.append("·")
        elif span <= 0:
            cells.append(SPARKS[4] if top is None and present else SPARKS[1])
        else:
            i = int(max(0.0, min(1.0, (v - low) / span)) * (len(SPARKS) - 2) + 0.5) + 1
            cells.append(SPARKS[min(i, len(SPARKS) - 1)])
    return "".join(cells).rjust(width)


def short_run_id(run_id: str, width: int = 18) -> str:
    return run_id if len(run_id) <= width else run_id[: width - 1] + "…"
