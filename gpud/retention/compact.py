"""Keeping SQLite's file as small as what it holds (auto_vacuum = INCREMENTAL).

Removed rows leave free pages inside the file; `PRAGMA incremental_vacuum(N)` gives N of
them back to the file system. It runs on the loop, `PAGES` at a time (each step timed),
after a pass removed rows. A database made by an older gpud has auto_vacuum off, which
only a full VACUUM can change: it is done once, at start-up, before the daemon serves
(the loop is not running yet), timed and logged.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from gpud.node.backlog import cannot_write

log = logging.getLogger("gpud.retention")

INCREMENTAL = 2
#: The most pages given back in one step (2 MiB of 4 KiB pages): one step of 4,096 held
#: the loop 96 ms in bench/retention_gc.py.
PAGES = 512


def ensure_incremental(db: sqlite3.Connection, path: object) -> None:
    """Turn on incremental vacuum, with the one VACUUM an existing database needs."""
    (mode,) = db.execute("PRAGMA auto_vacuum").fetchone()
    if mode == INCREMENTAL:
        return
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (size,) = db.execute("PRAGMA page_size").fetchone()
    started = time.perf_counter()
    try:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("VACUUM")
        # The VACUUM went through the WAL: copy it back now, while nothing waits, rather
        # than in the first write the loop makes.
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.OperationalError as exc:
        if not cannot_write(exc):
            raise
        log.warning(
            "%s: could not turn on incremental vacuum (%s): removed rows leave free pages in"
            " the file until there is room for a VACUUM",
            path, exc,
        )  # fmt: skip
        return
    (after,) = db.execute("PRAGMA page_count").fetchone()
    log.info(
        "%s: turned on incremental vacuum (a one-off VACUUM of %.1f MiB → %.1f MiB, %.2fs)",
        path, pages * size / 2**20, after * size / 2**20, time.perf_counter() - started,
    )  # fmt: skip


def checkpoint(db: sqlite3.Connection) -> None:
    """Copy the WAL back into the database without waiting for (or holding up) writers.

    The retention thread does this between batches through a connection of its own, so
    the WAL stays short and the loop's own commits seldom meet SQLite's automatic
    checkpoint (1000 pages), which would copy the lot while the loop waits."""
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def free_pages(db: sqlite3.Connection) -> int:
    (count,) = db.execute("PRAGMA freelist_count").fetchone()
    return int(count)


def vacuum_some(db: sqlite3.Connection, pages: int = PAGES) -> tuple[int, float]:
    """Give back up to `pages` free pages: (pages given back, seconds it took)."""
    before = free_pages(db)
    if not before:
        return 0, 0.0
    started = time.perf_counter()
    db.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
    took = time.perf_counter() - started
    return before - free_pages(db), took
