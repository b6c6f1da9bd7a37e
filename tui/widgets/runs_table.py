"""Every run across the nodes: state (with its place in the queue), nodes × processes, step,
loss, rate, ETA, health verdict, MFU, attempt, the GPUs it holds, age."""

from __future__ import annotations

from rich.text import Text

from gpud.model.run import NO_HEARTBEATS_WORD, RunState, steps_text
from tui.model import units
from tui.model.fleet import FleetModel
from tui.model.runs import RunView
from tui.widgets.live_table import LiveTable, Row

#: What matters most comes first, within 80 columns: how far, how well, how fast.
COLUMNS = [
    ("RUN", "run", 19),
    ("STATE", "state", 10),
    ("N×P", "shape", 5),
    ("STEP", "step", None),
    ("LOSS", "loss", 10),  # -1.23e-04 and a gap
    ("RATE", "rate", None),
    ("ETA", "eta", 6),
    ("HEALTH", "health", 9),
    ("MFU", "mfu", 5),
    ("ATT", "attempt", 4),
    ("GPUS", "gpus", 13),
    ("AGE", "age", 7),
]

STATE_STYLES = {
    RunState.RUNNING: "bold green",
    RunState.STARTING: "cyan",
    RunState.PENDING: "cyan",
    RunState.QUEUED: "magenta",
    RunState.STOPPING: "yellow",
    RunState.STOPPED: "dim",
    RunState.SUCCEEDED: "green",
    RunState.FAILED: "bold red",
}
RATE_UNITS = {"steps/s": " st/s", "samples/s": " sa/s", "tokens/s": " tk/s"}
VERDICT_STYLES = {
    "ok": "green",
    "degraded": "yellow",
    "stalled": "bold red",
    "failed": "bold red",
    "idle": "dim",
    NO_HEARTBEATS_WORD: "cyan",  # an `ok` judged from output alone: not vouched for
}


def shape(run: RunView) -> str:
    counts = run.nproc_by_node()
    nodes = len(counts)
    known = {c for c in counts if c is not None}
    if len(known) == 1:
        return f"{nodes}×{known.pop()}"
    if not known:
        return f"{nodes}×?"
    return f"{nodes}×{'/'.join(str(c or '?') for c in counts)}"


def verdict_cell(run: RunView) -> Text:
    """The live health verdict; for a failed run (or one waiting to restart) the class of
    its failure's cause: user, oom, nccl, network, signal, hardware, hang…"""
    s = run.summary
    restarting = s.state is RunState.PENDING and s.next_restart_at is not None
    if s.cause is not None and (s.state is RunState.FAILED or restarting):
        return Text(s.cause.kind.value, style="bold red")
    verdict = run.verdict()
    if verdict is None:
        return Text("–", style="dim")
    return Text(verdict, style=VERDICT_STYLES.get(verdict, ""))


def mfu_cell(run: RunView) -> Text:
    """`41%`; `n/a` where the run has a FLOP rate but no MFU (a CPU run, simulated GPUs,
    a GPU outside the peak table: the Run screen says which); `–` without a FLOP rate."""
    flops, mfu = run.mfu()
    if mfu is not None:
        return Text(f"{mfu * 100:.0f}%", style="bold")
    return Text("n/a" if flops is not None else "–", style="dim")


def run_row(run: RunView, now_wall: float) -> Row:
    s = run.summary
    step_text = steps_text(run.steps_done(), s.max_steps, missing="–")
    rate = run.rate()
    return (
        run.id,
        [
            Text(run.id, style="bold"),
            Text(s.state_label, style=STATE_STYLES.get(s.state, "")),
            shape(run),
            step_text,
            units.number(run.last_value("loss"), 3),
            "–" if rate is None else f"{units.number(rate.value, 3)}{RATE_UNITS[rate.unit]}",
            units.duration(run.eta_s()) if run.active else "–",
            verdict_cell(run),
            mfu_cell(run),
            str(s.attempt),
            Text(run.gpus_text(), style="" if run.active else "dim"),
            units.duration(now_wall - s.created_at),
        ],
    )


class RunsTable(LiveTable):
    def __init__(self) -> None:
        super().__init__(COLUMNS, id="runs-table")

    def show(self, model: FleetModel, needle: str = "") -> None:
        now = model.wall()
        needle = needle.lower()
        rows = [
            run_row(r, now)
            for r in model.sorted_runs()
            if not needle
            or needle in r.id.lower()
            or needle in r.summary.state.value
            or needle in r.summary.name.lower()
        ]
        self.sync(rows)
