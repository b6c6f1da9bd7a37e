"""The daemon's SQLite database (WAL): node events, runs, attempts, run events, metrics.

Writes happen on the daemon's event-loop thread only. Rows are read back tolerantly into
the same models they were written from, so an older row never breaks a newer daemon.

A full disk never makes a write raise (except a lease's, which must be on disk before
anything starts: `StoreFull`): what SQLite refuses waits in memory (`gpud.node.backlog`), the
reads see it, and `retry()` writes it once there is room. The log says so once when the
disk fills, once a minute while it stays full, and once when it has room again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gpud import __version__
from gpud.model.run import ACTIVE, AttemptRecord, MetricPoint, RunEvent, RunRecord
from gpud.model.snapshot import Hold, NodeEvent
from gpud.node.backlog import Backlog, GpuRelease, PortLease, PortRelease, cannot_write

log = logging.getLogger("gpud.store")

#: While writes wait, how often they are tried again.
RETRY_S = 1.0
#: While the disk stays full, how often the log says so.
REPORT_S = 60.0
#: Metric points per transaction when the backlog is written.
FLUSH_BATCH = 5_000
#: The WAL file is truncated to this after a checkpoint (a big removal grows it).
WAL_LIMIT_BYTES = 64 * 2**20

#: Schema migrations, applied in order; `PRAGMA user_version` records how many ran (the
#: store's schema version), and `schema_history` (from the 5th on) which gpud ran them and
#: when. A migration only adds: a newer gpud reads an older store after migrating it
#: forward; an older gpud refuses a newer store (`SchemaTooNew`) rather than misread it.
#: Rows are JSON of the models (`RunRecord`, ...), whose added fields have defaults, so an
#: older row reads as it was written.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE node_events (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        severity TEXT NOT NULL,
        gpu_index INTEGER,
        body TEXT NOT NULL
    );
    CREATE INDEX node_events_time ON node_events(time);
    """,
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_at REAL NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX runs_name ON runs(name, created_at);
    CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_id, attempt)
    );
    CREATE TABLE run_events (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX run_events_run ON run_events(run_id, id);
    CREATE TABLE metrics (
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        step INTEGER NOT NULL,
        time REAL NOT NULL,
        name TEXT NOT NULL,
        value REAL NOT NULL,
        PRIMARY KEY (run_id, attempt, step, name)
    );
    CREATE TABLE port_leases (
        port INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        leased_at REAL NOT NULL
    );
    """,
    """
    CREATE TABLE gpu_leases (
        uuid TEXT PRIMARY KEY,
        gpu_index INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        leased_at REAL NOT NULL
    );
    CREATE INDEX gpu_leases_run ON gpu_leases(run_id);
    """,
    """
    CREATE TABLE holds (
        target TEXT PRIMARY KEY,
        gpu_index INTEGER,
        body TEXT NOT NULL
    );
    """,
    # gpud 0.2.0: which gpud migrated the store, from which schema version, and when.
    """
    CREATE TABLE schema_history (
        version INTEGER PRIMARY KEY,
        found INTEGER NOT NULL,
        gpud TEXT NOT NULL,
        migrated_at REAL NOT NULL
    );
    """,
    # Retention (gpud.retention): `gpuctl ps` over 10,000 runs reads the newest by an index;
    # a removed run leaves its usage; `pruning` lists removals under way (finished after a
    # crash); `metrics_thinned` the runs whose old metric points were thinned, and when.
    """
    CREATE INDEX runs_created ON runs(created_at);
    CREATE TABLE run_usage (
        run_id TEXT PRIMARY KEY,
        ended_at REAL,
        body TEXT NOT NULL
    );
    CREATE TABLE pruning (
        run_id TEXT PRIMARY KEY,
        body TEXT NOT NULL
    );
    CREATE TABLE metrics_thinned (
        run_id TEXT PRIMARY KEY,
        attempt INTEGER NOT NULL,
        at REAL NOT NULL
    );
    """,
)
#: The schema version this gpud writes.
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(Exception):
    """The store was written by a newer gpud: this one refuses it rather than misread it."""


class SchemaStep(NamedTuple):
    """One row of `schema_history`: gpud `gpud` moved the store from `found` to `version`."""

    version: int
    found: int
    gpud: str
    migrated_at: float


class GpuLease(NamedTuple):
    """A GPU held by one attempt of a run's part on this node (by UUID: indices can move)."""

    uuid: str
    gpu_index: int
    run_id: str
    attempt: int
    leased_at: float = 0.0


class LeaseConflict(Exception):
    """A GPU asked for is leased already: nothing of the request was leased."""


class StoreFull(Exception):
    """The state dir's disk has no room for a write that cannot wait (a lease)."""


class Store:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        left = _left_by_a_crash(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # The first read replays a WAL a crash left, or rolls back a hot journal.
        if self._db.execute("PRAGMA user_version").fetchone()[0] == 0:
            # A new database takes it before its first page is written; an older one is
            # converted once, at start-up, by gpud.retention.compact (a VACUUM).
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        # After a large removal the WAL is cut back to this, not left at its high mark.
        self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        _report_recovery(path, left)
        self._migrate()
        self._backlog = Backlog()
        #: run → (its newest attempt, the last value of each name that attempt logged)
        self._values_seen: dict[str, tuple[int, dict[str, float]]] = {}
        self._full_since: float | None = None  # wall time of the first refused write
        self._full_error = ""
        self._last_retry = 0.0
        self._last_report = 0.0
        self._announced_at: float | None = None  # when "is full" was last logged
        self._announced = False  # this episode was: its end is logged too
        self._failed_retries = 0

    @property
    def db(self) -> sqlite3.Connection:
        """The connection, for gpud.retention's batched removals (on the loop thread only,
        as every write here)."""
        return self._db

    # ------------------------------------------------------------------ a full disk

    @property
    def full(self) -> str | None:
        """Why writes wait (the disk has no room), in one line; None while they do not."""
        if self._full_since is None:
            return None
        waiting = len(self._backlog)
        return f"the state dir {self.path.parent} is full ({self._full_error})" + (
            f"; {waiting} write(s) wait in memory" if waiting else ""
        )

    @property
    def waiting(self) -> int:
        """Writes that wait in memory for room on the disk."""
        return len(self._backlog)

    def take_metrics_lost(self) -> set[str]:
        """Runs whose waiting metrics were dropped (memory is bounded too): their
        metrics.jsonl must be read again from the start (inserts are idempotent)."""
        lost, self._backlog.metrics_lost = self._backlog.metrics_lost, set()
        return lost

    def _now_or_later(self, write: Callable[[], object]) -> bool:
        """Run `write` now, unless earlier writes still wait (order is kept) or the disk
        refuses it; False: the caller keeps it in the backlog."""
        if self._backlog:
            self.retry()
            if self._backlog:
                return False
        try:
            write()
        except sqlite3.OperationalError as exc:
            if not cannot_write(exc):
                raise
            self._refused(exc)
            return False
        if self._full_since is not None:
            self._recovered(0)
        return True

    def _refused(self, exc: sqlite3.Error) -> None:
        if self._full_since is not None:
            return
        now = self._clock()
        self._full_since = time.time()
        self._full_error = str(exc)
        self._last_retry = now
        # SQLite may find room again in pages it holds while the disk stays full: a disk
        # that fills again within REPORT_S is not announced again.
        if self._announced_at is not None and now - self._announced_at < REPORT_S:
            return
        self._announced_at = self._last_report = now
        self._announced = True
        log.warning(
            "the state dir %s is full (%s): gpud keeps what it cannot write in memory and"
            " tries again every %gs",
            self.path.parent, exc, RETRY_S,
        )  # fmt: skip

    def _recovered(self, written: int) -> None:
        since = self._full_since or time.time()
        self._full_since = None
        self._failed_retries = 0
        if not self._announced:
            return
        self._announced = False
        dropped, self._backlog.dropped_events = self._backlog.dropped_events, 0
        log.warning(
            "the state dir %s has room again after %.0fs: wrote %d waiting write(s)%s",
            self.path.parent, time.time() - since, written,
            f"; {dropped} event(s) did not fit in memory and are lost" if dropped else "",
        )  # fmt: skip

    def retry(self, force: bool = False) -> None:
        """Write what waits, if anything does (at most every RETRY_S unless `force`)."""
        if not self._backlog:
            return
        now = self._clock()
        if not force and now - self._last_retry < RETRY_S:
            return
        self._last_retry = now
        before = len(self._backlog)
        try:
            self._flush()
        except sqlite3.OperationalError as exc:
            if not cannot_write(exc):
                raise
            self._failed_retries += 1
            if now - self._last_report >= REPORT_S:
                self._last_report = now
                log.warning(
                    "the state dir %s is still full: %d write(s) wait in memory"
                    " (%d retries failed; %d event(s) dropped for want of memory)",
                    self.path.parent, len(self._backlog), self._failed_retries,
                    self._backlog.dropped_events,
                )  # fmt: skip
            return
        self._recovered(before)

    def _flush(self) -> None:
        """Write the backlog, a transaction per kind (metrics in batches); what is written
        leaves it, so a refusal half-way loses nothing and repeats nothing."""
        b = self._backlog
        if b.runs:
            with self._db:
                self._db.execute("BEGIN")
                for run in b.runs.values():
                    self._put_run(run)
            b.runs.clear()
        if b.attempts:
            with self._db:
                self._db.execute("BEGIN")
                for attempt in b.attempts.values():
                    self._put_attempt(attempt)
            b.attempts.clear()
        if b.run_events:
            with self._db:
                self._db.execute("BEGIN")
                for event in b.run_events:
                    self._add_run_event(event)
            b.run_events.clear()
        if b.node_events:
            self._add_node_events(list(b.node_events))
            b.node_events.clear()
        while b.leases:
            change = b.leases[0]
            if isinstance(change, PortLease):
                self._lease_port(change.port, change.run_id, change.attempt, change.leased_at)
            elif isinstance(change, PortRelease):
                self._release_ports(change.run_id)
            else:
                self._release_gpus(change.run_id, change.attempt)
            b.leases.pop(0)
        while b.holds:
            target, (index, hold) = next(iter(b.holds.items()))
            self._put_hold(target, index, hold)
            del b.holds[target]
        while b.metrics:
            batch = [b.metrics[i] for i in range(min(FLUSH_BATCH, len(b.metrics)))]
            self._add_metrics(batch)
            for _ in batch:
                b.metrics.popleft()

    def _migrate(self) -> None:
        (found,) = self._db.execute("PRAGMA user_version").fetchone()
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has store schema {found}, written by a newer gpud; this gpud"
                f" ({__version__}) reads schema {SCHEMA_VERSION} and older: run the newer gpud"
                " on this state dir, or this one on another"
            )
        if found == SCHEMA_VERSION:
            return
        # One transaction for every step: a crash midway leaves the store as it was.
        with self._db:
            self._db.execute("BEGIN")
            for number in range(found, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[number]):
                    self._db.execute(statement)
            self._db.execute(
                "INSERT OR REPLACE INTO schema_history (version, found, gpud, migrated_at)"
                " VALUES (?, ?, ?, ?)",
                (SCHEMA_VERSION, found, __version__, time.time()),
            )
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if found:
            log.info("store schema migrated from %d to %d", found, SCHEMA_VERSION)

    @property
    def schema_version(self) -> int:
        """The store's schema version (`PRAGMA user_version`)."""
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def schema_history(self) -> list[SchemaStep]:
        """Each migration of this store since gpud 0.2.0, oldest first."""
        rows = self._db.execute(
            "SELECT version, found, gpud, migrated_at FROM schema_history ORDER BY version"
        ).fetchall()
        return [SchemaStep(*row) for row in rows]

    def add_node_events(self, events: list[NodeEvent]) -> None:
        if events and not self._now_or_later(lambda: self._add_node_events(events)):
            self._backlog.add_node_events(events)

    def _add_node_events(self, events: list[NodeEvent]) -> None:
        if not events:
            return
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO node_events (time, kind, severity, gpu_index, body)"
                " VALUES (?, ?, ?, ?, ?)",
                [(e.time, e.kind, e.severity, e.gpu_index, e.model_dump_json()) for e in events],
            )

    def node_events(self, limit: int, since: float | None = None) -> list[NodeEvent]:
        """The newest `limit` events (after `since`), oldest first."""
        rows = self._db.execute(
            "SELECT body FROM node_events WHERE time > ? ORDER BY id DESC LIMIT ?",
            (since if since is not None else float("-inf"), limit),
        ).fetchall()
        stored = [NodeEvent.model_validate(json.loads(body)) for (body,) in reversed(rows)]
        waiting = [e for e in self._backlog.node_events if since is None or e.time > since]
        return (stored + waiting)[-limit:] if waiting else stored

    # ------------------------------------------------------------------ runs

    def put_run(self, run: RunRecord) -> None:
        if not self._now_or_later(lambda: self._put_run(run)):
            self._backlog.runs[run.id] = run

    def _put_run(self, run: RunRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO runs (id, name, created_at, state, body)"
            " VALUES (?, ?, ?, ?, ?)",
            (run.id, run.name, run.created_at, run.state.value, run.model_dump_json()),
        )

    def run(self, run_id: str) -> RunRecord | None:
        if run_id in self._backlog.runs:
            return self._backlog.runs[run_id]
        row = self._db.execute("SELECT body FROM runs WHERE id = ?", (run_id,)).fetchone()
        return RunRecord.model_validate_json(row[0]) if row else None

    def runs(self, active_only: bool = False, limit: int = 1000) -> list[RunRecord]:
        """Newest first."""
        if active_only:
            active = tuple(s.value for s in ACTIVE)
            rows = self._db.execute(
                f"SELECT body FROM runs WHERE state IN ({_marks(active)})"
                " ORDER BY created_at DESC LIMIT ?",
                (*active, limit),
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT body FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        stored = [RunRecord.model_validate_json(body) for (body,) in rows]
        if not self._backlog.runs:
            return stored
        merged = self._backlog.over_runs(stored)
        if active_only:
            merged = [run for run in merged if run.state in ACTIVE]
        return sorted(merged, key=lambda run: run.created_at, reverse=True)[:limit]

    def usage_rows(self, since: float) -> list[str]:
        """The `run_usage` rows (JSON) of removed runs that ended at or after `since`."""
        rows = self._db.execute(
            "SELECT body FROM run_usage WHERE ended_at IS NULL OR ended_at >= ?", (since,)
        ).fetchall()
        return [body for (body,) in rows]

    def count_runs(self, active_only: bool = False) -> int:
        """Run records on disk (`gpud_state_runs`), or only those not ended."""
        if active_only:
            active = tuple(s.value for s in ACTIVE)
            (count,) = self._db.execute(
                f"SELECT count(*) FROM runs WHERE state IN ({_marks(active)})", active
            ).fetchone()
        else:
            (count,) = self._db.execute("SELECT count(*) FROM runs").fetchone()
        return int(count)

    def put_attempt(self, attempt: AttemptRecord) -> None:
        if not self._now_or_later(lambda: self._put_attempt(attempt)):
            self._backlog.attempts[(attempt.run_id, attempt.attempt)] = attempt

    def _put_attempt(self, attempt: AttemptRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO attempts (run_id, attempt, state, body) VALUES (?, ?, ?, ?)",
            (attempt.run_id, attempt.attempt, attempt.state.value, attempt.model_dump_json()),
        )

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        rows = self._db.execute(
            "SELECT body FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)
        ).fetchall()
        stored = [AttemptRecord.model_validate_json(body) for (body,) in rows]
        if not self._backlog.attempts:
            return stored
        return [a for a in self._backlog.over_attempts(stored) if a.run_id == run_id]

    def active_attempts(self) -> list[AttemptRecord]:
        active = tuple(s.value for s in ACTIVE)
        rows = self._db.execute(
            f"SELECT body FROM attempts WHERE state IN ({_marks(active)})", active
        ).fetchall()
        stored = [AttemptRecord.model_validate_json(body) for (body,) in rows]
        if not self._backlog.attempts:
            return stored
        return [a for a in self._backlog.over_attempts(stored) if a.state in ACTIVE]

    def add_run_event(self, event: RunEvent) -> None:
        if not self._now_or_later(lambda: self._add_run_event(event)):
            self._backlog.add_run_events([event])

    def _add_run_event(self, event: RunEvent) -> int:
        cursor = self._db.execute(
            "INSERT INTO run_events (run_id, time, kind, body) VALUES (?, ?, ?, ?)",
            (event.run_id, event.time, event.kind, event.model_dump_json()),
        )
        return int(cursor.lastrowid or 0)

    def run_events(self, run_id: str, limit: int = 200) -> list[RunEvent]:
        """The newest `limit` events of a run, oldest first."""
        rows = self._db.execute(
            "SELECT body FROM run_events WHERE run_id = ? ORDER BY id DESC LIMIT ?",
            (run_id, limit),
        ).fetchall()
        stored = [RunEvent.model_validate_json(body) for (body,) in reversed(rows)]
        waiting = [e for e in self._backlog.run_events if e.run_id == run_id]
        return (stored + waiting)[-limit:] if waiting else stored

    # ------------------------------------------------------------------ metrics

    def add_metrics(self, points: list[MetricPoint]) -> None:
        """Insert points; a (run, attempt, step, name) already stored is kept."""
        for point in sorted(points, key=lambda p: (p.attempt, p.step)):
            seen = self._values_seen.get(point.run_id)
            if seen is None or point.attempt > seen[0]:
                self._values_seen[point.run_id] = seen = (point.attempt, {})
            if point.attempt == seen[0]:
                seen[1].update(point.values)
        if points and not self._now_or_later(lambda: self._add_metrics(points)):
            self._backlog.add_metrics(points)

    def _add_metrics(self, points: list[MetricPoint]) -> int:
        rows = [
            (p.run_id, p.attempt, p.step, p.time, name, value)
            for p in points
            for name, value in p.values.items()
        ]
        if not rows:
            return 0
        with self._db:
            self._db.execute("BEGIN")
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO metrics (run_id, attempt, step, time, name, value)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            return self._db.total_changes - before

    def step_span(
        self, run_id: str, attempt: int, before: float
    ) -> tuple[tuple[int, float], tuple[int, float]] | None:
        """The first and last stored step of an attempt logged before `before`, with
        their times: ((step, time), (step, time)); None where it stored none."""
        ends = []
        for order in ("ASC", "DESC"):
            row = self._db.execute(
                "SELECT step, time FROM metrics WHERE run_id = ? AND attempt = ? AND time < ?"
                f" ORDER BY step {order}, time {order} LIMIT 1",
                (run_id, attempt, before),
            ).fetchone()
            if row is None:
                return None
            ends.append((int(row[0]), float(row[1])))
        return ends[0], ends[1]

    def metrics(
        self, run_id: str, name: str | None = None, limit: int = 100_000
    ) -> list[tuple[int, int, float, str, float]]:
        """(attempt, step, time, name, value) rows of a run, in attempt and step order."""
        if name is None:
            rows = self._db.execute(
                "SELECT attempt, step, time, name, value FROM metrics WHERE run_id = ?"
                " ORDER BY attempt, step, name LIMIT ?",
                (run_id, limit),
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT attempt, step, time, name, value FROM metrics WHERE run_id = ?"
                " AND name = ? ORDER BY attempt, step LIMIT ?",
                (run_id, name, limit),
            ).fetchall()
        found = [(int(a), int(s), float(t), str(n), float(v)) for a, s, t, n, v in rows]
        waiting = [
            (p.attempt, p.step, p.time, key, value)
            for p in self._backlog.metrics
            if p.run_id == run_id
            for key, value in p.values.items()
            if name is None or key == name
        ]
        if not waiting:
            return found
        merged = {(a, s, n): (a, s, t, n, v) for a, s, t, n, v in waiting}
        merged.update({(a, s, n): (a, s, t, n, v) for a, s, t, n, v in found})
        return sorted(merged.values(), key=lambda row: (row[0], row[1], row[3]))[:limit]

    def latest_metrics(self, run_id: str) -> tuple[int, dict[str, float]] | None:
        """The newest step of a run and its values, with the last value of each name its
        attempt logged before (since this daemon started): a loss logged every 10 steps
        still shows at a step that logged only its rate."""
        found = self._latest(run_id)
        if found is None:
            return None
        attempt, step, values = found
        seen = self._values_seen.get(run_id)
        if seen is not None and seen[0] == attempt:
            values = {**seen[1], **values}
        return step, values

    def _latest(self, run_id: str) -> tuple[int, int, dict[str, float]] | None:
        stored = self._latest_stored(run_id)
        waiting = [p for p in self._backlog.metrics if p.run_id == run_id]
        if not waiting:
            return stored
        newest = max(waiting, key=lambda p: (p.attempt, p.step))
        if stored is not None and (stored[0], stored[1]) > (newest.attempt, newest.step):
            return stored
        values = {k: v for p in waiting if (p.attempt, p.step) == (newest.attempt, newest.step)
                  for k, v in p.values.items()}  # fmt: skip
        return newest.attempt, newest.step, values

    def _latest_stored(self, run_id: str) -> tuple[int, int, dict[str, float]] | None:
        row = self._db.execute(
            "SELECT attempt, step FROM metrics WHERE run_id = ? ORDER BY attempt DESC, step DESC"
            " LIMIT 1",
            (run_id,),
        ).fetchone()
        if row is None:
            return None
        values = self._db.execute(
            "SELECT name, value FROM metrics WHERE run_id = ? AND attempt = ? AND step = ?",
            (run_id, row[0], row[1]),
        ).fetchall()
        return int(row[0]), int(row[1]), {str(n): float(v) for n, v in values}

    # ------------------------------------------------------------------ port leases

    def leased_ports(self) -> set[int]:
        rows = self._db.execute("SELECT port, run_id FROM port_leases").fetchall()
        return self._backlog.over_ports({int(p): str(r) for p, r in rows})

    def lease_port(self, port: int, run_id: str, attempt: int, now: float) -> None:
        if not self._now_or_later(lambda: self._lease_port(port, run_id, attempt, now)):
            self._backlog.leases.append(PortLease(port, run_id, attempt, now))

    def _lease_port(self, port: int, run_id: str, attempt: int, now: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO port_leases (port, run_id, attempt, leased_at)"
            " VALUES (?, ?, ?, ?)",
            (port, run_id, attempt, now),
        )

    def release_ports(self, run_id: str) -> None:
        if not self._now_or_later(lambda: self._release_ports(run_id)):
            self._backlog.leases.append(PortRelease(run_id))

    def _release_ports(self, run_id: str) -> None:
        self._db.execute("DELETE FROM port_leases WHERE run_id = ?", (run_id,))

    # ------------------------------------------------------------------ GPU leases

    def gpu_leases(self) -> list[GpuLease]:
        rows = self._db.execute(
            "SELECT uuid, gpu_index, run_id, attempt, leased_at FROM gpu_leases ORDER BY gpu_index"
        ).fetchall()
        leases = [GpuLease(str(u), int(i), str(r), int(a), float(t)) for u, i, r, a, t in rows]
        return [x for x in leases if not self._backlog.released_gpus(x.run_id, x.attempt)]

    def lease_gpus(
        self, run_id: str, attempt: int, gpus: list[tuple[int, str]], now: float
    ) -> None:
        """Lease every GPU in `gpus` (index, uuid) to the attempt, or none of them: a GPU
        leased already raises LeaseConflict (the UUID is the table's key, so no GPU is ever
        leased twice, whoever asks). A lease is on disk before anything starts under it:
        with no room, StoreFull."""
        if self._backlog:
            self.retry(force=True)
        if self._backlog:
            raise StoreFull(f"{self.full}: no GPUs are leased until there is room")
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT INTO gpu_leases (uuid, gpu_index, run_id, attempt, leased_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [(uuid, index, run_id, attempt, now) for index, uuid in gpus],
                )
        except sqlite3.IntegrityError:
            raise LeaseConflict(f"a GPU of {[i for i, _ in gpus]} is leased already") from None
        except sqlite3.OperationalError as exc:
            if not cannot_write(exc):
                raise
            self._refused(exc)
            raise StoreFull(f"{self.full}: no GPUs are leased until there is room") from None

    def release_gpus(self, run_id: str, attempt: int | None = None) -> None:
        if not self._now_or_later(lambda: self._release_gpus(run_id, attempt)):
            self._backlog.leases.append(GpuRelease(run_id, attempt))

    def _release_gpus(self, run_id: str, attempt: int | None) -> None:
        if attempt is None:
            self._db.execute("DELETE FROM gpu_leases WHERE run_id = ?", (run_id,))
        else:
            self._db.execute(
                "DELETE FROM gpu_leases WHERE run_id = ? AND attempt = ?", (run_id, attempt)
            )

    # ------------------------------------------------------------------ holds (gpud.heal)

    def holds(self) -> list[tuple[str, int | None, Hold]]:
        """Quarantines and drains: (a GPU's UUID or the node's target, its index, the hold)."""
        rows = self._db.execute("SELECT target, gpu_index, body FROM holds").fetchall()
        found = {t: (i, Hold.model_validate_json(b)) for t, i, b in rows}
        for target, (index, hold) in self._backlog.holds.items():
            if hold is None:
                found.pop(target, None)
            else:
                found[target] = (index, hold)
        return [(t, i, h) for t, (i, h) in found.items()]

    def put_hold(self, target: str, gpu_index: int | None, hold: Hold) -> None:
        if not self._now_or_later(lambda: self._put_hold(target, gpu_index, hold)):
            self._backlog.holds[target] = (gpu_index, hold)

    def drop_hold(self, target: str) -> None:
        if not self._now_or_later(lambda: self._put_hold(target, None, None)):
            self._backlog.holds[target] = (None, None)

    def _put_hold(self, target: str, gpu_index: int | None, hold: Hold | None) -> None:
        with self._db:
            if hold is None:
                self._db.execute("DELETE FROM holds WHERE target = ?", (target,))
            else:
                self._db.execute(
                    "INSERT OR REPLACE INTO holds (target, gpu_index, body) VALUES (?, ?, ?)",
                    (target, gpu_index, hold.model_dump_json()),
                )

    def close(self) -> None:
        self._db.close()


def _left_by_a_crash(path: Path) -> dict[str, int]:
    """The bytes of the WAL and of the rollback journal beside the database, where any:
    after a clean stop neither is left (the last connection checkpoints and removes the
    WAL; a committed transaction removes its journal)."""
    found = {}
    for suffix in ("-wal", "-journal"):
        try:
            size = path.with_name(path.name + suffix).stat().st_size
        except OSError:
            continue
        if size:
            found[suffix] = size
    return found


def _report_recovery(path: Path, left: dict[str, int]) -> None:
    """Say what SQLite recovered on opening: nothing of it is lost, but an operator reading
    the log after a crash wants to know the store saw it."""
    if "-wal" in left:
        log.info(
            "%s: the last daemon did not stop cleanly; its WAL (%.0f KiB of committed writes)"
            " was recovered",
            path, left["-wal"] / 1024,
        )  # fmt: skip
    if "-journal" in left and not path.with_name(path.name + "-journal").exists():
        log.warning(
            "%s: rolled back a transaction a crashed writer left unfinished (%s-journal, %.0f"
            " KiB); the store is as it was before that transaction",
            path, path.name, left["-journal"] / 1024,
        )  # fmt: skip


def _marks(values: tuple[str, ...]) -> str:
    """`?, ?, …`: one placeholder per value (never the values themselves)."""
    return ", ".join("?" for _ in values)


def _statements(script: str) -> list[str]:
    """A migration's statements, one by one: `executescript` would commit first, and every
    step of an upgrade belongs to one transaction."""
    return [part.strip() for part in script.split(";") if part.strip()]
