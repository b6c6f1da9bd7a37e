"""Run: the loss curve over every attempt (other metrics with `m`), learning rate and
throughput, the NCCL health panel, and the tail of the logs (`l` opens them in full)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer

from tui.messages import ShowLogs
from tui.model.fleet import FleetModel
from tui.model.runs import RunView
from tui.screens.live import LiveScreen
from tui.widgets.health_panel import HealthPanel
from tui.widgets.log_tail import LogTail
from tui.widgets.loss_chart import LossChart
from tui.widgets.run_header import RunHeader
from tui.widgets.title_bar import TitleBar


class RunScreen(LiveScreen):
    VIEW = "run"
    CSS_PATH = "run.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "metric(1)", "Next metric"),
        Binding("M", "metric(-1)", "Prev metric", show=False),
        Binding("l", "logs", "Logs"),
    ]

    def __init__(self, model: FleetModel, run_id: str) -> None:
        """`run_id` may also be a run's name or an id prefix (`gputop --run NAME`): until the
        model knows a run by that id, the screen takes the run the reference names once one
        shows up (a name: its newest run), as `:run` does."""
        super().__init__(model)
        self.run_id = run_id
        self.metric = "loss"

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield RunHeader(id="run-header")
        with Horizontal(id="run-body"):
            yield LossChart(id="loss-chart")
            with VerticalScroll(id="health-scroll"):
                yield HealthPanel(id="health-panel")
        yield LogTail(id="log-tail")
        yield Footer()

    def on_mount(self) -> None:
        self.model.focus(self.run_id)
        self.refresh_model()

    def on_unmount(self) -> None:
        self.model.unfocus(self.run_id)

    def on_resize(self) -> None:
        if self.ready:
            self.refresh_model()

    def refresh_model(self) -> None:
        with self.model.lock:
            run = self.model.runs.get(self.run_id)
            if run is None or not run.known:
                run = self._resolve()
            readonly = getattr(self.app, "readonly", False)
            self.query_one(TitleBar).show(["Runs", self.run_id], readonly=readonly)
            if run is None:
                self.query_one(RunHeader).update(f"{self.run_id}: not known (yet)")
                return
            names = run.metric_names()
            if names and self.metric not in names:
                self.metric = names[0]
            self.query_one(RunHeader).show(run, self.metric, self.model.efficiency(run))
            self.query_one(LossChart).show(run, self.metric)
            self.query_one(HealthPanel).show(run)
            tail = self.query_one(LogTail)
            tail.show(run, max(1, tail.size.height))

    def _resolve(self) -> RunView | None:
        """Follow `run_id` as a name or prefix to a known run, if it names one now."""
        found = self.model.find_run(self.run_id)
        if found is not None and found != self.run_id:
            self.model.unfocus(self.run_id)
            self.model.focus(found)
            self.run_id = found
        return self.model.runs.get(self.run_id)

    def action_metric(self, delta: int) -> None:
        with self.model.lock:
            run = self.model.runs.get(self.run_id)
            names = run.metric_names() if run is not None else []
        if not names:
            return
        index = names.index(self.metric) if self.metric in names else 0
        self.metric = names[(index + delta) % len(names)]
        self.refresh_model()

    def action_logs(self) -> None:
        self.post_message(ShowLogs(self.run_id))

    def selected_run(self) -> str | None:
        return self.run_id
