"""The node screen's table: one row per GPU with its main readings, the run that leases
it, and a history."""

from __future__ import annotations

from rich.text import Text

from gpud.model.snapshot import GpuSample
from tui.model import units
from tui.model.fleet import FleetModel
from tui.model.nodes import NodeView, activity_pct, memory_pct, throttle_reasons
from tui.widgets.fleet_table import mem_style, util_style
from tui.widgets.live_table import LiveTable, Row

COLUMNS = [
    ("GPU", "gpu", 4),
    ("UTIL", "util", 5),
    ("SM", "sm", 5),
    ("MEMORY", "mem", 13),
    ("TEMP", "temp", 5),
    ("POWER", "power", 9),
    ("THROTTLE", "throttle", 9),
    ("XID", "xid", 4),
    ("PROCS", "procs", 6),
    ("RUN", "run", 19),
    ("UTIL HISTORY", "history", 17),
]


def holder_cell(model: FleetModel, node: NodeView, gpu: GpuSample) -> Text:
    """The run that leases the GPU (`–`: none), and a quarantine or drain first."""
    held = model.gpu_holder(node.key, gpu.index)
    if gpu.hold is not None:
        mark = Text("QUAR" if gpu.hold.kind == "quarantine" else "DRAIN", style="bold red"
                    if gpu.hold.kind == "quarantine" else "bold magenta")  # fmt: skip
        if held is not None:
            mark.append(f" {held[0].id}", style="cyan")
        return mark
    return Text(held[0].id, style="cyan") if held is not None else Text("–", style="dim")


def gpu_row(model: FleetModel, node: NodeView, gpu: GpuSample) -> Row:
    if gpu.lost:
        lost = Text("LOST", style="bold red")
        return (str(gpu.index), [str(gpu.index), lost, *[""] * (len(COLUMNS) - 2)])
    util = activity_pct(gpu)
    mem = memory_pct(gpu)
    history = node.histories.get(gpu.index)
    spark = units.sparkline(history.util.values(), 16, top=100.0) if history else ""
    reasons = throttle_reasons(gpu)
    power = (
        f"{gpu.power_w:.0f}/{units.number(gpu.power_limit_w, 3)}W"
        if gpu.power_w is not None
        else units.NA
    )
    return (
        str(gpu.index),
        [
            str(gpu.index),
            Text(units.pct(gpu.utilization_gpu_pct, 4), style=util_style(gpu.utilization_gpu_pct)),
            units.pct(gpu.sm_activity_pct, 3),
            Text(
                f"{units.gib(gpu.memory_used_bytes)}/{units.gib(gpu.memory_total_bytes)}"
                f"{units.pct(mem, 5)}",
                style=mem_style(mem),
            ),
            units.NA if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C",
            power,
            Text(
                ",".join(r.replace("_slowdown", "") for r in reasons) or "–",
                style="yellow" if reasons else "dim",
            ),
            Text(
                str(gpu.xid.unacknowledged), style="bold red" if gpu.xid.unacknowledged else "dim"
            ),
            units.NA if gpu.processes is None else str(len(gpu.processes)),
            holder_cell(model, node, gpu),
            Text(spark, style=util_style(util)),
        ],
    )


class GpuTable(LiveTable):
    def __init__(self) -> None:
        super().__init__(COLUMNS, id="gpu-table")

    def show(self, model: FleetModel, node: NodeView) -> None:
        snap = node.snapshot
        self.sync([gpu_row(model, node, g) for g in snap.gpus] if snap is not None else [])
