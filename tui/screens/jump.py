"""`:` — jump to a screen by name, k9s style: `fleet`, `runs`, `node NAME`, `run ID`,
`logs ID`, `help`, `quit`. Tab completes from what the model knows."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static

VIEWS = ("fleet", "nodes", "runs", "run", "node", "logs", "help", "quit")
ALIASES = {
    "f": "fleet",
    "nodes": "fleet",
    "ps": "runs",
    "no": "node",
    "log": "logs",
    "h": "help",
    "q": "quit",
    "q!": "quit",
}


def parse_jump(command: str) -> tuple[str, str]:
    """`:run cpu-ddp` → ("run", "cpu-ddp"); aliases as k9s spells them; "" for nothing."""
    verb, _, arg = command.strip().lstrip(":").partition(" ")
    verb = verb.lower()
    return ALIASES.get(verb, verb), arg.strip()


class JumpScreen(ModalScreen[str | None]):
    CSS_PATH = "jump.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, suggestions: list[str]) -> None:
        super().__init__()
        self.suggestions = [*VIEWS, *suggestions]

    def compose(self) -> ComposeResult:
        with Vertical(id="jump-box"):
            yield Static("jump to: fleet · runs · node NAME · run ID · logs ID · help · quit")
            yield Input(
                placeholder=":",
                id="jump-input",
                suggester=SuggestFromList(self.suggestions, case_sensitive=False),
            )

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
