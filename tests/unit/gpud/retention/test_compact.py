"""The database gives removed rows' pages back to the file system (incremental vacuum),
an older database once converted at start-up; `gpuctl ps` reads the newest runs by index."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpud.model.snapshot import NodeEvent
from gpud.node.store import MIGRATIONS, Store
from gpud.retention import compact, rows


def older_database(path: Path) -> None:
    """A database as gpud wrote it before retention: auto_vacuum off, four migrations."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for number, script in enumerate(MIGRATIONS[:4]):
        db.executescript(script)
        db.execute(f"PRAGMA user_version = {number + 1}")
    events = [
        NodeEvent(node="n", time=float(i), kind="xid", severity="critical", gpu_index=0,
                  message="x" * 400)
        for i in range(20_000)
    ]  # fmt: skip
    with db:
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO node_events (time, kind, severity, gpu_index, body)"
            " VALUES (?, ?, ?, ?, ?)",
            [(e.time, e.kind, e.severity, e.gpu_index, e.model_dump_json()) for e in events],
        )
    db.close()


def test_an_older_database_is_converted_once_and_then_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "gpud.db"
    older_database(path)
    store = Store(path)
    assert store.db.execute("PRAGMA auto_vacuum").fetchone() == (0,)
    compact.ensure_incremental(store.db, path)
    assert store.db.execute("PRAGMA auto_vacuum").fetchone() == (compact.INCREMENTAL,)
    before = rows.live_bytes(store.db) + compact.free_pages(store.db) * 4096
    batches = rows.Batches()
    removed = 0
    while removed < 19_000:
        removed += rows.remove_node_events(store.db, 19_000 - removed, batches)
    assert compact.free_pages(store.db) > 0
    given = 0
    while (freed := compact.vacuum_some(store.db, 256)[0]) > 0:
        given += freed
    (pages,) = store.db.execute("PRAGMA page_count").fetchone()
    assert given > 0 and compact.free_pages(store.db) == 0
    assert pages * 4096 < before / 5
    assert [e.time for e in store.node_events(limit=2)] == [19_998.0, 19_999.0]
    store.close()


def test_a_new_database_is_incremental_and_runs_are_read_newest_first_by_index(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "gpud.db")
    assert store.db.execute("PRAGMA auto_vacuum").fetchone() == (compact.INCREMENTAL,)
    plan = " ".join(
        str(row[-1])
        for row in store.db.execute(
            "EXPLAIN QUERY PLAN SELECT body FROM runs ORDER BY created_at DESC LIMIT 200"
        )
    )
    assert "runs_created" in plan and "TEMP B-TREE" not in plan
    store.close()


def test_batches_grow_while_they_are_quick_and_shrink_when_slow() -> None:
    batches = rows.Batches(start=500)
    batches.timed(500, 0.001)
    assert batches.size == 2000  # at most 4x at a time
    batches.timed(2000, 0.1)
    assert batches.size == 200 and batches.longest_s == 0.1
