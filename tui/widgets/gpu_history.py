"""History sparklines of one GPU: utilization, memory, power and temperature."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tui.model import units
from tui.model.nodes import NodeView

WIDTH = 24


def history_table(node: NodeView, index: int) -> Table:
    history = node.histories.get(index)
    gpu = next((g for g in node.snapshot.gpus if g.index == index), None) if node.snapshot else None
    table = Table.grid(padding=(0, 1))
    table.add_column(style="cyan", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    if history is None or gpu is None:
        table.add_row("history", Text("none yet", style="dim"), "")
        return table
    power_top = gpu.power_limit_w
    rows = [
        ("util", history.util.values(), 100.0, units.pct(history.util.values()[-1]), "green"),
        (
            "memory",
            history.memory.values(),
            100.0,
            units.pct(history.memory.values()[-1]),
            "magenta",
        ),
        (
            "power",
            history.power.values(),
            power_top,
            units.NA if gpu.power_w is None else f"{gpu.power_w:.0f} W",
            "yellow",
        ),
        (
            "temp",
            history.temperature.values(),
            100.0,
            units.NA if gpu.temperature_c is None else f"{gpu.temperature_c:.0f} °C",
            "red",
        ),
    ]
    for label, values, top, now, style in rows:
        table.add_row(label, Text(units.sparkline(values, WIDTH, top), style=style), now)
    return table


class GpuHistoryPanel(Static):
    _key: tuple[object, ...] | None = None

    def show(self, node: NodeView, index: int | None) -> None:
        key = (node.key, node.version, index)
        if key == self._key:
            return
        self._key = key
        if index is None:
            self.update("")
            return
        self.update(history_table(node, index))
