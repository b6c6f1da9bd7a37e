"""How long an elastic run takes to train again on the nodes it has left (issue 21 §3).

Three real `gpud serve` on this host make a 3-node run of the CPU DDP example (one gloo
rank per node, `elastic: {min_nodes: 2}`, `lost_after_s: 10`, a checkpoint every 20
steps, and README's elastic example's `restart: {max_attempts: 5}` with the default
backoff). Node 2 freezes whole (SIGSTOP of its daemon and its rank):
node 0 waits `lost_after_s`, calls it lost, stops the other parts and starts the next
attempt on nodes 0 and 1 from the latest checkpoint. Measured from the freeze to the
first step of the 2-node attempt, from the run's own records, and split into:

- detect: the freeze to the `lost` event (lost_after_s and a poll);
- stop: the lost event to the new attempt's start (stopping what is left, the restart);
- preflight: the collective check across the new attempt's nodes (`trainers.preflight`),
  which node 0 runs before it starts the attempt;
- start-up: the attempt's start to its first step (torch import, rendezvous, the
  checkpoint's load).

Beside it, the same-shape restart: the same 3-node run, not elastic, with a rank on node 2
killed (its failure is seen at once), restarted on the same three nodes: a crash, so it
waits the backoff (10 s) first.

    .venv/bin/python bench/elastic_recovery.py
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpud.runs.process import procs  # noqa: E402
from gpud.wire.client import Client, NodeTarget  # noqa: E402
from gpud.wire.protocol import RUN_METRICS, RUN_STATUS  # noqa: E402
from gpud.wire.run_messages import MetricsRequest, RunRef, RunStatus  # noqa: E402
from tests.support.daemons import RunningDaemon, gpuctl, start_daemon  # noqa: E402

FAST = "args=[--width, '128', --depth, '2', --log-every, '5']"
LOST_AFTER_S = 10


def _status(target: NodeTarget, run_id: str) -> RunStatus:
    with Client(target, timeout_s=10) as client:
        reply = client.call(RUN_STATUS, RunRef(run=run_id))
    assert isinstance(reply, RunStatus)
    return reply


def _rows(target: NodeTarget, run_id: str, attempt: int) -> list[float]:
    with Client(target, timeout_s=10) as client:
        reply = client.call(RUN_METRICS, MetricsRequest(run=run_id, name="loss", attempt=attempt))
    return [r.time for r in reply.rows]


def _launch(nodes: list[RunningDaemon], *sets: str) -> str:
    args = [a for n in nodes for a in ("--node", n.address)]
    args += ["--json", "launch", str(ROOT / "config/examples/cpu-ddp.yaml")]
    base = (
        FAST, "training.max_steps=100000", "nproc_per_node=1", "checkpoint.every_steps=20",
        f"lost_after_s={LOST_AFTER_S}", "restart.max_attempts=5",  # README's example
    )  # fmt: skip
    for setting in (*base, *sets):
        args += ["--set", setting]
    launched = gpuctl(*args)
    assert launched.returncode == 0, launched.stderr
    return str(json.loads(launched.stdout)["run"]["id"])


def _wait_rows(target: NodeTarget, run_id: str, attempt: int, at_least: int) -> list[float]:
    deadline = time.monotonic() + 300
    while True:
        rows = _rows(target, run_id, attempt)
        if len(rows) >= at_least:
            return rows
        assert time.monotonic() < deadline, f"attempt {attempt} never trained"
        time.sleep(0.2)


def one(elastic: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpud-elastic-") as tmp:
        nodes = [start_daemon(Path(tmp), node=f"n{i}", simulate_gpus=None) for i in range(3)]
        frozen: list[psutil.Process] = []
        run_id = None
        try:
            run_id = _launch(nodes, *(["elastic={min_nodes: 2}"] if elastic else []))
            target = nodes[0].target()
            _wait_rows(target, run_id, 1, 45)
            victims = procs.tagged(run_id, node_rank=2)
            began = time.time()
            if elastic:
                frozen = [psutil.Process(nodes[2].proc.pid), *victims]
                for p in frozen:
                    p.suspend()
            else:
                worker = next(p for p in victims if "ddp.py" in " ".join(p.cmdline()))
                worker.send_signal(signal.SIGKILL)
            trained = min(_wait_rows(target, run_id, 2, 1))
            status = _status(target, run_id)
            started = next(
                e.time for e in status.events if e.kind == "attempt" and "attempt 2:" in e.message
            )
            lost = next((e.time for e in status.events if e.kind == "lost"), None)
            failed = (
                lost
                if lost is not None
                else min(
                    e.time
                    for e in status.events
                    if e.kind in ("propagate", "state") and e.time > began
                )
            )
            world = status.attempts[-1].world_size
            # The collective check runs inside the restart, before the attempt's event.
            check = next(
                (e for e in status.events if e.kind == "preflight" and e.time > failed), None
            )
            took = re.search(r" in ([\d.]+)s", check.message) if check else None
            preflight = float(took.group(1)) if took else 0.0
            gpuctl("--node", nodes[0].address, "stop", run_id, "--force", timeout=60)
            return {
                "detect": failed - began,
                "stop": started - failed - preflight,
                "preflight": preflight,
                "start-up": trained - started,
                "total": trained - began,
                "world": float(world or 0),
            }
        finally:
            for p in frozen:
                try:
                    p.resume()
                except psutil.NoSuchProcess:
                    pass
            for node in nodes:
                node.stop()
            # a daemon's stop leaves its runs going (by design): the frozen node's part,
            # which node 0 could not stop, would train on alone
            for left in procs.tagged(run_id) if run_id else []:
                try:
                    left.kill()
                except psutil.NoSuchProcess:
                    pass


def main() -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"3 nodes (3 daemons on this host) × 1 gloo rank; lost_after_s {LOST_AFTER_S}")
    print()
    print(f"{'':<34} {'detect':>7} {'stop':>6} {'preflight':>10} {'start-up':>9} {'total':>7}")
    rows = (
        ("elastic: node 2 frozen, 2 go on", one(elastic=True)),
        ("same shape: rank 2 killed, 3 again", one(elastic=False)),
    )
    for label, t in rows:
        print(
            f"{label:<34} {t['detect']:>6.1f}s {t['stop']:>5.1f}s {t['preflight']:>9.1f}s"
            f" {t['start-up']:>8.1f}s {t['total']:>6.1f}s  (world {int(t['world'])})"
        )
    elastic = rows[0][1]
    print()
    print(
        f"elastic total over its detection: {elastic['total'] - elastic['detect']:.1f}s"
        f" (target: 15 s at most); detection is lost_after_s ({LOST_AFTER_S}s) plus a poll"
    )


if __name__ == "__main__":
    main()
