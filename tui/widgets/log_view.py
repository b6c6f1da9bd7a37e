"""A run's logs, followed live: filtered by node and rank, searched, highlighted.

New lines are appended as they arrive; a change of filter (or a fetched tail landing before
the live lines) redraws from the model's buffer.
"""

from __future__ import annotations

from textual.widgets import RichLog

from tui.model.logs import LogLine
from tui.widgets.log_tail import line_text

SHOWN_LINES = 2000


class LogView(RichLog):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=SHOWN_LINES, wrap=False, markup=False, auto_scroll=True)
        self._filters: tuple[object, ...] | None = None
        self._first_seq: int | None = None
        self._last_seq: int | None = None
        self.shown = 0

    def show(self, lines: list[LogLine], filters: tuple[object, ...], search: str | None) -> None:
        if not lines:
            if self._filters != filters or self.shown:
                self.clear()
                self.shown = 0
            self._filters = filters
            self._first_seq = self._last_seq = None
            return
        same_view = filters == self._filters and self._first_seq is not None
        if same_view and lines[0].seq >= (self._first_seq or 0) and self._last_seq is not None:
            new = [ln for ln in lines if ln.seq > self._last_seq]
        else:
            self.clear()
            self.shown = 0
            new = lines
            self._first_seq = lines[0].seq
        for line in new:
            self.write(line_text(line, search))
        self.shown += len(new)
        self._filters = filters
        self._last_seq = lines[-1].seq
