"""Node: every GPU of one node, its history sparklines, every field, and its processes
mapped to run and rank."""

from __future__ import annotations

import getpass
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Static

from gpud.wire.client import ClientError
from tui.model import units
from tui.model.actions import ActionRefused
from tui.model.fleet import FleetModel
from tui.model.holds import HoldPlan, perform_hold, plan_hold
from tui.model.nodes import NodeView
from tui.screens.confirm import ConfirmScreen
from tui.screens.live import LiveScreen
from tui.screens.reason import ReasonScreen
from tui.widgets.gpu_detail import GpuDetail
from tui.widgets.gpu_history import GpuHistoryPanel
from tui.widgets.gpu_table import GpuTable
from tui.widgets.title_bar import TitleBar


def node_info_text(node: NodeView, online: bool, now_wall: float) -> Text:
    text = Text()
    text.append("online" if online else "offline", style="bold green" if online else "bold red")
    if node.simulated:
        text.append("  SIMULATED GPUs", style="bold yellow")
    text.append(f"  {node.label}", style="dim")
    snap = node.snapshot
    if snap is not None:
        text.append(f"  {snap.backend} driver {snap.driver_version or units.NA}")
        if snap.cuda_driver_version:
            text.append(f" CUDA {snap.cuda_driver_version}")
        host = snap.host
        text.append(
            f"\nhost {host.hostname}: {host.cpu_count_logical} CPUs {units.pct(host.cpu_percent)}"
            f" load {units.number(host.load_1m, 3)}"
            f"  RAM {units.bytes_(host.memory_used_bytes)}/{units.bytes_(host.memory_total_bytes)}"
        )
    if node.info is not None:
        uptime = now_wall - node.info.started_at
        text.append(f"  gpud {node.info.version}, up {units.duration(uptime)}")
    if snap is not None and snap.drained is not None:
        held = snap.drained
        text.append(
            f"\nDRAINED by {held.by or 'an operator'}: {held.reason} (no new runs; u undrains)",
            style="bold magenta",
        )
    for gpu in snap.gpus if snap is not None else ():
        if gpu.hold is not None:
            kind = "QUARANTINED" if gpu.hold.kind == "quarantine" else "drained"
            by = f" by {gpu.hold.by}" if gpu.hold.by else ""
            text.append(
                f"\nGPU {gpu.index} {kind}{by}: {gpu.hold.reason}",
                style="bold red" if gpu.hold.kind == "quarantine" else "magenta",
            )
    if node.error and not online:
        text.append(f"\n{node.error}", style="red")
    recent = list(node.events)[-3:]
    for event in recent:
        style = {"critical": "bold red", "warning": "yellow"}.get(event.severity, "dim")
        text.append(f"\n! {event.message}", style=style)
    return text


class NodeScreen(LiveScreen):
    VIEW = "node"
    CSS_PATH = "node.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "hold('drain', False)", "Drain GPU"),
        Binding("D", "hold('drain', True)", "Drain node"),
        Binding("u", "hold('undrain', False)", "Undrain GPU"),
        Binding("U", "hold('undrain', True)", "Undrain node"),
    ]

    def __init__(self, model: FleetModel, key: str) -> None:
        super().__init__(model)
        self.key = key
        self._info_key: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield Static(id="node-info")
        yield GpuTable()
        with Horizontal(id="gpu-panels"):
            yield GpuHistoryPanel(id="gpu-history")
            with VerticalScroll(id="gpu-detail-scroll"):
                yield GpuDetail(id="gpu-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.model.focus_node(self.key)  # its full snapshots, while this screen is open
        self.refresh_model()
        self.query_one(GpuTable).focus()

    def on_unmount(self) -> None:
        self.model.unfocus_node(self.key)

    def _selected_gpu(self) -> int | None:
        key = self.query_one(GpuTable).selected_key
        return int(key) if key is not None else None

    def refresh_model(self) -> None:
        node = self.model.node(self.key)
        if node is None:
            return
        with self.model.lock:
            online = node.online(self.model.clock())
            self.query_one(TitleBar).show(
                ["Fleet", node.name], readonly=getattr(self.app, "readonly", False)
            )
            now_wall = self.model.wall()
            info_key = (node.version, online, node.error, node.info is None, int(now_wall))
            if info_key != self._info_key:
                self._info_key = info_key
                text = node_info_text(node, online, now_wall)
                self.query_one("#node-info", Static).update(text)
            self.query_one(GpuTable).show(self.model, node)
            index = self._selected_gpu()
            if index is None and node.snapshot is not None and node.snapshot.gpus:
                index = node.snapshot.gpus[0].index
            self.query_one(GpuHistoryPanel).show(node, index)
            self.query_one(GpuDetail).show(self.model, node, index)

    @on(DataTable.RowHighlighted, "#gpu-table")
    def _gpu_moved(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_model()

    def selected_run(self) -> str | None:
        with self.model.lock:
            active = [r for r in self.model.runs_on(self.key) if r.active]
            return active[0].id if len(active) == 1 else None

    # ------------------------------------------------------------------ drain, undrain

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # --readonly: no drains either (and they leave the footer).
        return not (action == "hold" and getattr(self.app, "readonly", False))

    def action_hold(self, verb: str, whole_node: bool) -> None:
        """`d`/`u` the selected GPU, `D`/`U` the node: asked first, as every action is."""
        gpu = None if whole_node else self._selected_gpu()
        if not whole_node and gpu is None:
            self.notify("select a GPU first", severity="warning", timeout=4)
            return
        try:
            plan = plan_hold(self.model, verb, self.key, gpu)
        except ActionRefused as exc:
            self.notify(str(exc), severity="warning", timeout=5)
            return

        def answered(reason: str | bool | None) -> None:
            if reason:
                self.notify(f"{verb} {plan.what}: asking {plan.target.label}…", timeout=3)
                self.send_hold(plan, reason if isinstance(reason, str) else "")

        if verb == "drain":
            default = f"drained from gputop by {getpass.getuser()}"
            self.app.push_screen(ReasonScreen(f"Drain {plan.what}?", plan.question, default),
                                 answered)  # fmt: skip
        else:
            self.app.push_screen(ConfirmScreen(f"Undrain {plan.what}?", plan.question), answered)

    @work(thread=True, exit_on_error=False, group="holds")
    def send_hold(self, plan: HoldPlan, reason: str) -> None:
        factory: Any = getattr(self.app, "client_factory", None)
        try:
            reply = perform_hold(plan, reason, factory)
        except ClientError as exc:
            self.app.call_from_thread(self._told, f"{plan.verb} {plan.what} failed: {exc}", "error")
            return
        except Exception as exc:  # never let an action take the UI down
            self.app.call_from_thread(
                self._told, f"{plan.verb} {plan.what} failed: {type(exc).__name__}: {exc}", "error"
            )
            return
        held = [f"GPU {g.index} {g.hold.kind}" for g in reply.gpus]
        state = f"drained ({reply.drained.reason})" if reply.drained else "takes new runs"
        notes = "; ".join([*held, *reply.notes])
        self.app.call_from_thread(
            self._told, f"{plan.verb} {plan.what}: {reply.node} {state}"
            + (f"; {notes}" if notes else ""), "information",
        )  # fmt: skip

    def _told(self, message: str, severity: Any) -> None:
        self.notify(message, severity=severity, timeout=8, markup=False)
