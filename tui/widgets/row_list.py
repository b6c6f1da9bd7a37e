"""A list of one-line rows with a cursor, drawn with Textual's line API.

For long lists redrawn every second (the fleet at 256 nodes and more), rows are lazy:
the list holds only the rows' keys, and asks for a row's `Text` (through the `line`
function given with them) only when the row is on screen. A row's text is turned into a
strip once, and only the visible rows whose text changed are painted again, so a frame
costs the same at 64 nodes as at 1,000. Keys: ↑ ↓ pgup pgdn home end, enter posts
`RowList.Selected` with the row's key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

LineFor = Callable[[str], Text]


class RowList(ScrollView, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"row-list--cursor"}

    class Selected(Message):
        def __init__(self, row_list: RowList, key: str) -> None:
            super().__init__()
            self.row_list = row_list
            self.key = key

        @property
        def control(self) -> RowList:
            return self.row_list

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._keys: list[str] = []
        self._line: LineFor = lambda _key: Text()
        self._strips: dict[str, tuple[Text, Strip]] = {}
        self.cursor = 0

    # ------------------------------------------------------------------ data

    @property
    def keys(self) -> list[str]:
        return self._keys

    @property
    def selected_key(self) -> str | None:
        return self._keys[self.cursor] if 0 <= self.cursor < len(self._keys) else None

    def set_rows(self, keys: list[str], line: LineFor, width: int) -> None:
        """Show a row per key, drawn by `line(key)` when on screen, `width` cells wide at
        most; the cursor stays on its row (by key) when that row is still here."""
        selected = self.selected_key
        changed = keys != self._keys
        self._keys, self._line = keys, line
        self.virtual_size = Size(width, len(keys))
        if changed:
            if selected is not None and selected in keys:
                self.cursor = keys.index(selected)
            self.cursor = max(0, min(self.cursor, len(keys) - 1))
            kept = set(keys)
            self._strips = {k: v for k, v in self._strips.items() if k in kept}
            self.refresh()
            return
        top = self.scroll_offset.y
        for y in range(top, min(len(keys), top + self.size.height)):
            key = keys[y]
            cached = self._strips.get(key)
            if cached is None or cached[0] != line(key):
                self.refresh_line(y)

    def _strip(self, key: str) -> Strip:
        text = self._line(key)
        cached = self._strips.get(key)
        if cached is not None and cached[0] == text:
            return cached[1]
        segments = [s for s in text.render(self.app.console) if s.text != "\n"]
        strip = Strip(segments)
        self._strips[key] = (text, strip)
        return strip

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        if index >= len(self._keys):
            return Strip.blank(width, self.rich_style)
        strip = self._strip(self._keys[index]).crop(scroll_x, scroll_x + width)
        strip = strip.extend_cell_length(width).apply_style(self.rich_style)
        if index == self.cursor:
            strip = strip.apply_style(self.get_component_rich_style("row-list--cursor"))
        return strip

    # ------------------------------------------------------------------ keys

    def _move_to(self, row: int) -> None:
        if not self._keys:
            return
        old = self.cursor
        self.cursor = max(0, min(row, len(self._keys) - 1))
        self.refresh_line(old)
        self.refresh_line(self.cursor)
        if self.cursor < self.scroll_offset.y:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= self.scroll_offset.y + self.size.height:
            self.scroll_to(y=self.cursor - self.size.height + 1, animate=False)

    def action_move(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.size.height - 1))

    def action_jump(self, row: int) -> None:
        self._move_to(row if row >= 0 else len(self._keys) - 1)

    def action_select(self) -> None:
        key = self.selected_key
        if key is not None:
            self.post_message(self.Selected(self, key))
