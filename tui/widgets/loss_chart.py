"""The loss curve (or any other metric) of a run over its whole history, as a braille plot.

Every attempt is its own segment and colour; a dotted vertical line marks each resume. The
series is downsampled to about two points per braille column (MinMax-LTTB, cached), laid
out by `tui.model.braille`, and painted line by line (Textual's line API), so a frame
costs a few milliseconds whether the history holds a thousand points or a million.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from tui.model import braille, units
from tui.model.runs import RunView
from tui.model.series import Drawn

STYLES = {
    braille.AXIS: Style(color="grey50"),
    braille.TEXT: Style(bold=True),
    braille.MARKER: Style(color="red"),
    **{
        braille.SERIES + i: Style(color=color)
        for i, color in enumerate(["cyan", "dark_orange", "magenta", "green", "yellow", "blue"])
    },
}


def resume_marks(drawn: Drawn, worlds: dict[int, int]) -> str:
    """`@120,@340`; where the world size changed (an elastic run), every attempt's:
    `3 ranks, @120 (2 ranks), @340 (3 ranks)`, so a slower stretch of the curve is not
    mistaken for a slower run."""
    attempts = [attempt for attempt, _, _ in drawn.segments[1:]]
    changed = len({worlds.get(a) for a, _, _ in drawn.segments} - {None}) > 1
    marks = []
    first = worlds.get(drawn.segments[0][0]) if drawn.segments else None
    start = f"{first} ranks, " if changed and first else ""
    for attempt, x in zip(attempts, drawn.resumed_at, strict=False):
        world = worlds.get(attempt)
        marks.append(f"@{int(x)}" + (f" ({world} ranks)" if changed and world else ""))
    return start + (", " if changed else ",").join(marks)


class LossChart(Widget):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._drawn_key: tuple[object, ...] | None = None
        self._strips: list[Strip] = []
        self.points = 0
        self.title = ""

    def show(self, run: RunView, metric: str) -> None:
        width, height = self.size.width, self.size.height
        key = (run.id, run.metrics_version, run.history, metric, width, height)
        if key == self._drawn_key or not width or not height:
            return
        self._drawn_key = key
        series = run.metrics.get(metric)
        if series is None or not len(series):
            why = {
                "loading": "loading history…",
                "unavailable": f"no history from the daemon ({run.history_error})",
            }.get(run.history, "no points yet")
            self.title = f"{metric}: {why}"
            self.points = 0
            self._strips = [Strip([Segment(self.title[:width], STYLES[braille.TEXT])])]
            self.refresh()
            return
        drawn = series.drawn(max(8, width * 2))
        last = series.last()
        title = f"{metric} {units.number(last[2]) if last else ''}"
        if drawn.resumed_at:
            title += " · resumed " + resume_marks(drawn, run.worlds) + " ┊"
        self.title = title
        self.points = drawn.points
        laid_out = braille.plot(drawn, width, height, title)
        self._strips = [
            Strip([Segment(text, STYLES[color]) for text, color in row]).crop(0, width)
            for row in laid_out.rows
        ]
        self.refresh()

    def render_line(self, y: int) -> Strip:
        if y < len(self._strips):
            return self._strips[y].extend_cell_length(self.size.width)
        return Strip.blank(self.size.width)
