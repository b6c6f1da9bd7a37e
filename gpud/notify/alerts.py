"""What an alert says: one model (`Alert`, which is also the generic JSON payload), and
the pure functions that make one from what the daemon decided — a run's end, a hang
restart, a stall, a quarantine, a test.

Every alert names the run or GPU, says what happened in one line, carries the cause's hint
where gpud has one, and ends with one gpuctl command to look further.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpud.model.run import CauseKind, FailureCause, RunRecord, RunState, Stall, completed_steps
from gpud.model.snapshot import NodeEvent, Reading, Severity
from gpud.notify.targets import EventKind

#: Bumped when a field changes meaning; receivers can check it.
ALERT_VERSION = 1


class AlertRun(Reading):
    id: str
    name: str
    state: RunState
    attempt: int
    restarts: int
    nodes: int
    last_step: int | None = Field(None, description="steps done, as every view counts them")


class AlertCause(Reading):
    kind: str
    label: str = Field(description="the kind in words: user code, out of memory, ...")
    summary: str = Field(description="what failed, e.g. 'ValueError: bad shard 17'")
    line: str = Field(description="the cause in one line, with rank, node, step and attempt")
    hint: str | None = Field(None, description="what to do about it, for a known failure")


class AlertGpu(Reading):
    index: int
    uuid: str | None = None


class Alert(Reading):
    """One alert, as a webhook of `format: json` receives it."""

    source: Literal["gpud"] = "gpud"
    version: int = ALERT_VERSION
    event: EventKind
    key: str = Field(description="the same key means the same alert: receivers may dedup on it")
    severity: Severity
    title: str = Field(description="e.g. 'run train-3f9a2c (train) failed'")
    text: str = Field(description="what happened, in one line")
    hint: str | None = Field(None, description="what to do about it, when gpud knows")
    node: str = Field(description="the node that sends it (node 0 for a run's events)")
    time: float = Field(description="unix time it happened")
    run: AlertRun | None = None
    cause: AlertCause | None = None
    gpu: AlertGpu | None = None
    look: str = Field(description="a gpuctl command that shows more")


def _run(run: RunRecord) -> AlertRun:
    return AlertRun(
        id=run.id,
        name=run.name,
        state=run.state,
        attempt=run.attempt,
        restarts=run.restarts,
        nodes=len(run.nodes),
        last_step=completed_steps(run.last_step),
    )


def _cause(cause: FailureCause | None) -> AlertCause | None:
    if cause is None:
        return None
    return AlertCause(
        kind=cause.kind.value,
        label=cause.kind.label,
        summary=cause.summary,
        line=cause.one_line(),
        hint=cause.hint,
    )


def gpuctl(address: str, *words: str) -> str:
    """`gpuctl --node ADDRESS WORDS...`: the command an alert ends with."""
    return " ".join(("gpuctl", "--node", address, *words))


def run_key(run: RunRecord, kind: EventKind) -> str:
    return f"{run.id}/{kind.value}/{run.attempt}"


def run_ended(run: RunRecord, node: str, address: str) -> Alert | None:
    """A run that ended failed or succeeded (node 0's record); None for other states."""
    if run.state is RunState.FAILED:
        kind, severity, verb = EventKind.FAILED, "critical", "failed"
    elif run.state is RunState.SUCCEEDED:
        kind, severity, verb = EventKind.SUCCEEDED, "info", "succeeded"
    else:
        return None
    cause = _cause(run.cause) if kind is EventKind.FAILED else None
    text = (cause.line if cause else run.reason) or verb
    return Alert(
        event=kind,
        key=run_key(run, kind),
        severity=severity,
        title=f"run {run.id} ({run.name}) {verb}",
        text=text,
        hint=cause.hint if cause else None,
        node=node,
        time=run.state_since,
        run=_run(run),
        cause=cause,
        look=gpuctl(address, "status", run.id),
    )


def hang_restart(run: RunRecord, node: str, address: str) -> Alert | None:
    """A run node 0 stopped as hung and will restart (it waits in `pending` with the hang
    as its cause); None for anything else. A hang with no restart left ends `failed`."""
    cause = run.cause
    if run.state is not RunState.PENDING or cause is None or cause.kind is not CauseKind.HANG:
        return None
    return Alert(
        event=EventKind.HANG,
        key=f"{run.id}/{EventKind.HANG.value}/{cause.attempt or run.attempt}",
        severity="warning",
        title=f"run {run.id} ({run.name}) hung; restarting",
        text=run.reason or cause.one_line(),  # the cause's line, then when it restarts
        hint=cause.hint,
        node=node,
        time=run.state_since,
        run=_run(run),
        cause=_cause(cause),
        look=gpuctl(address, "status", run.id),
    )


def stalled(run: RunRecord, stall: Stall, node: str, address: str, now: float) -> Alert:
    """A run whose health has said stalled for a while (still running)."""
    who = f"rank {stall.rank}" if stall.rank is not None else "every rank"
    hang = (run.spec.get("restart") or {}).get("hang_timeout_s")
    hint = (
        f"gpud stops it as a hang at {hang:g}s (restart.hang_timeout_s)"
        if hang
        else f"the collective timeout ends it in {stall.countdown_s:.0f}s; gpuctl stop"
        " it, or set restart.hang_timeout_s to have gpud restart hung runs"
    )
    return Alert(
        event=EventKind.STALLED,
        key=run_key(run, EventKind.STALLED),
        severity="warning",
        title=f"run {run.id} ({run.name}) stalled for {stall.stuck_for_s:.0f}s",
        text=f"{who}: {stall.why}",
        hint=hint,
        node=node,
        time=now,
        run=_run(run),
        look=gpuctl(address, "health", run.id),
    )


def quarantined(event: NodeEvent, address: str, run: RunRecord | None = None) -> Alert:
    """gpud quarantined a GPU of this node (`run`: one of the runs it stopped, for that
    run's own webhooks)."""
    uuid = event.data.get("uuid")
    index = event.gpu_index
    gpu = AlertGpu(index=index, uuid=str(uuid) if uuid else None) if index is not None else None
    again = f" --gpu {index}" if index is not None else ""
    stopped = f"; run {run.id} ({run.name}) on it stops with its checkpoint" if run else ""
    return Alert(
        event=EventKind.QUARANTINE,
        key=f"{event.node}/{EventKind.QUARANTINE.value}/{uuid or index}/{event.time:.0f}",
        severity="critical",
        title=f"{event.node}: GPU {index} quarantined",
        text=event.message + stopped,
        hint=f"check the GPU (nvidia-smi -q, a reset or a replacement), then gpuctl undrain"
        f" {event.node}{again}",
        node=event.node,
        time=event.time,
        run=_run(run) if run else None,
        gpu=gpu,
        look=gpuctl(address, "hw"),
    )


def test_alert(node: str, address: str, now: float) -> Alert:
    return Alert(
        event=EventKind.TEST,
        key=f"{node}/{EventKind.TEST.value}/{now:.3f}",
        severity="info",
        title=f"{node}: a test alert from gpud",
        text="gpuctl notify test: this webhook receives gpud's alerts",
        node=node,
        time=now,
        look=gpuctl(address, "notify", "test"),
    )
