"""A database a crash left behind (issue 22 §2): a WAL with committed pages that were never
checkpointed (the daemon killed with SIGKILL), and a hot rollback journal (a writer killed
in the middle of a transaction). The next daemon starts on it, and nothing is lost.

Real daemons, real runs, real SQLite files: what was there is read through the daemon's
own API (`gpuctl --json ps`, `run.status`, `run.metrics`) before the crash and after.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from gpud.wire.client import Client
from gpud.wire.protocol import RUN_METRICS, RUN_STATUS
from gpud.wire.run_messages import MetricsReply, MetricsRequest, RunRef, RunStatus
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, script_spec, status, wait_for
from tests.support.waiting import until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

Daemons = Callable[..., RunningDaemon]

#: A finished run: 300 steps of three metrics in metrics.jsonl (which the daemon reads).
FINISHED = """
import json, os
run, attempt = os.environ["GPUD_RUN_ID"], int(os.environ["GPUD_ATTEMPT"])
with open(os.path.join(os.environ["GPUD_RUN_DIR"], "metrics.jsonl"), "w") as f:
    for step in range(300):
        f.write(json.dumps({"run": run, "attempt": attempt, "time": 1e9 + step, "step": step,
                            "values": {"loss": 3.0 - step / 100, "lr": 1e-3, "gnorm": 1.5}})
                + "\\n")
print("done", flush=True)
"""
#: A running run: a step of metrics every 10 ms until the file named by its argument shows.
RUNNING = """
import json, os, pathlib, sys, time
run, attempt = os.environ["GPUD_RUN_ID"], int(os.environ["GPUD_ATTEMPT"])
done = pathlib.Path(sys.argv[1])
print("training", flush=True)
step = 0
with open(os.path.join(os.environ["GPUD_RUN_DIR"], "metrics.jsonl"), "a") as f:
    while not done.exists():
        f.write(json.dumps({"run": run, "attempt": attempt, "time": time.time(), "step": step,
                            "values": {"loss": 1.0 / (step + 1), "lr": 1e-3}}) + "\\n")
        f.flush()
        step += 1
        time.sleep(0.01)
print(f"stopped after {step} steps", flush=True)
"""
#: A writer that changes every run and removes every metric point and event in one
#: transaction (with a one-page cache, so the changed pages reach the file), says so, and
#: waits to be killed: a hot journal.
CRASHING_WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size=1")
db.execute("BEGIN IMMEDIATE")
db.execute("DELETE FROM metrics WHERE step >= 0")
db.execute("DELETE FROM run_events WHERE id >= 0")
db.execute("UPDATE runs SET state = 'failed', body = json_set(body, '$.state', 'failed')")
db.execute("UPDATE attempts SET body = json_set(body, '$.reason', 'lost')")
print("changed", flush=True)
time.sleep(120)
"""
#: What every rollback journal starts with (SQLite's file format, "the rollback journal").
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


class Seen(NamedTuple):
    """One run as the daemon's API shows it."""

    state: str
    attempts: list[tuple[int, str, str | None]]
    events: list[tuple[float, str, str]]
    metrics: set[tuple[int, int, str, float]]


def seen(daemon: RunningDaemon) -> dict[str, Seen]:
    """Every run `gpuctl --json ps` lists, with its attempts, events and metric points."""
    listed = gpuctl("--node", daemon.address, "--json", "ps")
    assert listed.returncode == 0, listed.stderr
    found = {}
    with Client(daemon.target(), timeout_s=10) as client:
        for run in json.loads(listed.stdout)["runs"]:
            s = client.call(RUN_STATUS, RunRef(run=run["id"]))
            m = client.call(RUN_METRICS, MetricsRequest(run=run["id"]))
            assert isinstance(s, RunStatus) and isinstance(m, MetricsReply)
            found[run["id"]] = Seen(
                state=run["state"],
                attempts=[(a.attempt, a.state.value, a.reason) for a in s.attempts],
                events=[(e.time, e.kind, e.message) for e in s.events],
                metrics={
                    (row.attempt, row.step, name, value)
                    for row in m.rows
                    for name, value in row.values.items()
                },
            )
    return found


def finished_run(daemon: RunningDaemon, tmp_path: Path, name: str) -> str:
    run_id = launch(daemon, config=script_spec(tmp_path, FINISHED, name=name))
    wait_for(daemon, run_id, {"succeeded"}, timeout=60)
    until(
        f"the daemon holds {name}'s 300 steps",
        lambda: len(seen_metrics(daemon, run_id)) == 300 * 3,
        timeout=20,
        every=0.2,
    )
    return run_id


def seen_metrics(daemon: RunningDaemon, run_id: str) -> set[tuple[int, int, str, float]]:
    with Client(daemon.target(), timeout_s=10) as client:
        m = client.call(RUN_METRICS, MetricsRequest(run=run_id))
    assert isinstance(m, MetricsReply)
    return {(r.attempt, r.step, n, v) for r in m.rows for n, v in r.values.items()}


def restart(daemons: Daemons, old: RunningDaemon) -> RunningDaemon:
    """The same daemon again on the same state dir and ports; it starts cleanly."""
    new = daemons(
        node=old.node,
        state_dir=old.state_dir,
        control_port=int(old.address.rsplit(":", 1)[1]),
        events_port=int(old.events.rsplit(":", 1)[1]),
    )
    log = new.log()
    assert log.count("ready:") == 1, log
    assert "Traceback" not in log, log
    return new


def rows_in_main_file(state_dir: Path, scratch: Path) -> tuple[int, int]:
    """(runs, metric points) in gpud.db alone, without its WAL: a copy is opened, so the
    crashed WAL is left as it is for the next daemon."""
    scratch.mkdir()
    shutil.copy(state_dir / "gpud.db", scratch / "gpud.db")
    db = sqlite3.connect(scratch / "gpud.db")
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        counts = [
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if table in tables else 0
            for table in ("runs", "metrics")
        ]
    finally:
        db.close()
    return counts[0], counts[1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_daemon_killed_with_a_wal_not_checkpointed_restarts_and_loses_nothing(
    daemons: Daemons, tmp_path: Path
) -> None:
    first = daemons(node="n0", simulate_gpus=1)
    done = [finished_run(first, tmp_path, name) for name in ("first", "second")]
    stop_file = tmp_path / "stop-now"
    running = launch(first, config=script_spec(tmp_path, RUNNING, name="running",
                                                args=(str(stop_file),)))  # fmt: skip
    wait_for(first, running, {"running"}, timeout=30)
    until(
        "the running run's metrics reach the store",
        lambda: len(seen_metrics(first, running)) >= 2 * 100,
        timeout=30,
        every=0.2,
    )
    before = seen(first)
    assert set(before) == {*done, running}
    assert before[running].state == "running"
    shim = status(first, running).attempts[-1].shim_pid

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    wal = first.state_dir / "gpud.db-wal"
    assert wal.exists() and wal.stat().st_size > 0, "the kill left no WAL"
    # What the daemon had committed is in the WAL, not yet in gpud.db: the next daemon has
    # to read it from there.
    runs_alone, points_alone = rows_in_main_file(first.state_dir, tmp_path / "main-file-only")
    points_before = sum(len(s.metrics) for s in before.values())
    print(
        f"killed with a WAL of {wal.stat().st_size / 1024:.0f} KiB; gpud.db alone holds"
        f" {runs_alone} of {len(before)} runs and {points_alone} of {points_before} metric"
        " points read before the kill"
    )
    assert runs_alone < len(before) or points_alone < points_before, (
        "the WAL held nothing that gpud.db lacked: this test tests nothing"
    )

    second = restart(daemons, first)
    assert "the last daemon did not stop cleanly; its WAL" in second.log(), second.log()
    assert "re-adopted" in second.log(), second.log()
    after = seen(second)
    assert set(after) == set(before)
    for run_id in done:
        assert after[run_id] == before[run_id], run_id
    # The running run went on without its daemon (its shim kept it): what was there is
    # still there, and more came.
    assert status(second, running).attempts[-1].shim_pid == shim
    was, now = before[running], after[running]
    assert now.state == "running"
    assert now.attempts == was.attempts
    assert set(was.events) <= set(now.events)
    assert any(kind == "adopt" for _, kind, _ in now.events), now.events
    assert was.metrics <= now.metrics
    assert len(now.metrics) > len(was.metrics)

    # New writes: the re-adopted run's end, and a new run.
    stop_file.touch()
    ended = wait_for(second, running, {"succeeded", "failed"}, timeout=30)
    assert ended.run.state.value == "succeeded", ended.run.reason
    steps = {step for _, step, _, _ in seen_metrics(second, running)}
    assert steps == set(range(len(steps))), "metric steps lost"
    third = finished_run(second, tmp_path, "third")
    assert set(seen(second)) == {*done, running, third}


def test_a_hot_rollback_journal_is_rolled_back_and_the_daemon_starts_in_wal_mode(
    daemons: Daemons, tmp_path: Path
) -> None:
    first = daemons(node="n0", simulate_gpus=1)
    done = [finished_run(first, tmp_path, name) for name in ("first", "second")]
    before = seen(first)
    assert first.stop() == 0
    database = first.state_dir / "gpud.db"
    assert not database.with_name("gpud.db-wal").exists(), "a clean stop left a WAL"
    # A rollback journal exists only outside WAL mode: with no daemon, the way an older
    # tool (or the sqlite3 shell) would open it.
    db = sqlite3.connect(database)
    assert db.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    db.close()
    untouched = digest(database)
    writer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(database)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "changed"
    writer.kill()
    writer.wait(timeout=10)
    journal = database.with_name("gpud.db-journal")
    assert journal.read_bytes()[:8] == JOURNAL_MAGIC, "no hot journal"
    assert digest(database) != untouched, "the killed transaction changed nothing in gpud.db"
    print(f"a hot journal of {journal.stat().st_size / 1024:.0f} KiB; gpud.db torn")

    second = restart(daemons, first)
    assert not journal.exists(), "the journal was not rolled back"
    assert "rolled back a transaction a crashed writer left unfinished" in second.log()
    assert "did not stop cleanly" not in second.log()
    assert seen(second) == before
    # WAL mode again, in the file's header and for any other reader.
    assert database.read_bytes()[18:20] == b"\x02\x02"
    reader = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        reader.close()
    third = finished_run(second, tmp_path, "third")
    assert set(seen(second)) == {*done, third}
