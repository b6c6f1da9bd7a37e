"""What the store could not write yet: the writes a full disk refused, kept in memory.

SQLite answers `database or disk is full` (SQLITE_FULL) when the state dir's disk has no
room, and `disk I/O error` when a write failed on the way. Neither must stop the daemon:
the `Store` keeps such writes here, in the order they came, answers reads with them laid
over what is on disk, and writes them when the disk has room again. Records keyed by id
(runs, attempts) keep their latest version only; events and metrics are bounded, the
oldest dropped first and counted (metrics dropped here are read again from the run's
`metrics.jsonl`, which rank 0 writes).

Pure: no SQLite, no I/O.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from dataclasses import dataclass, field

from gpud.model.run import AttemptRecord, MetricPoint, RunEvent, RunRecord
from gpud.model.snapshot import Hold, NodeEvent

#: The most of each kind of row kept in memory while the disk is full.
MAX_RUN_EVENTS = 20_000
MAX_NODE_EVENTS = 2_000
MAX_METRIC_POINTS = 100_000

#: SQLite's primary result codes for "cannot write now" (Python 3.11+ gives them).
SQLITE_IOERR = 10
SQLITE_FULL = 13
_MESSAGES = ("database or disk is full", "disk i/o error")


def cannot_write(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a write for lack of room (or an I/O error on the way):
    what a later retry can get past, unlike a bug in a statement."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (SQLITE_FULL, SQLITE_IOERR)
    return any(message in str(exc).lower() for message in _MESSAGES)


@dataclass(frozen=True)
class PortLease:
    port: int
    run_id: str
    attempt: int
    leased_at: float


@dataclass(frozen=True)
class PortRelease:
    run_id: str


@dataclass(frozen=True)
class GpuRelease:
    run_id: str
    attempt: int | None


LeaseChange = PortLease | PortRelease | GpuRelease


@dataclass
class Backlog:
    """Writes waiting for room, in the order they came (per kind)."""

    runs: dict[str, RunRecord] = field(default_factory=dict)
    attempts: dict[tuple[str, int], AttemptRecord] = field(default_factory=dict)
    run_events: deque[RunEvent] = field(default_factory=lambda: deque(maxlen=MAX_RUN_EVENTS))
    node_events: deque[NodeEvent] = field(default_factory=lambda: deque(maxlen=MAX_NODE_EVENTS))
    metrics: deque[MetricPoint] = field(default_factory=lambda: deque(maxlen=MAX_METRIC_POINTS))
    leases: list[LeaseChange] = field(default_factory=list)
    #: Quarantines and drains by target (a GPU's UUID or the node): None is a lifted one.
    holds: dict[str, tuple[int | None, Hold | None]] = field(default_factory=dict)
    #: Dropped for want of room in memory too (counted for the log).
    dropped_events: int = 0
    #: Runs whose metrics were dropped here: read their metrics.jsonl again.
    metrics_lost: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return (
            len(self.runs)
            + len(self.attempts)
            + len(self.run_events)
            + len(self.node_events)
            + len(self.metrics)
            + len(self.leases)
            + len(self.holds)
        )

    # ------------------------------------------------------------------ adding

    def add_run_events(self, events: list[RunEvent]) -> None:
        self.dropped_events += _overflow(self.run_events, len(events))
        self.run_events.extend(events)

    def add_node_events(self, events: list[NodeEvent]) -> None:
        self.dropped_events += _overflow(self.node_events, len(events))
        self.node_events.extend(events)

    def add_metrics(self, points: list[MetricPoint]) -> None:
        over = len(self.metrics) + len(points) - MAX_METRIC_POINTS
        if over > 0:
            lost = (list(self.metrics) + points)[:over]
            self.metrics_lost.update(p.run_id for p in lost)
        self.metrics.extend(points)

    # ------------------------------------------------------------------ reading over

    def over_runs(self, stored: list[RunRecord]) -> list[RunRecord]:
        """`stored` with the waiting versions in their place (and the new ones added)."""
        merged = {run.id: run for run in stored}
        merged.update(self.runs)
        return list(merged.values())

    def over_attempts(self, stored: list[AttemptRecord]) -> list[AttemptRecord]:
        merged = {(a.run_id, a.attempt): a for a in stored}
        merged.update(self.attempts)
        return sorted(merged.values(), key=lambda a: (a.run_id, a.attempt))

    def over_ports(self, stored: dict[int, str]) -> set[int]:
        """The ports leased, from `stored` (port → run) and the waiting changes."""
        holders = dict(stored)
        for change in self.leases:
            if isinstance(change, PortLease):
                holders[change.port] = change.run_id
            elif isinstance(change, PortRelease):
                holders = {port: run for port, run in holders.items() if run != change.run_id}
        return set(holders)

    def released_gpus(self, run_id: str, attempt: int) -> bool:
        """Whether a waiting release gives back that attempt's GPUs."""
        return any(
            isinstance(c, GpuRelease)
            and c.run_id == run_id
            and (c.attempt is None or c.attempt == attempt)
            for c in self.leases
        )


def _overflow(queue: deque[RunEvent] | deque[NodeEvent], adding: int) -> int:
    """How many of the oldest rows `adding` more push out of a bounded queue."""
    assert queue.maxlen is not None
    return max(0, len(queue) + adding - queue.maxlen)
