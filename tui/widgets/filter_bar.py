"""The `/` bar: an input at the bottom of a screen that narrows what the screen shows.

Typing filters live; enter keeps the filter and hands focus back; esc clears it.
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input


class FilterBar(Input):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "clear", "Clear filter", show=False)]

    class Applied(Message):
        def __init__(self, value: str) -> None:
            super().__init__()
            self.value = value

    def __init__(self, placeholder: str = "filter") -> None:
        super().__init__(placeholder=f"/ {placeholder}", classes="filter-bar")
        self.display = False

    def open(self) -> None:
        self.display = True
        self.focus()

    def action_clear(self) -> None:
        self.value = ""
        self.display = False
        self.post_message(self.Applied(""))
        self.screen.focus_next()

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Applied(event.value))

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.value:
            self.display = False
        self.screen.focus_next()
