"""`?` — every key of gputop, the same on every screen, plus the current screen's own."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

GLOBAL_KEYS = [
    ("?", "this help"),
    (":", "jump to a screen: fleet, runs, node NAME, run ID, logs ID"),
    ("/", "filter (search, in logs)"),
    ("↑ ↓ ← → pgup pgdn", "move"),
    ("enter", "drill down: fleet → node, runs → run"),
    ("esc", "back (closes the filter first)"),
    ("s", "stop the selected run (asks first)"),
    ("r", "resume the selected run (asks first)"),
    ("q, ctrl+c", "quit"),
]


class HelpScreen(ModalScreen[None]):
    CSS_PATH = "help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close"),
        Binding("q", "dismiss", "Close"),
    ]

    def __init__(self, screen_name: str, screen_keys: list[tuple[str, str]], readonly: bool):
        super().__init__()
        self.screen_name = screen_name
        self.screen_keys = screen_keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        table.add_row("[b]everywhere[/b]", "")
        for key, what in GLOBAL_KEYS:
            if self.readonly and key in ("s", "r"):
                continue
            table.add_row(key, what)
        if self.screen_keys:
            table.add_row("", "")
            table.add_row(f"[b]{self.screen_name}[/b]", "")
            for key, what in self.screen_keys:
                table.add_row(key, what)
        if self.readonly:
            table.add_row("", "")
            table.add_row("[yellow]read-only[/yellow]", "stop and resume are off (--readonly)")
        with VerticalScroll(id="help-box"):
            yield Static(table)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
