"""Retention on a real daemon (issue 22 §1): `gpuctl gc` removes the finished runs over
the bounds — records, events, metrics, run dirs — and never a checkpoint nor an active run;
it thins old metric points; what it did shows in gpuctl, the log, the audit log and
/metrics."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.wire.client import Client
from gpud.wire.protocol import RUN_METRICS
from gpud.wire.run_messages import MetricsReply, MetricsRequest
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.runs import force_stop, launch, script_spec, wait_for
from tests.support.waiting import until

pytestmark = pytest.mark.slow

FINISHED = """
import os, pathlib
run_dir = pathlib.Path(os.environ["GPUD_RUN_DIR"])
(run_dir / "checkpoints").mkdir(exist_ok=True)
(run_dir / "checkpoints" / "step-1.pt").write_bytes(b"weights" * 100)
(run_dir / "notes.txt").write_text("scratch " * 1000)
print("done")
"""
BUSY = "import time\nprint('training', flush=True)\ntime.sleep(120)\n"
BIG = """
import os
with open(os.path.join(os.environ["GPUD_RUN_DIR"], "blob.bin"), "wb") as f:
    f.write(os.urandom(4 * 2**20))
"""
#: 6,000 steps of a falling loss with one spike and one dip, in the trainers library's
#: metrics.jsonl (which the daemon reads into its store).
CURVE = """
import json, os, time
run, attempt = os.environ["GPUD_RUN_ID"], int(os.environ["GPUD_ATTEMPT"])
with open(os.path.join(os.environ["GPUD_RUN_DIR"], "metrics.jsonl"), "w") as f:
    for step in range(6000):
        loss = 50.0 if step == 1234 else -5.0 if step == 2345 else 3.0 - step / 3000
        f.write(json.dumps({"run": run, "attempt": attempt, "time": time.time(),
                            "step": step, "values": {"loss": loss}}) + "\\n")
"""


def finished_run(daemon: RunningDaemon, tmp_path: Path, name: str, code: str) -> str:
    run_id = launch(daemon, config=script_spec(tmp_path, code, name=name))
    wait_for(daemon, run_id, {"succeeded"}, timeout=60)
    return run_id


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gpud_state_")
    }


def metric_rows(daemon: RunningDaemon, run_id: str) -> dict[int, float]:
    with Client(daemon.target(), timeout_s=10) as client:
        reply = client.call(RUN_METRICS, MetricsRequest(run=run_id, name="loss"))
    assert isinstance(reply, MetricsReply)
    return {row.step: row.values["loss"] for row in reply.rows}


def test_gc_removes_the_oldest_finished_runs_and_keeps_checkpoints_and_active_runs(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    port = free_port()
    daemon = daemons(
        extra=("--retention-max-runs", "3", "--retention-interval-minutes", "0",
               "--metrics", f"127.0.0.1:{port}"),
    )  # fmt: skip
    busy = launch(daemon, config=script_spec(tmp_path, BUSY, name="busy"))
    wait_for(daemon, busy, {"running"})
    runs = [finished_run(daemon, tmp_path, f"done{i}", FINISHED) for i in range(5)]
    old, kept = runs[:2], runs[2:]
    run_dirs = {r: daemon.state_dir / "runs" / r for r in runs}

    dry = gpuctl("--node", daemon.address, "gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    head = dry.stdout.splitlines()[0]
    assert "would remove 2 finished run(s), kept 3" in head and "1 active or in use" in head
    listed = [line.split()[0] for line in dry.stdout.splitlines()[2:4]]
    assert listed == old and "over max_runs 3 (5 finished)" in dry.stdout
    assert all((run_dirs[r] / "attempt-1").is_dir() for r in runs)  # a dry run removes nothing

    done = gpuctl("--node", daemon.address, "--json", "gc")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)["nodes"][0]["gc"]
    assert [r["id"] for r in reply["removed"]] == old
    assert reply["removed"][0]["kept"] == [str(run_dirs[old[0]] / "checkpoints")]
    assert reply["runs"] == 4 and reply["protected"] == 1
    for r in old:  # the run dir is gone but its checkpoints
        assert [p.name for p in run_dirs[r].iterdir()] == ["checkpoints"]
        assert (run_dirs[r] / "checkpoints" / "step-1.pt").read_bytes() == b"weights" * 100
        unknown = gpuctl("--node", daemon.address, "status", r)
        assert unknown.returncode == 1 and unknown.stderr.strip().splitlines() == [
            f"gpuctl: error: no run {r!r} on {daemon.address}"
        ]
    for r in kept:
        assert (run_dirs[r] / "notes.txt").exists()
    ps = gpuctl("--node", daemon.address, "--json", "ps")
    assert sorted(r["id"] for r in json.loads(ps.stdout)["runs"]) == sorted([busy, *kept])
    assert wait_for(daemon, busy, {"running"}).run.state.value == "running"

    again = gpuctl("--node", daemon.address, "gc")  # nothing more is over the bounds
    assert again.returncode == 0 and "removed 0 finished run(s), kept 3" in again.stdout

    series = scrape(port)
    assert series["gpud_state_runs"] == 4
    assert series['gpud_state_bytes{part="checkpoints"}'] == 2 * 700 + 3 * 700
    assert series['gpud_state_bytes{part="database"}'] > 0
    log = daemon.log()
    assert all(f"retention: removed run {r} " in log for r in old)
    audit = (daemon.state_dir / "audit.log").read_text()
    assert '"action": "node.gc"' in audit or '"action":"node.gc"' in audit
    db = sqlite3.connect(f"file:{daemon.state_dir / 'gpud.db'}?mode=ro", uri=True)
    usage = [json.loads(body) for (body,) in db.execute("SELECT body FROM run_usage")]
    db.close()
    assert sorted(u["run_id"] for u in usage) == sorted(old)
    assert all(u["user"] and u["wall_s"] > 0 and u["ended_at"] for u in usage)
    force_stop(daemon, busy)


def test_gc_bounds_bytes_and_thins_a_finished_runs_old_metrics(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = daemons(
        extra=("--retention-max-bytes", "2MiB", "--retention-full-steps", "100",
               "--retention-interval-minutes", "0"),
    )  # fmt: skip
    big = finished_run(daemon, tmp_path, "big", BIG)
    curve = finished_run(daemon, tmp_path, "curve", CURVE)
    until("6000 metric rows", lambda: len(metric_rows(daemon, curve)) == 6000, timeout=30)

    done = gpuctl("--node", daemon.address, "--json", "gc")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)["nodes"][0]["gc"]
    assert [r["id"] for r in reply["removed"]] == [big]
    assert reply["removed"][0]["why"].startswith("over max_bytes 2.0 MiB")
    assert not (daemon.state_dir / "runs" / big).exists()
    assert reply["thinned_runs"] == 1 and reply["points_removed"] > 1000

    thinned = metric_rows(daemon, curve)
    assert len(thinned) <= 100 + 4 * 1000 < 6000
    assert set(range(5900, 6000)) <= set(thinned)  # the last steps stay whole
    assert {0, 1234, 2345, 5999} <= set(thinned)  # first, last, the spike and the dip
    assert max(thinned.values()) == 50.0 and min(thinned.values()) == -5.0
    again = json.loads(gpuctl("--node", daemon.address, "--json", "gc").stdout)
    assert again["nodes"][0]["gc"]["thinned_runs"] == 0  # once per finished attempt
