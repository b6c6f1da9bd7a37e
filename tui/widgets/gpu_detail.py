"""Every sampled field of one GPU, and the processes on it mapped to run and rank.

The fields come from `GpuSample` itself, in its order, so a field the daemon adds shows
up here without a change; a field the GPU does not offer reads `n/a`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from gpud.model.snapshot import GpuSample, PodRef
from tui.model import units
from tui.model.fleet import FleetModel
from tui.model.nodes import NodeView

SKIPPED = {"index", "nvlinks", "xid", "processes", "pod"}


def field_value(name: str, value: Any) -> str:
    if value is None:
        return units.NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name.endswith("_bytes_per_s"):
        return units.rate(value)
    if name.endswith("_bytes"):
        return units.bytes_(value)
    if name.endswith("_pct"):
        return f"{value:.1f}%"
    if name.endswith("_w"):
        return f"{value:.1f} W"
    if name.endswith("_c"):
        return f"{value:.1f} °C"
    if name.endswith("_mhz"):
        return f"{value} MHz"
    if name.endswith("_mj"):
        return f"{value / 3.6e9:,.2f} kWh"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def fields_table(gpu: GpuSample) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="cyan", no_wrap=True)
    table.add_column()
    for name in type(gpu).model_fields:
        if name in SKIPPED:
            continue
        value = getattr(gpu, name)
        shown = field_value(name, value)
        table.add_row(name, Text(shown, style="dim" if value is None else ""))
    if gpu.nvlinks is None:
        table.add_row("nvlinks", Text(units.NA, style="dim"))
    else:
        active = sum(1 for link in gpu.nvlinks if link.active)
        tx = sum(link.tx_bytes_per_s or 0 for link in gpu.nvlinks)
        rx = sum(link.rx_bytes_per_s or 0 for link in gpu.nvlinks)
        errors = sum(
            (link.crc_errors or 0) + (link.replay_errors or 0) + (link.recovery_errors or 0)
            for link in gpu.nvlinks
        )
        table.add_row(
            "nvlinks",
            f"{active}/{len(gpu.nvlinks)} active, tx {units.rate(tx)}, rx {units.rate(rx)},"
            f" {errors} errors",
        )
    xid = gpu.xid
    codes = ", ".join(f"{code}×{n}" for code, n in sorted(xid.counts.items())) or "none"
    table.add_row("xid", f"{xid.total} total ({codes}), {xid.unacknowledged} unacknowledged")
    return table


def processes_text(model: FleetModel, node: NodeView, gpu: GpuSample) -> Text:
    """One line per process: pid, name, GPU memory, and the run and rank it belongs to."""
    if gpu.processes is None:
        return Text("processes: n/a", style="dim")
    if not gpu.processes:
        return Text("no processes", style="dim")
    text = Text()
    for i, proc in enumerate(gpu.processes):
        if i:
            text.append("\n")
        text.append(f"pid {proc.pid} ", style="bold")
        text.append(f"{proc.name or units.NA} {units.bytes_(proc.used_memory_bytes)}")
        owner = model.process_owner(node.key, gpu.index, proc.pid)
        if owner is None and proc.pod_uid:
            # On Kubernetes: the pod's name where the kubelet gave this GPU to that pod.
            pod = gpu.pod if gpu.pod is not None and gpu.pod.uid == proc.pod_uid else None
            text.append(" → ")
            text.append((pod or PodRef(uid=proc.pod_uid)).describe(), style="bold magenta")
            continue
        if owner is None:
            text.append(" · no known run", style="dim")
            continue
        text.append(" → ")
        text.append(owner.run_id, style="bold cyan")
        if owner.rank is not None:
            text.append(f" rank {owner.rank} (local {owner.local_rank})")
        if owner.how == "simulated":
            text.append(" [by GPU index]", style="dim")
    return text


class GpuDetail(Static):
    _key: tuple[object, ...] | None = None

    def show(self, model: FleetModel, node: NodeView, index: int | None) -> None:
        key = (node.key, node.version, index, model.version)
        if key == self._key:
            return
        self._key = key
        snap = node.snapshot
        gpu = next((g for g in snap.gpus if g.index == index), None) if snap else None
        if gpu is None:
            self.update(Text("no GPU selected", style="dim"))
            return
        title = Text(f"GPU {gpu.index} · {gpu.name}", style="bold")
        if gpu.simulated:
            title.append("  SIMULATED", style="bold yellow")
        held = model.gpu_holder(node.key, gpu.index)
        if held is not None:
            title.append("  leased to ")
            title.append(held[0].id, style="bold cyan")
            title.append(f" ({held[0].summary.name})")
        elif gpu.pod is not None:
            title.append("  ")
            title.append(gpu.pod.describe(), style="bold magenta")
        self.update(Group(title, processes_text(model, node, gpu), Text(""), fields_table(gpu)))
