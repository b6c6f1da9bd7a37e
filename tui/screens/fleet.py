"""Fleet: every node at a glance, with a summary row; enter opens a node."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.widgets import Footer, Static

from tui.messages import ShowNode
from tui.screens.live import LiveScreen
from tui.widgets.filter_bar import FilterBar
from tui.widgets.fleet_summary import FleetSummaryBar
from tui.widgets.fleet_table import GROUP_PREFIX, FleetTable
from tui.widgets.row_list import RowList
from tui.widgets.title_bar import TitleBar


class FleetScreen(LiveScreen):
    VIEW = "fleet"
    CSS_PATH = "fleet.tcss"

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield FleetSummaryBar(id="fleet-summary")
        yield Static(id="fleet-header")
        yield FleetTable()
        yield FilterBar("node, group or run")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_model()
        self.query_one(FleetTable).focus()

    def refresh_model(self) -> None:
        readonly = getattr(self.app, "readonly", False)
        bar = self.query_one(FilterBar)
        with self.model.lock:
            self.query_one(FleetSummaryBar).show(self.model.summary())
            table = self.query_one(FleetTable)
            table.show(self.model, bar.value)
        header = self.query_one("#fleet-header", Static)
        if header.content != table.header:
            header.update(table.header)
        self.query_one(TitleBar).show(["Fleet"], readonly=readonly)

    def apply_filter(self, text: str) -> None:
        self.refresh_model()

    def selected_run(self) -> str | None:
        key = self.query_one(FleetTable).selected_key
        if key is None or key.startswith(GROUP_PREFIX):
            return None
        with self.model.lock:
            active = [r for r in self.model.runs_on(key) if r.active]
            return active[0].id if len(active) == 1 else None

    @on(RowList.Selected, "#fleet-table")
    def _open(self, event: RowList.Selected) -> None:
        key = event.key
        if key.startswith(GROUP_PREFIX):
            table = self.query_one(FleetTable)
            table.toggle(key)
            self.refresh_model()
            return
        self.post_message(ShowNode(key))
