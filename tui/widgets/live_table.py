"""A DataTable that is redrawn from the model many times a second without flicker.

`sync(rows)` compares the wanted rows with what is shown: when the row keys are the same
it only rewrites the cells that changed; otherwise it rebuilds the rows and puts the cursor
back on the row it was on.

Cells have no padding of their own; each column's width includes a one-cell gap, so the
essential columns of every table fit an 80-column terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

Cell = str | Text
Row = tuple[str, Sequence[Cell]]


class LiveTable(DataTable[Cell]):
    def __init__(self, columns: Sequence[tuple[str, str, int | None]], id: str | None = None):
        super().__init__(id=id, cursor_type="row", zebra_stripes=False, cell_padding=0)
        self._columns = columns
        self._shown: list[Row] = []

    def on_mount(self) -> None:
        for label, key, width in self._columns:
            # a column as wide as its content keeps the gap after its label too: an
            # ended run's empty RATE printed `RATEETA`
            self.add_column(label if width is not None else f"{label} ", key=key, width=width)

    @property
    def selected_key(self) -> str | None:
        if not self._shown or self.cursor_row < 0 or self.cursor_row >= len(self._shown):
            return None
        return self._shown[self.cursor_row][0]

    def _fit(self, cells: Sequence[Cell]) -> list[Cell]:
        """Every cell leaves its column's last cell free: the gap to the next column."""
        fitted: list[Cell] = []
        for (_, _, width), cell in zip(self._columns, cells, strict=True):
            text = cell if isinstance(cell, Text) else Text(cell)
            if width is not None and text.cell_len >= width:
                text = text.copy()
                text.truncate(width - 1, overflow="ellipsis")
            elif width is None:
                text = text + " "
            fitted.append(text)
        return fitted

    def sync(self, rows: Sequence[Row]) -> None:
        rows = [(key, self._fit(cells)) for key, cells in rows]
        if [k for k, _ in rows] == [k for k, _ in self._shown]:
            for (key, cells), (_, old) in zip(rows, self._shown, strict=True):
                for (_, column, width), new_cell, old_cell in zip(
                    self._columns, cells, old, strict=True
                ):
                    if new_cell != old_cell:
                        self.update_cell(key, column, new_cell, update_width=width is None)
            self._shown = rows
            return
        selected = self.selected_key
        self.clear()
        for key, cells in rows:
            self.add_row(*cells, key=key)
        self._shown = rows
        if selected is not None:
            index = next((i for i, (k, _) in enumerate(rows) if k == selected), None)
            if index is not None:
                self.move_cursor(row=index, animate=False)
