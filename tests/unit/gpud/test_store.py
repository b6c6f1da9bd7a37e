"""The SQLite store: events persist across reopen, newest-first limits, schema guard."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpud.snapshot import NodeEvent
from gpud.statedir import StateDir, StateDirBusy, held_by
from gpud.store import MIGRATIONS, Store


def event(t: float, code: int) -> NodeEvent:
    return NodeEvent(
        node="n",
        time=t,
        kind="xid",
        severity="critical",
        gpu_index=0,
        message=f"XID {code}",
        data={"code": code},
    )


def test_events_survive_reopen_and_limit_keeps_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.add_node_events([event(float(i), i) for i in range(10)])
    store.close()
    store = Store(tmp_path / "db")
    assert [e.data["code"] for e in store.node_events(limit=3)] == [7, 8, 9]
    assert [e.data["code"] for e in store.node_events(limit=100, since=7.5)] == [8, 9]
    store.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer gpud"):
        Store(tmp_path / "db")


def test_state_dir_is_held_by_one_owner(tmp_path: Path) -> None:
    first = StateDir(tmp_path / "s")
    first.acquire()
    assert held_by(first.pid_file) is not None
    with pytest.raises(StateDirBusy, match="in use by gpud pid"):
        StateDir(tmp_path / "s").acquire()
    first.release()
    assert held_by(first.pid_file) is None
    second = StateDir(tmp_path / "s")
    second.acquire()
    second.release()
