"""Runs: every run on every node; enter opens one, `s` and `r` act on the selected one."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable, Footer

from tui.messages import ShowRun
from tui.screens.live import LiveScreen
from tui.widgets.filter_bar import FilterBar
from tui.widgets.runs_table import RunsTable
from tui.widgets.title_bar import TitleBar


class RunsScreen(LiveScreen):
    VIEW = "runs"
    CSS_PATH = "runs.tcss"

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield RunsTable()
        yield FilterBar("run id, name or state")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_model()
        self.query_one(RunsTable).focus()

    def refresh_model(self) -> None:
        with self.model.lock:
            self.query_one(RunsTable).show(self.model, self.query_one(FilterBar).value)
            active = sum(1 for r in self.model.runs.values() if r.active)
            total = sum(1 for r in self.model.runs.values() if r.known)
        self.query_one(TitleBar).show(
            ["Runs"], f"{active} active of {total}", getattr(self.app, "readonly", False)
        )

    def apply_filter(self, text: str) -> None:
        self.refresh_model()

    def selected_run(self) -> str | None:
        return self.query_one(RunsTable).selected_key

    @on(DataTable.RowSelected, "#runs-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(ShowRun(event.row_key.value))
