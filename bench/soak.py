"""A daemon that lives for months, in 20 minutes (issue 22 §4).

One real `gpud serve` (8 simulated GPUs, 1 s interval, retention bounds small enough to be
reached: `--max-runs`, `--max-bytes`, a pass every minute; run logs bounded at 1 MB) is
given several thousand short real runs, launched and ended back to back, at most
`--concurrent` at once, through the control socket as gpuctl does:

- `ok`: prints a few metric lines and succeeds;
- `spam`: writes ~4 MB of log as fast as it can (its log is bounded);
- `fail`: raises (the cause is found from its traceback);
- `long`: would run a minute; it is stopped (the stop handshake, then SIGTERM).

A client asks `node.info` every 50 ms throughout. Printed, start against end: the daemon's
idle CPU (30 s with nothing running and one viewer, before the load, and once it
drained and the ended runs left the node brief; the end's split by component), its RSS and
open file descriptors, the control round trip's p50/p99 in the first and the last 2
minutes of load, the state dir's size against its bound, and the runs it holds; then a
whole `gpuctl ps` (a new process) against a state dir with 10,000 runs in history.

    .venv/bin/python bench/soak.py [--minutes 20] [--long] [--concurrent 6]

`--long` soaks for 4 hours (or `--minutes`, whichever is longer).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from bench.daemon_overhead import LAST_COMPONENTS, idle_cost, print_components  # noqa: E402
from bench.retention_gc import fill, list_times  # noqa: E402
from gpud.wire.brief import ENDED_KEPT_S  # noqa: E402
from gpud.wire.client import Client, ClientError  # noqa: E402
from gpud.wire.protocol import RUN_LAUNCH, RUN_LIST, RUN_STOP  # noqa: E402
from gpud.wire.run_messages import LaunchRequest, ListRequest, NodeRefIn, RunList, StopRequest  # noqa: E402
from tests.support.daemons import RunningDaemon, free_port, start_daemon  # noqa: E402

SCRIPTS = {
    "ok": "import time\nfor i in range(5):\n    print(f'step {i} loss {1 / (i + 1):.3f}',"
    " flush=True)\n    time.sleep(0.05)\n",
    "spam": "import sys\nline = 'x' * 199 + '\\n'\nfor _ in range(20000):\n"
    "    sys.stdout.write(line)\n",
    "fail": "print('step 0 loss 1.0', flush=True)\nraise RuntimeError('soak: this run fails')\n",
    "long": "import time\nprint('step 0 loss 1.0', flush=True)\ntime.sleep(60)\n",
}
MIX = ["ok"] * 7 + ["spam", "fail", "long"]
STOP_S = 2.0  # a `long` run is stopped this long after its launch
MB = 1e6


def du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def state_runs(port: int) -> str:
    """`gpud_state_runs` from the daemon's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("gpud_state_runs "):
            return str(line.split()[1])
    return "?"


class Pinger(threading.Thread):
    """node.info every 50 ms: (when, seconds) of each round trip."""

    def __init__(self, daemon: RunningDaemon) -> None:
        super().__init__(daemon=True)
        self.target = daemon.target()
        self.proc = psutil.Process(daemon.proc.pid)
        self.samples: list[tuple[float, float]] = []
        self.memory: list[tuple[float, int, int]] = []  # (when, RSS, fds) every 10 s
        self.stop = threading.Event()

    def run(self) -> None:
        with Client(self.target, timeout_s=10) as client:
            while not self.stop.is_set():
                t = time.perf_counter()
                client.node_info()
                now = time.monotonic()
                self.samples.append((now, time.perf_counter() - t))
                if not self.memory or now - self.memory[-1][0] >= 10.0:
                    self.memory.append((now, self.proc.memory_info().rss, self.proc.num_fds()))
                time.sleep(0.05)

    def warm(self, after: float) -> tuple[int, int]:
        """RSS and fds at the first reading past `after` (the allocator warmed up)."""
        later = [(rss, fds) for when, rss, fds in self.memory if when >= after]
        return later[0] if later else (self.memory[-1][1], self.memory[-1][2])

    def between(self, start: float, end: float) -> str:
        took = sorted(s for when, s in self.samples if start <= when < end)
        if not took:
            return "no samples"
        p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
        return f"p50 {statistics.median(took) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms ({len(took)})"


def spec_for(kind: str, workdir: Path) -> dict[str, object]:
    return {
        "name": f"soak-{kind}", "launcher": "python", "nproc_per_node": 1, "gpus": 1,
        "backend": "gloo", "workdir": str(workdir), "script": f"{kind}.py", "stop_grace_s": 1,
    }  # fmt: skip


def soak(daemon: RunningDaemon, workdir: Path, seconds: float, concurrent: int) -> Counter[str]:
    """Launch and end runs for `seconds`; returns how many of each kind were launched."""
    target = daemon.target()
    node = NodeRefIn(
        control=target.control,
        server_key=target.server_key.decode() if target.server_key else None,
    )
    launched: Counter[str] = Counter()
    active: dict[str, tuple[str, float]] = {}  # run → (kind, launched at)
    stopped: set[str] = set()
    rng = random.Random(7)
    end = time.monotonic() + seconds
    with Client(target, timeout_s=30) as client:
        while time.monotonic() < end or active:
            listed = client.call(RUN_LIST, ListRequest())
            assert isinstance(listed, RunList)
            states = {r.id: r.state for r in listed.runs}
            for run_id in list(active):
                kind, at = active[run_id]
                state = states.get(run_id)
                if state is not None and state.terminal:
                    del active[run_id]
                elif kind == "long" and run_id not in stopped and time.monotonic() - at > STOP_S:
                    client.call(RUN_STOP, StopRequest(run=run_id))
                    stopped.add(run_id)
                elif time.monotonic() - at > 120:  # never seen to end: stop waiting for it
                    del active[run_id]
            while time.monotonic() < end and len(active) < concurrent:
                kind = rng.choice(MIX)
                try:
                    reply = client.call(
                        RUN_LAUNCH, LaunchRequest(spec=spec_for(kind, workdir), nodes=[node])
                    )
                except ClientError as exc:  # GPUs busy with runs still ending: next round
                    if "unavailable" not in str(exc):
                        raise
                    break
                active[reply.run.id] = (kind, time.monotonic())
                launched[kind] += 1
            time.sleep(0.1)
    return launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--long", action="store_true", help="soak for 4 hours")
    parser.add_argument("--concurrent", type=int, default=6)
    parser.add_argument("--max-runs", type=int, default=500)
    parser.add_argument("--max-bytes", default="200MiB")
    parser.add_argument("--history", type=int, default=10_000)
    args = parser.parse_args()
    minutes = max(args.minutes, 240.0) if args.long else args.minutes
    print(
        f"machine: {platform.node()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="gpud-soak-") as tmp_text:
        tmp = Path(tmp_text)
        os.environ["GPUD_CONFIG_DIR"] = str(tmp / "config")
        workdir = tmp / "scripts"
        workdir.mkdir()
        for kind, code in SCRIPTS.items():
            (workdir / f"{kind}.py").write_text(code)
        state = tmp / "state"
        metrics_port = free_port()
        bounds = (
            "--retention-max-runs", str(args.max_runs), "--retention-max-bytes", args.max_bytes,
            "--retention-interval-minutes", "1", "--logs-max-bytes", "1MB",
            "--metrics", f"127.0.0.1:{metrics_port}",
        )  # fmt: skip
        daemon = start_daemon(tmp, state_dir=state, simulate_gpus=8, interval=1.0, extra=bounds)
        try:
            proc = psutil.Process(daemon.proc.pid)
            time.sleep(5.0)
            idle_start = idle_cost(daemon, 30.0)[0] * 100
            rss_start, fds_start = proc.memory_info().rss, proc.num_fds()
            pinger = Pinger(daemon)
            pinger.start()
            began = time.monotonic()
            launched = soak(daemon, workdir, minutes * 60, args.concurrent)
            ended = time.monotonic()
            pinger.stop.set()
            pinger.join()
            # Past a retention pass, and past the time the node brief names ended runs.
            time.sleep(float(os.environ.get("SOAK_SETTLE_S", str(ENDED_KEPT_S + 10))))
            idle_end = idle_cost(daemon, 30.0)[0] * 100
            rss_end, fds_end = proc.memory_info().rss, proc.num_fds()
            size = du(state)
            held = state_runs(metrics_port)
        finally:
            daemon.stop()
        runs = sum(launched.values())
        print(
            f"soak: {minutes:.0f} min, {runs} runs launched and ended"
            f" ({', '.join(f'{k} {n}' for k, n in sorted(launched.items()))}),"
            f" at most {args.concurrent} at once;"
            f" retention max_runs {args.max_runs}, max_bytes {args.max_bytes}"
        )
        print(f"  daemon idle CPU     start {idle_start:6.3f} %   end {idle_end:6.3f} %")
        print_components("      end: ")
        passes = LAST_COMPONENTS.get("retention", 0.0) * 100
        print(f"  daemon idle CPU at the end less the retention passes (one a minute here; the"
              f" default is an hour): {idle_end - passes:6.3f} %")  # fmt: skip
        rss_warm, fds_warm = pinger.warm(began + min(120.0, (ended - began) / 4))
        print(f"  daemon RSS          idle {rss_start / MB:6.1f} MB, after 2 min of load"
              f" {rss_warm / MB:6.1f} MB, end {rss_end / MB:6.1f} MB"
              f" ({(rss_end / rss_warm - 1) * 100:+.1f} % since 2 min)")  # fmt: skip
        print(f"  open fds            idle {fds_start:6d},    after 2 min of load {fds_warm:6d},"
              f"    end {fds_end:6d}")  # fmt: skip
        print(f"  node.info, first 2 min of load: {pinger.between(began, began + 120)}")
        print(f"  node.info, last 2 min of load:  {pinger.between(ended - 120, ended)}")
        print(f"  state dir {size / MB:.1f} MB (bound on finished runs {args.max_bytes});"
              f" {held} runs held (max_runs {args.max_runs} finished)")  # fmt: skip
        history = tmp / "history"
        fill(history, args.history, points=10)
        # As an installed gpuctl starts: its modules' bytecode cached (pip compiles them at
        # install; this machine's PYTHONDONTWRITEBYTECODE would recompile them every time).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        list_times(tmp, history, args.history)


if __name__ == "__main__":
    main()
