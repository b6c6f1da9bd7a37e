"""Read-only views of runs: status, lists, logs, metric history, health.

Functions over the supervisor's records and store; they change nothing, so the control
handlers can call them inline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpud.auth import Caller
from gpud.protocol import (
    ErrorCode,
    ListRequest,
    LogChunk,
    LogsRequest,
    MetricRow,
    MetricsReply,
    MetricsRequest,
    PartHealth,
    PartStatusRequest,
    ProtocolError,
    RunList,
    RunRef,
    RunStatus,
)
from gpud.runmodel import AttemptRecord, HealthSummary, RunRecord, RunState
from gpud.runs import gang
from gpud.runs.logread import read_chunk

if TYPE_CHECKING:
    from gpud.runs.supervisor import Supervisor


def status(sup: Supervisor, req: RunRef) -> RunStatus:
    run = sup.find(req.run)
    view = sup.views.get(run.id)
    return RunStatus(
        run=sup.summary(run),
        attempts=sup.store.attempts(run.id),
        parts=gang.part_views(sup, run, view),
        events=sup.store.run_events(run.id, limit=100),
    )


def list_runs(sup: Supervisor, req: ListRequest) -> RunList:
    runs = sup.store.runs(active_only=req.active_only, limit=req.limit)
    return RunList(runs=[sup.summary(sup.runs.get(r.id, r)) for r in runs])


def health(sup: Supervisor, req: RunRef) -> HealthSummary:
    run = sup.find(req.run)
    cached = sup.telemetry.health.get(run.id)
    if cached is not None and run.state is RunState.RUNNING:
        return cached
    return sup.telemetry.assess(run, sup.parts.get(run.id))


def part_health(sup: Supervisor, req: PartStatusRequest, caller: Caller) -> PartHealth:
    run = sup.find(req.run_id)
    sup._caller_may_coordinate(run, caller)
    return sup.telemetry.part_health(run, sup.parts.get(run.id))


def metrics(sup: Supervisor, req: MetricsRequest) -> MetricsReply:
    run = sup.find(req.run)
    rows: dict[tuple[int, int], MetricRow] = {}
    for attempt, step, when, name, value in sup.store.metrics(run.id, req.name, req.limit):
        if req.attempt is not None and attempt != req.attempt:
            continue
        row = rows.get((attempt, step))
        if row is None:
            row = rows[(attempt, step)] = MetricRow(
                attempt=attempt, step=step, time=when, values={}
            )
        row.values[name] = value
    ordered = [rows[key] for key in sorted(rows)]
    starts: dict[int, int] = {}
    for row in ordered:
        starts.setdefault(row.attempt, row.step)
    return MetricsReply(
        run_id=run.id,
        rows=ordered,
        resumed_at=[step for attempt, step in sorted(starts.items()) if attempt > 1],
    )


def logs(sup: Supervisor, req: LogsRequest) -> LogChunk:
    run = sup.find(req.run)
    attempts = sup.store.attempts(run.id)
    if not attempts:
        raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt here yet")
    wanted = req.attempt or attempts[-1].attempt
    record = next((a for a in attempts if a.attempt == wanted), None)
    if record is None:
        raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt {wanted}")
    part = sup.parts.get(run.id)
    if part is not None and part.record.attempt == wanted:
        record = part.record
    local_rank = None
    if req.rank is not None:
        local_rank = req.rank - run.node_rank * record.nproc
        if not 0 <= local_rank < record.nproc:
            return _empty_chunk(run, record, sup.node)
    return read_chunk(run, record, sup.node, req, local_rank)


def _empty_chunk(run: RunRecord, record: AttemptRecord, node: str) -> LogChunk:
    return LogChunk(
        run_id=run.id,
        node=node,
        node_rank=run.node_rank,
        attempt=record.attempt,
        offset=0,
        next_offset=0,
        size=0,
        lines=[],
        ended=record.state.terminal,
    )
