"""A run's rows in the database: read in a worker thread, removed on the loop in batches.

Reads (`Facts`) go through a read-only connection of their own in the retention thread:
in WAL mode they neither wait for the loop's writes nor hold them up. Every write goes
through the store's own connection on the loop thread, as all of the store's writes do,
one small batch at a time: `Batches` sizes each batch so it takes about `TARGET_S`, and
the service yields to the loop between batches, so a request never waits long behind a
removal. A removal is journalled (`pruning`) in the same transaction that removes the run's
record: a daemon killed half-way finishes it at its next pass.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpud.model.run import RunEvent, RunRecord
from gpud.node.store import Store
from gpud.retention.usage import RunUsage, usage_of

#: How long one batch should hold the loop.
TARGET_S = 0.010
MIN_BATCH, MAX_BATCH = 50, 20_000

#: Tables of a run's rows besides its record, in the order they are removed.
RUN_TABLES = ("metrics", "run_events", "attempts")


@dataclass(frozen=True)
class RunRow:
    """A run's record as retention reads it (no model parsing: 10,000 runs stay cheap)."""

    id: str
    name: str
    state: str
    created_at: float
    ended_at: float
    attempt: int
    run_dir: str
    checkpoint_dir: str | None
    last_checkpoint: str | None


@dataclass
class Facts:
    """What one pass reads of the database, in the retention thread."""

    runs: list[RunRow] = field(default_factory=list)
    rows_by_run: dict[str, int] = field(default_factory=dict)
    total_rows: int = 0
    node_events: int = 0
    db_bytes: int = 0  # what its rows take: shared out among the runs by their rows
    db_files: int = 0  # the database's files, the WAL too: what the disk holds
    thinned: dict[str, int] = field(default_factory=dict)  # run → attempt thinned at
    pruning: list[tuple[str, dict[str, object]]] = field(default_factory=list)


def open_reader(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def db_bytes(path: Path) -> int:
    """The database's files (the WAL too)."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += Path(f"{path}{suffix}").stat().st_size
        except OSError:
            pass
    return total


def live_bytes(db: sqlite3.Connection) -> int:
    """The bytes the database's rows take (its pages less the free ones; the WAL aside)."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (free,) = db.execute("PRAGMA freelist_count").fetchone()
    (size,) = db.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * size)


def read_facts(db: sqlite3.Connection, path: Path) -> Facts:
    facts = Facts(db_bytes=live_bytes(db), db_files=db_bytes(path))
    for row in db.execute(
        "SELECT id, name, state, created_at, json_extract(body, '$.state_since'),"
        " json_extract(body, '$.attempt'), json_extract(body, '$.run_dir'),"
        " json_extract(body, '$.checkpoint_dir'), json_extract(body, '$.last_checkpoint.path')"
        " FROM runs"
    ):
        rid, name, state, created, since, attempt, run_dir, ckpt, last = row
        facts.runs.append(
            RunRow(str(rid), str(name), str(state), float(created), float(since or created),
                   int(attempt or 1), str(run_dir or ""), ckpt, last)
        )  # fmt: skip
    for table in ("metrics", "run_events"):
        for rid, count in db.execute(f"SELECT run_id, count(*) FROM {table} GROUP BY run_id"):
            facts.rows_by_run[rid] = facts.rows_by_run.get(rid, 0) + int(count)
    (facts.node_events,) = db.execute("SELECT count(*) FROM node_events").fetchone()
    facts.total_rows = sum(facts.rows_by_run.values()) + len(facts.runs) + facts.node_events
    thinned = db.execute("SELECT run_id, attempt FROM metrics_thinned")
    facts.thinned = {str(r): int(a) for r, a in thinned}
    pruning = db.execute("SELECT run_id, body FROM pruning")
    facts.pruning = [(str(r), json.loads(b)) for r, b in pruning]
    return facts


def series(db: sqlite3.Connection, run_id: str) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """A run's metric points by (attempt, name), in step order."""
    found: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for attempt, name, step, value in db.execute(
        "SELECT attempt, name, step, value FROM metrics WHERE run_id = ?"
        " ORDER BY attempt, name, step",
        (run_id,),
    ):
        found.setdefault((int(attempt), str(name)), []).append((int(step), float(value)))
    return found


class Batches:
    """Batch sizes that keep each batch near TARGET_S, and the longest one seen."""

    def __init__(self, start: int = 500) -> None:
        self.size = start
        self.longest_s = 0.0
        self.batches = 0

    def timed(self, done: int, took: float) -> None:
        self.batches += 1
        self.longest_s = max(self.longest_s, took)
        if done and took > 0:
            wanted = int(done * TARGET_S / took)
            self.size = max(MIN_BATCH, min(MAX_BATCH, wanted, self.size * 4))


def begin_removal(db: sqlite3.Connection, usage: RunUsage, files: dict[str, object]) -> None:
    """One transaction: the run's usage row, the journal entry, and its record gone."""
    kept = usage.model_copy(update={"removed": True})
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "INSERT OR REPLACE INTO run_usage (run_id, ended_at, body) VALUES (?, ?, ?)",
            (usage.run_id, usage.ended_at, kept.model_dump_json()),
        )
        db.execute(
            "INSERT OR REPLACE INTO pruning (run_id, body) VALUES (?, ?)",
            (usage.run_id, json.dumps(files)),
        )
        db.execute("DELETE FROM runs WHERE id = ?", (usage.run_id,))
        db.execute("DELETE FROM metrics_thinned WHERE run_id = ?", (usage.run_id,))


def remove_some(db: sqlite3.Connection, table: str, run_id: str, batches: Batches) -> int:
    """One batch of a run's rows of `table`; how many went (0: none left)."""
    assert table in RUN_TABLES
    started = time.perf_counter()
    with db:
        db.execute("BEGIN IMMEDIATE")
        cursor = db.execute(
            f"DELETE FROM {table} WHERE rowid IN"
            f" (SELECT rowid FROM {table} WHERE run_id = ? LIMIT ?)",
            (run_id, batches.size),
        )
    done = cursor.rowcount
    batches.timed(done, time.perf_counter() - started)
    return done


def end_removal(db: sqlite3.Connection, run_id: str) -> None:
    db.execute("DELETE FROM pruning WHERE run_id = ?", (run_id,))


def remove_node_events(db: sqlite3.Connection, over: int, batches: Batches) -> int:
    """One batch of the oldest node events, at most `over`."""
    started = time.perf_counter()
    with db:
        db.execute("BEGIN IMMEDIATE")
        cursor = db.execute(
            "DELETE FROM node_events WHERE id IN (SELECT id FROM node_events ORDER BY id LIMIT ?)",
            (min(over, batches.size),),
        )
    done = cursor.rowcount
    batches.timed(done, time.perf_counter() - started)
    return done


def remove_points(
    db: sqlite3.Connection,
    run_id: str,
    points: list[tuple[int, str, int]],
    batches: Batches,
) -> list[tuple[int, str, int]]:
    """Remove one batch of (attempt, name, step) points of a run; returns the rest."""
    batch, rest = points[: batches.size], points[batches.size :]
    started = time.perf_counter()
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "DELETE FROM metrics WHERE run_id = ? AND attempt = ? AND step = ? AND name = ?",
            [(run_id, a, s, n) for a, n, s in batch],
        )
    batches.timed(len(batch), time.perf_counter() - started)
    return rest


def mark_thinned(db: sqlite3.Connection, run_id: str, attempt: int, now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO metrics_thinned (run_id, attempt, at) VALUES (?, ?, ?)",
        (run_id, attempt, now),
    )


def stored_usage(store: Store, run: RunRecord, now: float | None = None) -> RunUsage:
    """The run's `RunUsage` from its stored attempts and the key of its first launch or
    join event."""
    body = first_launch_event(store.db, run.id)
    events = [RunEvent.model_validate_json(body)] if body else []
    return usage_of(run, store.attempts(run.id), events, now)


def first_launch_event(db: sqlite3.Connection, run_id: str) -> str | None:
    """The body of the run's first launch or join event (who launched it)."""
    row = db.execute(
        "SELECT body FROM run_events WHERE run_id = ? AND kind IN ('launch', 'join')"
        " ORDER BY id LIMIT 1",
        (run_id,),
    ).fetchone()
    return str(row[0]) if row else None


def counts(db: sqlite3.Connection) -> tuple[int, int]:
    """(runs, node events) on record."""
    (runs,) = db.execute("SELECT count(*) FROM runs").fetchone()
    (events,) = db.execute("SELECT count(*) FROM node_events").fetchone()
    return int(runs), int(events)
