"""What retention costs the daemon's loop, and `gpuctl ps` over a long history (issue 22).

Writes a state dir with `--runs` finished runs (each with `--points` metric points, a few
events, an attempt and a small run dir) through the store, starts a real `gpud serve` on
it with `--retention-max-runs --keep`, and while `gpuctl gc` removes the rest, a client
asks node.info back to back: its round trips during the pass beside the same before it
(the ratio), the pass's own longest hold of the loop (`longest_block_ms`), the free pages
given back, and the database file before and after. Then `--history` runs in the store and
the time of `run.list` (what `gpuctl ps` asks) and of a whole `gpuctl ps`.

    .venv/bin/python bench/retention_gc.py [--runs 1000] [--points 2000] [--keep 100]
        [--history 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpud.model.run import (  # noqa: E402
    AttemptRecord,
    MetricPoint,
    RunEvent,
    RunRecord,
    RunState,
)
from gpud.node.store import Store  # noqa: E402
from gpud.wire.client import Client  # noqa: E402
from gpud.wire.node_messages import Empty  # noqa: E402
from gpud.wire.protocol import NODE_INFO, RUN_LIST  # noqa: E402
from gpud.wire.run_messages import ListRequest  # noqa: E402
from tests.support.daemons import gpuctl, start_daemon  # noqa: E402

#: Seconds a daemon is left after start-up before `ps` is timed.
SETTLE_S = 10.0


def fill(state: Path, runs: int, points: int, start: float = 0.0) -> None:
    """`runs` finished runs, each ended a minute after the one before."""
    (state / "runs").mkdir(parents=True, exist_ok=True)
    store = Store(state / "gpud.db")
    now = time.time() - runs * 60 - start
    for i in range(runs):
        run_id = f"bench-{start:.0f}-{i:06d}"
        run_dir = state / "runs" / run_id
        (run_dir / "attempt-1").mkdir(parents=True, exist_ok=True)
        (run_dir / "attempt-1" / "output.log").write_bytes(b"step 1 loss 0.5\n" * 256)
        ended = now + i * 60
        store.put_run(
            RunRecord(
                id=run_id, name="bench", created_at=ended - 50, spec={"name": "bench"},
                nodes=[], node_rank=0, state=RunState.SUCCEEDED, state_since=ended,
                run_dir=str(run_dir), checkpoint_dir=str(run_dir / "checkpoints"),
            )
        )  # fmt: skip
        store.put_attempt(
            AttemptRecord(
                run_id=run_id, attempt=1, node_rank=0, state=RunState.SUCCEEDED,
                state_since=ended, master_addr="127.0.0.1", master_port=1, nproc=1,
                attempt_dir=str(run_dir / "attempt-1"), gpus=[0], started_at=ended - 50,
                ended_at=ended,
            )
        )  # fmt: skip
        for kind in ("launch", "state", "state", "state"):
            store.add_run_event(
                RunEvent(run_id=run_id, attempt=1, time=ended, node="bench", kind=kind,
                         message="launched by bench@host" if kind == "launch" else kind,
                         data={"by": "bench@host"} if kind == "launch" else {})
            )  # fmt: skip
        if points:
            store.add_metrics(
                [MetricPoint(run_id=run_id, attempt=1, step=s, time=ended,
                             values={"loss": 1.0 / (s + 1), "lr": 1e-3}) for s in range(points)]
            )  # fmt: skip
    store.close()


def ping(client: Client, until: threading.Event, out: list[float]) -> None:
    while not until.is_set():
        started = time.perf_counter()
        client.call(NODE_INFO, Empty())
        out.append(time.perf_counter() - started)


def quantiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[int(len(ordered) * 0.99) - 1] if len(ordered) >= 100 else ordered[-1]
    return (
        f"n={len(ordered)} median {statistics.median(ordered) * 1000:.2f} ms,"
        f" p99 {p99 * 1000:.2f} ms, max {ordered[-1] * 1000:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=2000)
    parser.add_argument("--keep", type=int, default=100)
    parser.add_argument("--history", type=int, default=10_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpud-bench-retention-"))
    os.environ["GPUD_CONFIG_DIR"] = str(tmp / "config")
    state = tmp / "state"
    started = time.perf_counter()
    fill(state, args.runs, args.points)
    db_before = (state / "gpud.db").stat().st_size
    print(f"wrote {args.runs} runs x {args.points} steps x 2 metrics"
          f" ({db_before / 2**20:.1f} MiB) in {time.perf_counter() - started:.1f}s")  # fmt: skip
    daemon = start_daemon(
        tmp, state_dir=state, simulate_gpus=2, interval=1.0,
        extra=("--retention-max-runs", str(args.keep), "--retention-interval-minutes", "0"),
    )  # fmt: skip
    try:
        client = daemon.client(timeout_s=30)
        idle: list[float] = []
        stop = threading.Event()
        pinger = threading.Thread(target=ping, args=(client, stop, idle))
        pinger.start()
        time.sleep(3)
        stop.set()
        pinger.join()
        during: list[float] = []
        stop = threading.Event()
        other = daemon.client(timeout_s=30)
        pinger = threading.Thread(target=ping, args=(other, stop, during))
        pinger.start()
        done = gpuctl("--node", daemon.address, "--json", "gc", timeout=900)
        stop.set()
        pinger.join()
        reply = json.loads(done.stdout)["nodes"][0]["gc"]
        db_after = (state / "gpud.db").stat().st_size
        print(f"gc: removed {len(reply['removed'])} runs in {reply['elapsed_s']:.2f}s,"
              f" longest hold of the loop {reply['longest_block_ms']:.1f} ms,"
              f" {reply['vacuumed_pages']} free pages given back;"
              f" gpud.db {db_before / 2**20:.1f} MiB -> {db_after / 2**20:.1f} MiB")  # fmt: skip
        print(f"node.info idle:      {quantiles(idle)}")
        print(f"node.info during gc: {quantiles(during)}")
        print(f"ratio of max round trip, during gc / idle: {max(during) / max(idle):.2f}")
        held = [line for line in daemon.log().splitlines() if "held the loop" in line]
        print(f"steps over 50 ms: {len(held)}", *held[:10], sep="\n  ")
    finally:
        daemon.stop()
    short = list_times(tmp, state, args.keep)
    fill(state, args.history, 20, start=10**7)
    long = list_times(tmp, state, args.history + args.keep)
    print(f"ratio, {args.history + args.keep} runs / {args.keep}: run.list"
          f" {long[0] / short[0]:.2f}, gpuctl ps {long[1] / short[1]:.2f}")  # fmt: skip


def list_times(tmp: Path, state: Path, runs: int) -> tuple[float, float]:
    """The median run.list (what `gpuctl ps` asks: the 200 newest) and a whole `gpuctl ps`
    (a new process: Python's start-up included), in seconds."""
    daemon = start_daemon(tmp, state_dir=state, simulate_gpus=2, interval=1.0,
                          extra=("--retention-max-runs", "0", "--retention-interval-minutes",
                                 "0"))  # fmt: skip
    try:
        time.sleep(SETTLE_S)  # its first measure of the state dir walks every run dir
        client = daemon.client(timeout_s=30)
        times, wholes = [], []
        for _ in range(10):
            t = time.perf_counter()
            client.call(RUN_LIST, ListRequest())
            times.append(time.perf_counter() - t)
        for _ in range(3):
            t = time.perf_counter()
            ps = gpuctl("--node", daemon.address, "ps")
            wholes.append(time.perf_counter() - t)
            assert ps.returncode == 0, ps.stderr
        listed, whole = statistics.median(times), statistics.median(wholes)
        print(
            f"{runs} runs in history: run.list (200 newest) median {listed * 1000:.1f} ms;"
            f" a whole `gpuctl ps` (a new process) median {whole * 1000:.0f} ms"
        )
        return listed, whole
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
