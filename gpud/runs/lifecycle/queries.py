"""Read-only views of runs: status, lists, logs, metric history, health.

Over the run book, the gang's views and telemetry; they change nothing, so the control
handlers call them inline.
"""

from __future__ import annotations

from gpud.efficiency.model import RunFlops
from gpud.model.run import TRAINING, AttemptRecord, HealthSummary, RunRecord, RunState
from gpud.retention.rows import stored_usage
from gpud.retention.usage import RunUsage
from gpud.runs.diagnosis.logread import read_chunk
from gpud.runs.health.goodput import GoodputKeeper
from gpud.runs.health.telemetry import Telemetry
from gpud.runs.multinode.gang import Gang
from gpud.runs.state.book import RunBook, check_coordinator
from gpud.security.auth import Caller
from gpud.wire.brief import ENDED_KEPT_MAX, ENDED_KEPT_S
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.node_messages import UsageReply, UsageRequest
from gpud.wire.run_messages import (
    ListRequest,
    LogChunk,
    LogsRequest,
    MetricRow,
    MetricsReply,
    MetricsRequest,
    PartHealth,
    PartStatusRequest,
    RunList,
    RunRef,
    RunStatus,
    RunSummary,
    metrics_reply,
)

#: The newest run records `node.usage` reads (retention keeps fewer by default).
USAGE_RUNS_MAX = 100_000


class Queries:
    def __init__(
        self, book: RunBook, gang: Gang, telemetry: Telemetry, goodput: GoodputKeeper
    ) -> None:
        self.book = book
        self.gang = gang
        self.telemetry = telemetry
        self.goodput = goodput

    def status(self, req: RunRef) -> RunStatus:
        run = self.book.find(req.run)
        return RunStatus(
            run=self.book.summary(run),
            attempts=self.book.store.attempts(run.id),
            parts=self.gang.part_views(run),
            events=self.book.store.run_events(run.id, limit=100),
            flops=self._flops(run),
            goodput=self.goodput.of(run, self.book.clock()),
        )

    def _flops(self, run: RunRecord) -> RunFlops | None:
        """Node 0's latest FLOP rate and MFU of a run that trains now."""
        if not run.is_coordinator or run.state not in TRAINING:
            return None
        health = self.telemetry.health.get(run.id)
        return health.flops if health else None

    def usage(self, req: UsageRequest) -> UsageReply:
        """Each run's use of this node since `req.since`: the live and stored runs', read
        now (node 0's goodput as of now), and the rows retention left of removed ones."""
        store, now = self.book.store, self.book.clock()
        found = [RunUsage.model_validate_json(body) for body in store.usage_rows(req.since)]
        removed = {row.run_id for row in found}
        for stored in store.runs(limit=USAGE_RUNS_MAX):
            if stored.id in removed or (stored.state.terminal and stored.state_since < req.since):
                continue
            run = self.book.get(stored.id) or stored
            if run.is_coordinator:
                run = run.model_copy(update={"goodput": self.goodput.of(run, now)})
            found.append(stored_usage(store, run, now))
        return UsageReply(node=self.book.node, now=now, runs=found)

    def list_runs(self, req: ListRequest) -> RunList:
        store = self.book.store
        runs = store.runs(active_only=req.active_only, limit=req.limit)
        # Runs waiting in memory for a full disk are listed but not yet counted on disk.
        total = max(store.count_runs(active_only=req.active_only), len(runs))
        return RunList(
            runs=[self.book.summary(self.book.get(r.id) or r) for r in runs], total=total
        )

    def on_this_node(self, now: float) -> list[tuple[RunSummary, HealthSummary | None]]:
        """The runs a node brief names: active here, or ended within `ENDED_KEPT_S`; with
        node 0's latest health."""
        live = [r for r in self.book.ticked() if not r.state.terminal]
        ended = self.book.ended_since(now - ENDED_KEPT_S)[:ENDED_KEPT_MAX]
        found = []
        for run in live + ended:
            health = self.telemetry.health.get(run.id) if run.is_coordinator else None
            found.append((self.book.summary(run), health))
        return found

    def health(self, req: RunRef) -> HealthSummary:
        run = self.book.find(req.run)
        cached = self.telemetry.health.get(run.id)
        if cached is not None and run.state is RunState.RUNNING:
            return cached
        return self.telemetry.assess(run, self.book.part(run.id))

    def part_health(self, req: PartStatusRequest, caller: Caller) -> PartHealth:
        run = self.book.find(req.run_id)
        check_coordinator(run, caller)
        return self.telemetry.part_health(run, self.book.part(run.id))

    def metrics(self, req: MetricsRequest) -> MetricsReply:
        run = self.book.find(req.run)
        rows: dict[tuple[int, int], MetricRow] = {}
        for attempt, step, when, name, value in self.book.store.metrics(
            run.id, req.name, req.limit
        ):
            if req.attempt is not None and attempt != req.attempt:
                continue
            row = rows.get((attempt, step))
            if row is None:
                row = rows[(attempt, step)] = MetricRow(
                    attempt=attempt, step=step, time=when, values={}
                )
            row.values[name] = value
        return metrics_reply(run.id, rows)

    def logs(self, req: LogsRequest) -> LogChunk:
        run = self.book.find(req.run)
        attempts = self.book.store.attempts(run.id)
        if not attempts:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt here yet")
        wanted = req.attempt or attempts[-1].attempt
        record = next((a for a in attempts if a.attempt == wanted), None)
        if record is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt {wanted}")
        part = self.book.part(run.id)
        if part is not None and part.record.attempt == wanted:
            record = part.record
        local_rank = None
        if req.rank is not None:
            local_rank = req.rank - run.node_rank * record.nproc
            if not 0 <= local_rank < record.nproc:
                return _empty_chunk(run, record, self.book.node)
        return read_chunk(run, record, self.book.node, req, local_rank)


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
