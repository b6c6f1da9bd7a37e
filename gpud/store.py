"""The daemon's SQLite database (WAL): node events now; runs and metrics build on it.

Writes happen on the daemon's event-loop thread only. Rows are read back tolerantly into
the same models they were written from, so an older row never breaks a newer daemon.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

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
)


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

    def close(self) -> None:
        self._db.close()
