"""Two lines about a run: what it is (state, attempt, launcher and backend, nodes ×
processes) and how it goes (step, loss, learning rate, throughput, ETA); then, while it
has a FLOP rate, its MFU (gpud.efficiency) with its GPUs' SM activity beside it; and when
its spec has a scaling baseline, its efficiency against linear."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from gpud.efficiency.model import flops_text
from gpud.model.run import Attachment
from gpud.scaling.arithmetic import LiveEfficiency
from tui.model import units
from tui.model.runs import RunView
from tui.widgets.runs_table import STATE_STYLES, shape

SPARK = 8


def header_text(run: RunView, metric: str, efficiency: LiveEfficiency | None = None) -> Text:
    text = Text()
    if not run.known:
        text.append(f"{run.id}: waiting for the nodes to report it…", style="dim")
        return text
    s = run.summary
    text.append(s.name, style="bold")
    text.append(" · ")
    text.append(s.state.value, style=STATE_STYLES.get(s.state, ""))
    if s.reason and not s.reason.startswith("attempt "):
        text.append(f" ({s.reason[:60]})", style="dim")
    text.append(f" · attempt {s.attempt}")
    if s.restarts:
        word = "restart" if s.restarts == 1 else "restarts"
        text.append(f" ({s.restarts} {word})", style="yellow")
    if s.attempt > 1 and s.start:
        text.append(f" {_short(s.start)}", style="dim")
    text.append(f" · {s.launcher}")
    backend = run.backend()
    if backend:
        text.append(f"/{backend}", style="bold magenta")
    text.append(f" · {shape(run)} procs")
    if s.elastic and s.members is not None and s.planned_nodes:
        short = len(s.members) < s.planned_nodes
        world = f", world {s.world_size}" if s.world_size else ""
        text.append(
            f" · {len(s.members)}/{s.planned_nodes} nodes{world}",
            style="bold yellow" if short else "",
        )
    if s.attached is not None:
        text.append(f" · {attached_text(s.attached)}", style="bold blue")
    text.append("\n")
    done = run.steps_done()
    text.append("step ", style="cyan")
    text.append("–" if done is None else str(done), style="bold")
    if s.max_steps:
        text.append(f"/{s.max_steps}")
    text.append("  loss ", style="cyan")
    text.append(units.number(run.last_value("loss")), style="bold")
    rate = run.rate()
    if rate is not None:
        text.append(f"  {units.number(rate.value, 3)} {rate.unit}", style="cyan")
        history = run.rate_history()
        if history:
            text.append(" " + units.sparkline(list(history), SPARK).strip(), style="green")
    eta = run.eta_s()
    if eta is not None:
        text.append(f"  ETA {units.duration(eta)}", style="cyan")
    lr = run.recent("lr")
    if lr:
        text.append("  lr ", style="cyan")
        text.append(units.number(run.last_value("lr"), 3))
        text.append(" " + units.sparkline(list(lr), SPARK).strip(), style="magenta")
    if s.last_checkpoint is not None and s.last_checkpoint.step is not None:
        text.append(f"  ckpt @{s.last_checkpoint.step}", style="dim")
    flops_line = mfu_text(run)
    if flops_line is not None:
        text.append("\n")
        text.append_text(flops_line)
    goodput = run.goodput()
    if goodput is not None and goodput.ratio is not None:
        text.append("\n")
        text.append("goodput ", style="cyan")
        text.append(goodput.line(), style="bold" if goodput.ratio >= 0.5 else "bold yellow")
    if efficiency is not None:
        text.append("\n")
        text.append_text(
            efficiency_text(efficiency, "GPUs" if run.parts_hold_gpus() else "processes")
        )
    return text


def mfu_text(run: RunView) -> Text | None:
    """`MFU 41.2% ▂▄▆ · SM active 86% · 1.6 PFLOP/s of 4 × H100 SXM at bf16 · counted`: the
    hardware's view right beside the model's; where MFU is n/a, the FLOP rate with its
    sparkline and why. None without a FLOP rate."""
    flops, mfu = run.mfu()
    if flops is None:
        return None
    full = run.flops()
    values: list[float | None] = list(run.mfu_history())
    spark = " " + units.sparkline(values, SPARK).strip() if len(values) > 1 else ""
    sm = f" · SM active {full.sm_active * 100:.0f}%" if full and full.sm_active is not None else ""
    text = Text()
    if mfu is not None:
        text.append("MFU ", style="cyan")
        text.append(f"{mfu * 100:.1f}%", style="bold")
        text.append(spark, style="green")
        text.append(sm, style="cyan")
        text.append(f" · {flops_text(flops)}")
        if full is not None:
            text.append(f" of {full.gpus} × {full.gpu_model} at {full.dtype}")
    else:
        text.append("FLOP/s ", style="cyan")
        text.append(flops_text(flops), style="bold")
        text.append(spark, style="green")
        text.append(sm, style="cyan")
        text.append(" · MFU n/a", style="cyan")
        if full is not None and full.why_not:
            text.append(f" ({full.why_not})", style="dim")
    if full is not None and full.source is not None:
        text.append(f" · {full.source.replace('_', ' ')}", style="dim")
    return text


def attached_text(attached: Attachment) -> str:
    """`Slurm job 1234 (alice)`: a run gpud watches but did not start."""
    who = attached.user or f"uid {attached.uid}"
    if attached.scheduler == "slurm":
        return f"Slurm job {attached.job_id or '?'} ({who})"
    return f"{attached.scheduler} ({who})"


def efficiency_text(live: LiveEfficiency, devices: str) -> Text:
    """`efficiency 87% of linear at 8 GPUs`, and what it is against."""
    text = Text()
    pct = live.efficiency * 100
    style = "green" if pct >= 85 else ("yellow" if pct >= 60 else "red")
    text.append("efficiency ", style="cyan")
    text.append(f"{pct:.0f}%", style=f"bold {style}")
    text.append(f" of linear at {live.world} {devices}")
    baseline = live.baseline
    base = baseline.base
    if live.other_hardware is not None:
        text.append(f"  (baseline from other hardware: {live.other_hardware})", style="yellow")
    elif base is not None and base.throughput is not None:
        day = time.strftime("%Y-%m-%d", time.localtime(baseline.measured_at))
        where = f"{base.world} process{'es' if base.world > 1 else ''}"
        text.append(
            f"  (baseline {_rate(base.throughput)} {base.unit} at {where}, {day})",
            style="dim",
        )
    return text


def _rate(value: float) -> str:
    """`19,320` (as gpuctl scaling prints it), `2.5` for small ones."""
    return f"{value:,.0f}" if value >= 100 else units.number(value, 3)


def _short(start: str, width: int = 48) -> str:
    """`from /long/path/ckpt/step_00000029.pt (step 29)`, cut at the front to fit."""
    return start if len(start) <= width else "from …" + start[-(width - 6) :]


class RunHeader(Static):
    _key: tuple[object, ...] | None = None

    def show(self, run: RunView, metric: str, efficiency: LiveEfficiency | None = None) -> None:
        # A live run's goodput moves with the clock, not only with its records.
        second = int(time.time()) if run.active else None
        key = (run.id, run.version, metric, efficiency, second)
        if key != self._key:
            self._key = key
            self.update(header_text(run, metric, efficiency))
