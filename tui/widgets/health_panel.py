"""The NCCL health panel of a run: the verdict and the countdown to the collective timeout,
bus bandwidth against its baseline, NCCL warnings, hardware errors on the run's GPUs, and
a grid of every rank (step, heartbeat age, step time) with straggler and stalled marks.

A run that ended shows how it ended instead of a verdict: the health it holds is the last
one published while it ran (it may say stalled, with a countdown), and nothing live about
it is true any more."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from gpud.model.run import FailureCause, GpuTrouble, HealthSummary, RunState, verdict_word
from tui.model import units
from tui.model.runs import Ending, RunView
from tui.widgets.runs_table import STATE_STYLES, VERDICT_STYLES

MAX_RANKS_SHOWN = 256
#: Log lines of a failure's cause the panel shows.
CAUSE_LINES = 6


def ending_text(ending: Ending) -> Text:
    """An ended run's final state, in place of its last live verdict, stall and countdown."""
    style = STATE_STYLES.get(ending.state, "") or "dim"
    text = Text(f" {ending.label} ", style=f"reverse {style}")
    cause = ending.cause
    if cause is not None:
        text.append(f" {cause.kind.label} ", style="bold")
        text.append(f"\n{cause.summary}", style=style)
        text.append(f"\n{_where(cause)}", style="dim")
        for line in cause.lines[-CAUSE_LINES:]:
            text.append(f"\n│ {line}", style="dim")
        for finding in cause.flight_recorder:
            text.append(f"\nflight recorder: {finding}", style="yellow")
        if cause.hint:
            text.append(f"\nhint: {cause.hint}", style="bold cyan")
    elif ending.reason and ending.state is not RunState.SUCCEEDED:
        text.append(f"\n{ending.reason}", style=style)
    text.append("\nthe run ended: no live health", style="dim")
    return text


def _where(cause: FailureCause) -> str:
    """Where and when the cause started: rank, node, step, attempt, and what told us."""
    parts = []
    if cause.rank is not None:
        parts.append(f"rank {cause.rank}")
    if cause.node is not None or cause.node_rank is not None:
        parts.append(f"node {cause.node if cause.node is not None else cause.node_rank}")
    if cause.step is not None:
        parts.append(f"step {cause.step + 1}")
    if cause.attempt is not None:
        parts.append(f"attempt {cause.attempt}")
    if cause.source:
        parts.append(f"from the {cause.source}")
    return ", ".join(parts)


def verdict_text(health: HealthSummary) -> Text:
    """A running run's verdict, why, and a stall's countdown to the collective timeout."""
    text = Text()
    # An `ok` judged from output alone reads NO HEARTBEATS; its first reason says the rest.
    word = verdict_word(health.verdict, health.judged_from_output)
    style = VERDICT_STYLES.get(word, "")
    badge = "no heartbeats" if health.ok_from_output else word
    text.append(" " + badge.upper() + " ", style=f"reverse {style}")
    for reason in health.reasons[:3]:
        text.append(f"\n{reason}", style=style)
    stall = health.stall
    if stall is not None:
        who = f"rank {stall.rank}" if stall.rank is not None else "every rank"
        text.append(f"\nstuck: {who} for {units.duration(stall.stuck_for_s)}", style="bold red")
        text.append(
            f"\ntimeout in {units.duration(stall.countdown_s)}"
            f" (of {units.duration(stall.timeout_s)})",
            style="bold red",
        )
        text.append(f"\n{stall.why}", style="red")
    else:
        text.append("\ncollective timeout: no wait", style="dim")
    return text


def bandwidth_text(health: HealthSummary) -> Text:
    bw = health.bandwidth
    text = Text("busbw ", style="cyan")
    if bw is None:
        text.append("not measured yet", style="dim")
        return text
    text.append(f"{bw.busbw_gbps:.2f} GB/s", style="bold")
    if bw.baseline_gbps:
        ratio = bw.busbw_gbps / bw.baseline_gbps
        text.append(
            f" ({ratio:.0%} of {bw.baseline_gbps:.0f}"
            + (f" {bw.baseline}" if bw.baseline else "")
            + ")",
            style="green" if ratio >= 0.7 else "yellow",
        )
    text.append(f" · {units.bytes_(bw.size_bytes)} at step {bw.step}", style="dim")
    return text


def _counters(t: GpuTrouble) -> list[tuple[str, int]]:
    return [
        ("XID", t.xid),
        ("ECC", t.ecc_uncorrected),
        ("NVLink", t.nvlink_errors),
        ("PCIe replays", t.pcie_replays),
    ]


def trouble_text(health: HealthSummary) -> Text:
    text = Text("NCCL warnings ", style="cyan")
    text.append(str(health.nccl_warnings), style="yellow" if health.nccl_warnings else "green")
    if health.last_nccl_warning:
        text.append(f"\n  {health.last_nccl_warning[:120]}", style="yellow")
    text.append("\nGPU errors ", style="cyan")
    if not health.gpu_trouble:
        text.append("none", style="green")
    for t in health.gpu_trouble:
        # Terser than GpuTrouble.describe(): the panel is narrow.
        parts = [f"{name} {n}" for name, n in _counters(t) if n]
        if t.throttle:
            parts.append("throttle " + ",".join(t.throttle))
        text.append(f"\n  {t.node} GPU {t.gpu_index}: {', '.join(parts)}", style="red")
    return text


def rank_grid(health: HealthSummary, marks: bool = True) -> Text:
    """Step, heartbeat age and step time per rank; S: straggler, ✗: stalled (when `marks`:
    a run that ended has neither).

    Plain fixed-width lines rather than a Rich table: a run of hundreds of ranks redraws
    every second, and a table costs ten times as much to lay out.
    """
    text = Text("RANK  STEP    HB T/STEP  GPU", style="bold", no_wrap=True)
    for rank in health.ranks[:MAX_RANKS_SHOWN]:
        step = "–" if rank.steps_done is None else str(rank.steps_done)
        step_time = "–" if rank.step_time_s is None else f"{rank.step_time_s * 1000:.0f}ms"
        gpu = f"{rank.node_rank}:{'–' if rank.gpu_index is None else rank.gpu_index}"
        text.append(f"\n{rank.rank:>4} {step:>5} ")
        late = rank.heartbeat_age_s is None or rank.heartbeat_age_s > 5
        text.append(f"{units.duration(rank.heartbeat_age_s):>5}", style="red" if late else "")
        text.append(f" {step_time:>6}  {gpu:<4}")
        if marks and rank.stalled:
            text.append(" ✗", style="bold red")
        elif marks and rank.straggler:
            text.append(" S", style="bold yellow")
    if len(health.ranks) > MAX_RANKS_SHOWN:
        text.append(f"\n   … {len(health.ranks) - MAX_RANKS_SHOWN} more ranks", style="dim")
    return text


class HealthPanel(Static):
    _key: tuple[object, ...] | None = None

    def show(self, run: RunView) -> None:
        ending = run.ending()
        key = (run.id, id(run.health), run.known and run.summary.state, ending)
        if key == self._key:
            return
        self._key = key
        health = run.health
        backend = run.backend()
        head = Text("health", style="bold")
        if backend:
            head.append(f" · {backend}", style="bold magenta")
        if health is None:
            self.update(Group(head, Text("no health report yet", style="dim")))
            return
        straggler = Text()
        if health.straggler is not None and ending is None:
            s = health.straggler
            straggler.append(
                f"straggler: rank {s.rank} {s.ratio:.1f}× the median step time", style="yellow"
            )
        self.update(
            Group(
                head,
                verdict_text(health) if ending is None else ending_text(ending),
                bandwidth_text(health),
                trouble_text(health),
                straggler,
                Text(
                    "ranks (S straggler, ✗ stalled; GPU node:index)"
                    if ending is None
                    else "ranks when last heard (GPU node:index)",
                    style="dim",
                ),
                rank_grid(health, marks=ending is None),
            )
        )
