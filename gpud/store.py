"""The daemon's SQLite database (WAL): node events, runs, attempts, run events, metrics.

Writes happen on the daemon's event-loop thread only. Rows are read back tolerantly into
the same models they were written from, so an older row never breaks a newer daemon.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import NamedTuple

from gpud.runmodel import ACTIVE, AttemptRecord, MetricPoint, RunEvent, RunRecord
from gpud.snapshot import NodeEvent

#: Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
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
)


class GpuLease(NamedTuple):
    """A GPU held by one attempt of a run's part on this node (by UUID: indices can move)."""

    uuid: str
    gpu_index: int
    run_id: str
    attempt: int
    leased_at: float = 0.0


class LeaseConflict(Exception):
    """A GPU asked for is leased already: nothing of the request was leased."""


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"{self.path} was written by a newer gpud (schema {version}); upgrade gpud"
            )
        for number in range(version, len(MIGRATIONS)):
            with self._db:
                self._db.execute("BEGIN")
                self._db.executescript(MIGRATIONS[number])
                self._db.execute(f"PRAGMA user_version = {number + 1}")

    def add_node_events(self, events: list[NodeEvent]) -> None:
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
        return [NodeEvent.model_validate(json.loads(body)) for (body,) in reversed(rows)]

    # ------------------------------------------------------------------ runs

    def put_run(self, run: RunRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO runs (id, name, created_at, state, body)"
            " VALUES (?, ?, ?, ?, ?)",
            (run.id, run.name, run.created_at, run.state.value, run.model_dump_json()),
        )

    def run(self, run_id: str) -> RunRecord | None:
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
        return [RunRecord.model_validate_json(body) for (body,) in rows]

    def put_attempt(self, attempt: AttemptRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO attempts (run_id, attempt, state, body) VALUES (?, ?, ?, ?)",
            (attempt.run_id, attempt.attempt, attempt.state.value, attempt.model_dump_json()),
        )

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        rows = self._db.execute(
            "SELECT body FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)
        ).fetchall()
        return [AttemptRecord.model_validate_json(body) for (body,) in rows]

    def active_attempts(self) -> list[AttemptRecord]:
        active = tuple(s.value for s in ACTIVE)
        rows = self._db.execute(
            f"SELECT body FROM attempts WHERE state IN ({_marks(active)})", active
        ).fetchall()
        return [AttemptRecord.model_validate_json(body) for (body,) in rows]

    def add_run_event(self, event: RunEvent) -> int:
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
        return [RunEvent.model_validate_json(body) for (body,) in reversed(rows)]

    # ------------------------------------------------------------------ metrics

    def add_metrics(self, points: list[MetricPoint]) -> int:
        """Insert points; a (run, attempt, step, name) already stored is kept. Returns rows."""
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
        return [(int(a), int(s), float(t), str(n), float(v)) for a, s, t, n, v in rows]

    def latest_metrics(self, run_id: str) -> tuple[int, dict[str, float]] | None:
        """The newest step of a run and its values."""
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
        return int(row[1]), {str(n): float(v) for n, v in values}

    # ------------------------------------------------------------------ port leases

    def leased_ports(self) -> set[int]:
        return {int(p) for (p,) in self._db.execute("SELECT port FROM port_leases").fetchall()}

    def lease_port(self, port: int, run_id: str, attempt: int, now: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO port_leases (port, run_id, attempt, leased_at)"
            " VALUES (?, ?, ?, ?)",
            (port, run_id, attempt, now),
        )

    def release_ports(self, run_id: str) -> None:
        self._db.execute("DELETE FROM port_leases WHERE run_id = ?", (run_id,))

    # ------------------------------------------------------------------ GPU leases

    def gpu_leases(self) -> list[GpuLease]:
        rows = self._db.execute(
            "SELECT uuid, gpu_index, run_id, attempt, leased_at FROM gpu_leases ORDER BY gpu_index"
        ).fetchall()
        return [GpuLease(str(u), int(i), str(r), int(a), float(t)) for u, i, r, a, t in rows]

    def lease_gpus(
        self, run_id: str, attempt: int, gpus: list[tuple[int, str]], now: float
    ) -> None:
        """Lease every GPU in `gpus` (index, uuid) to the attempt, or none of them: a GPU
        leased already raises LeaseConflict (the UUID is the table's key, so no GPU is ever
        leased twice, whoever asks)."""
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

    def release_gpus(self, run_id: str, attempt: int | None = None) -> None:
        if attempt is None:
            self._db.execute("DELETE FROM gpu_leases WHERE run_id = ?", (run_id,))
        else:
            self._db.execute(
                "DELETE FROM gpu_leases WHERE run_id = ? AND attempt = ?", (run_id, attempt)
            )

    def close(self) -> None:
        self._db.close()


def _marks(values: tuple[str, ...]) -> str:
    """`?, ?, …`: one placeholder per value (never the values themselves)."""
    return ", ".join("?" for _ in values)
