"""A drain's question, with the reason it is kept with: Enter confirms, esc cancels."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class ReasonScreen(ModalScreen[str | None]):
    CSS_PATH = "confirm.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, question: str, reason: str) -> None:
        super().__init__()
        self.title_text = title
        self.question = question
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.title_text, id="confirm-title")
            yield Static(self.question, id="confirm-question", markup=False)
            yield Input(self.reason, placeholder="why (kept with the drain)", id="reason")
            yield Static("Enter: drain   esc: cancel", id="confirm-help")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.dismiss(text[:300])

    def action_cancel(self) -> None:
        self.dismiss(None)
