"""Logs: a run's output from every node, followed live (`f`), filtered by node (`n`) and
rank (`k`), searched with `/`."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Static

from tui.model.fleet import FleetModel
from tui.screens.live import LiveScreen
from tui.widgets.filter_bar import FilterBar
from tui.widgets.log_view import SHOWN_LINES, LogView
from tui.widgets.title_bar import TitleBar


class LogsScreen(LiveScreen):
    VIEW = "logs"
    CSS_PATH = "logs.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "follow", "Follow"),
        Binding("n", "node", "Node"),
        Binding("k", "rank", "Rank"),
        Binding("end", "end", "End", show=False),
    ]

    def __init__(self, model: FleetModel, run_id: str, node_rank: int | None = None) -> None:
        super().__init__(model)
        self.run_id = run_id
        self.node_rank = node_rank
        self.rank: int | None = None
        self.search = ""
        self.follow = True

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield Static(id="logs-filters")
        yield LogView(id="log-view")
        yield FilterBar("search the lines")
        yield Footer()

    def on_mount(self) -> None:
        self.model.focus(self.run_id)
        self.refresh_model()
        self.query_one(LogView).focus()

    def on_unmount(self) -> None:
        self.model.unfocus(self.run_id)

    def _filters_text(self, nodes: list[str]) -> Text:
        text = Text()
        node = (
            "all"
            if self.node_rank is None
            else nodes[self.node_rank]
            if self.node_rank < len(nodes)
            else str(self.node_rank)
        )
        for label, value, key in (
            ("node", node, "n"),
            ("rank", "all" if self.rank is None else str(self.rank), "k"),
            ("search", repr(self.search) if self.search else "–", "/"),
            ("follow", "on" if self.follow else "off", "f"),
        ):
            text.append(f"{label} ", style="cyan")
            text.append(value, style="bold")
            text.append(f" ({key})  ", style="dim")
        return text

    def refresh_model(self) -> None:
        with self.model.lock:
            run = self.model.runs.get(self.run_id)
            nodes = self._node_names()
            lines = (
                run.logs.lines(self.node_rank, self.rank, self.search or None, SHOWN_LINES)
                if run is not None
                else []
            )
        readonly = getattr(self.app, "readonly", False)
        self.query_one(TitleBar).show(["Runs", self.run_id, "logs"], readonly=readonly)
        self.query_one("#logs-filters", Static).update(self._filters_text(nodes))
        view = self.query_one(LogView)
        view.auto_scroll = self.follow
        view.show(lines, (self.node_rank, self.rank, self.search), self.search or None)

    def _node_names(self) -> list[str]:
        run = self.model.runs.get(self.run_id)
        if run is None or not run.known:
            return []
        names = []
        for ref in run.summary.nodes:
            key = self.model.key_of(ref.control)
            node = self.model.nodes.get(key) if key else None
            names.append(node.name if node else ref.name or ref.control.removeprefix("tcp://"))
        return names

    def apply_filter(self, text: str) -> None:
        self.search = text
        self.refresh_model()

    def action_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self.query_one(LogView).scroll_end(animate=False)
        self.refresh_model()

    def action_end(self) -> None:
        self.query_one(LogView).scroll_end(animate=False)

    def action_node(self) -> None:
        with self.model.lock:
            count = len(self._node_names())
        options: list[int | None] = [None, *range(count)]
        self.node_rank = options[(options.index(self.node_rank) + 1) % len(options)]
        self.refresh_model()

    def action_rank(self) -> None:
        with self.model.lock:
            run = self.model.runs.get(self.run_id)
            world = run.world_size() if run is not None else None
            seen = run.logs.ranks() if run is not None else []
        ranks = list(range(world)) if world else seen
        options: list[int | None] = [None, *ranks]
        current = self.rank if self.rank in options else None
        self.rank = options[(options.index(current) + 1) % len(options)]
        self.refresh_model()

    def selected_run(self) -> str | None:
        return self.run_id
