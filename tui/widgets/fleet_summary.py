"""The fleet's summary row: node and GPU counts, average load, trouble, runs."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.model.fleet import FleetSummary


def summary_text(s: FleetSummary) -> Text:
    text = Text()
    text.append(f"{s.online}/{s.nodes} nodes up", style="bold green" if not s.offline else "bold")
    if s.offline:
        text.append(f" {s.offline} down", style="bold red")
    if s.simulated:
        text.append(f" {s.simulated} sim", style="yellow")
    text.append(" │ ", style="dim")
    text.append(f"{s.gpus} GPUs", style="bold")
    if s.util_pct is not None:
        text.append(f" {s.util_pct:.0f}% util")
    if s.memory_pct is not None:
        text.append(f" {s.memory_pct:.0f}% mem")
    text.append(" │ ", style="dim")
    if s.xid or s.throttled or s.link_errors:
        if s.xid:
            text.append(f"XID {s.xid} ", style="bold red")
        if s.throttled:
            text.append(f"THR {s.throttled} ", style="yellow")
        if s.link_errors:
            text.append(f"link {s.link_errors} ", style="yellow")
    else:
        text.append("hw ok ", style="green")
    text.append("│ ", style="dim")
    text.append(f"runs {s.running} active/{s.runs}")
    return text


class FleetSummaryBar(Static):
    _shown: FleetSummary | None = None

    def show(self, summary: FleetSummary) -> None:
        if summary != self._shown:
            self._shown = summary
            self.update(summary_text(summary))
