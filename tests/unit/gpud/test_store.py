"""The SQLite store: events persist across reopen, newest-first limits, schema guard."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpud import __version__
from gpud.model.run import AttemptRecord, MetricPoint, RunEvent, RunRecord, RunState
from gpud.model.snapshot import NodeEvent
from gpud.node.statedir import StateDir, StateDirBusy, held_by
from gpud.node.store import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew, Store, StoreFull

#: A run as gpud 0.1.0 stored it (its RunRecord had no `bandwidth` nor `awaiting_start`).
RUN_0_1_0 = {
    "id": "old-abc123",
    "name": "old",
    "created_at": 1.0,
    "spec": {"name": "old"},
    "nodes": [{"control": "tcp://127.0.0.1:7711"}],
    "node_rank": 0,
    "state": "running",
    "state_since": 2.0,
    "run_dir": "/tmp/runs/old-abc123",
    "checkpoint_dir": "/tmp/ckpt",
    "last_step": 41,
}


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


def test_a_newer_schema_is_refused_in_one_line_naming_both(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(SchemaTooNew) as refused:
        Store(tmp_path / "db")
    said = str(refused.value)
    assert f"store schema {len(MIGRATIONS) + 1}, written by a newer gpud" in said
    assert f"({__version__}) reads schema {SCHEMA_VERSION} and older" in said
    assert "\n" not in said


def test_a_fresh_store_records_its_schema_and_who_wrote_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    (step,) = store.schema_history()
    assert (step.version, step.found, step.gpud) == (SCHEMA_VERSION, 0, __version__)
    store.close()


def test_a_store_of_gpud_0_1_0_is_migrated_forward_keeping_its_rows(tmp_path: Path) -> None:
    """gpud 0.1.0 wrote schema 4 (the first four migrations): an upgrade keeps its runs and
    records the step."""
    db = sqlite3.connect(tmp_path / "db", isolation_level=None)
    for script in MIGRATIONS[:4]:
        db.executescript(script)
    db.execute("PRAGMA user_version = 4")
    run = RunRecord.model_validate(RUN_0_1_0)
    db.execute(
        "INSERT INTO runs (id, name, created_at, state, body) VALUES (?, ?, ?, ?, ?)",
        (run.id, run.name, run.created_at, run.state.value, json.dumps(RUN_0_1_0)),
    )
    db.close()

    store = Store(tmp_path / "db")
    assert store.schema_version == SCHEMA_VERSION
    assert [(s.found, s.version, s.gpud) for s in store.schema_history()] == [
        (4, SCHEMA_VERSION, __version__)
    ]
    (kept,) = store.runs()
    assert kept.id == "old-abc123" and kept.awaiting_start is False and kept.bandwidth == {}
    store.close()
    again = Store(tmp_path / "db")  # nothing more to do: no second record
    assert len(again.schema_history()) == 1
    again.close()


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


# --------------------------------------------------------------------------- a full disk


def full(store: Store) -> None:
    """SQLite's own limit, so its writes fail as on a full disk (SQLITE_FULL): the
    database may not grow past the pages it has now."""
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def room(store: Store) -> None:
    store._db.execute("PRAGMA max_page_count = 1073741823")


def a_run(run_id: str, state: RunState = RunState.RUNNING) -> RunRecord:
    return RunRecord(
        id=run_id, name="r", created_at=float(len(run_id)), spec={}, nodes=[], node_rank=0,
        state=state, state_since=0.0, run_dir="/r", checkpoint_dir="/r/ck",
    )  # fmt: skip


def an_attempt(state: RunState) -> AttemptRecord:
    return AttemptRecord(
        run_id="r-1", attempt=1, node_rank=0, state=state, state_since=0.0,
        master_addr="127.0.0.1", master_port=1, nproc=1, attempt_dir="/r/attempt-1",
    )  # fmt: skip


def test_writes_a_full_disk_refuses_wait_in_memory_and_reads_see_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [0.0]
    store = Store(tmp_path / "db", clock=lambda: clock[0])
    store.put_run(a_run("r-1"))
    store.put_attempt(an_attempt(RunState.RUNNING))
    full(store)
    filler = "x" * 3000  # a few pages' worth, so the database must grow
    for i in range(20):
        store.add_run_event(
            RunEvent(run_id="r-1", attempt=1, time=float(i), node="n", kind="k", message=filler)
        )
    store.put_attempt(an_attempt(RunState.FAILED))
    store.put_run(a_run("r-1", RunState.FAILED))
    store.add_metrics([MetricPoint(run_id="r-1", attempt=1, step=7, time=1.0, values={"loss": 2})])
    assert store.full is not None and "is full (database or disk is full)" in store.full
    assert store.waiting > 0
    # Every read sees what waits: the run and attempt as they are now, events, metrics.
    run = store.run("r-1")
    assert run is not None and run.state is RunState.FAILED
    assert [a.state for a in store.attempts("r-1")] == [RunState.FAILED]
    assert store.active_attempts() == []
    assert store.runs(active_only=True) == []
    assert len(store.run_events("r-1", limit=100)) == 20
    assert store.latest_metrics("r-1") == (7, {"loss": 2.0})
    assert store.metrics("r-1") == [(1, 7, 1.0, "loss", 2.0)]
    with pytest.raises(StoreFull, match="is full"):
        store.lease_gpus("r-1", 1, [(0, "GPU-0")], 0.0)
    clock[0] += 2.0
    store.retry()  # still full: nothing lost, nothing raised
    assert store.waiting > 0
    room(store)
    clock[0] += 2.0
    store.retry()
    assert store.waiting == 0 and store.full is None
    store.close()
    again = Store(tmp_path / "db")  # on disk now
    assert [a.state for a in again.attempts("r-1")] == [RunState.FAILED]
    run = again.run("r-1")
    assert run is not None and run.state is RunState.FAILED
    assert len(again.run_events("r-1", limit=100)) == 20
    assert again.latest_metrics("r-1") == (7, {"loss": 2.0})
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpud.store"]
    assert len(warnings) == 2, warnings  # filled, and had room again: not one per write
    assert "has room again" in warnings[-1]
    again.close()


def test_lease_changes_keep_their_order_while_they_wait(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.lease_port(30000, "r-1", 1, 0.0)
    store.lease_gpus("r-1", 1, [(0, "GPU-0")], 0.0)
    full(store)
    store.add_run_event(RunEvent(run_id="r-1", attempt=1, time=0.0, node="n", kind="k",
                                 message="x" * 20000))  # fmt: skip
    store.release_ports("r-1")
    store.lease_port(30001, "r-2", 1, 0.0)
    store.release_gpus("r-1", 1)
    assert store.leased_ports() == {30001}
    assert store.gpu_leases() == []
    room(store)
    store.retry(force=True)
    assert store.waiting == 0
    assert store.leased_ports() == {30001}
    assert store.gpu_leases() == []
    store.close()


def test_the_latest_values_keep_each_name_the_attempt_logged_last(tmp_path: Path) -> None:
    """A Trainer logs its loss every few steps and its progress bar a rate at every step:
    `ps` shows the newest step with the last loss, not a step with no loss (issue 32)."""
    store = Store(tmp_path / "db")

    def point(attempt: int, step: int, **values: float) -> MetricPoint:
        return MetricPoint(run_id="r-1", attempt=attempt, step=step, time=float(step),
                           values=values)  # fmt: skip

    store.add_metrics([point(1, 9, loss=2.5, lr=0.1), point(1, 10, steps_per_s=3.0)])
    store.add_metrics([point(1, 11, steps_per_s=3.5)])
    assert store.latest_metrics("r-1") == (11, {"loss": 2.5, "lr": 0.1, "steps_per_s": 3.5})
    store.add_metrics([point(1, 19, loss=2.0)])
    assert store.latest_metrics("r-1") == (19, {"loss": 2.0, "lr": 0.1, "steps_per_s": 3.5})
    # a new attempt starts afresh: nothing of attempt 1 is shown as its own
    store.add_metrics([point(2, 5, steps_per_s=1.0)])
    assert store.latest_metrics("r-1") == (5, {"steps_per_s": 1.0})
    store.add_metrics([point(1, 30, loss=9.0)])  # a late batch of the old attempt
    assert store.latest_metrics("r-1") == (5, {"steps_per_s": 1.0})
    store.close()
    # reopened (a restarted daemon): the newest step's own values
    assert Store(tmp_path / "db").latest_metrics("r-1") == (5, {"steps_per_s": 1.0})
