"""A client that keeps asking a daemon `node.info`, to measure how long the control plane
goes unanswered while something else happens to the daemon.

It asks from a process of its own: a prober thread in the test process shares the test's
GIL with whatever else the test does (decoding status replies, driving an attack) and
would charge that time to the daemon.

    with Prober(daemon) as prober:
        ...                      # the abuse
    prober.worst_s, prober.summary()
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

from gpud.wire.client import Client, resolve_target
from tests.support.daemons import RunningDaemon


class Prober:
    """Asks node.info every `every_s` from a child process; keeps every answer's time.

    `silence_s` is the longest time without an answer (a slow answer, and the wait between
    asks, included), as a client polling the daemon would see it.
    """

    def __init__(self, daemon: RunningDaemon, every_s: float = 0.02) -> None:
        self.daemon = daemon
        self.every_s = every_s
        self.worst_s = 0.0
        self.silence_s = 0.0
        self.asked = 0
        self.latencies: list[float] = []
        self.failed: list[str] = []
        self._proc: subprocess.Popen[str] | None = None

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        return (
            f"node.info every {self.every_s * 1000:.0f} ms: {self.asked} asked, median "
            f"{self.percentile(0.5) * 1000:.1f} ms, p99 {self.percentile(0.99) * 1000:.1f} ms, "
            f"slowest {self.worst_s * 1000:.0f} ms"
        )

    def __enter__(self) -> Prober:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.probe", self.daemon.address, str(self.every_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()  # its first answer came: it is measuring
        assert ready.strip() == "ready", ready
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        out, _ = self._proc.communicate(timeout=90)
        found = json.loads(out.strip().splitlines()[-1])
        self.latencies = found["latencies"]
        self.silence_s = found["silence_s"]
        self.failed = found["failed"]
        self.asked = len(self.latencies)
        self.worst_s = max(self.latencies, default=0.0)


def _probe(address: str, every_s: float) -> None:
    done = threading.Event()

    def finish(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, finish)
    latencies: list[float] = []
    failed: list[str] = []
    silence = 0.0
    with Client(resolve_target(address), timeout_s=60) as client:
        client.node_info()
        print("ready", flush=True)
        last_answer = time.monotonic()
        while not done.is_set():
            began = time.monotonic()
            try:
                client.node_info()
            except Exception as exc:  # any failure is a finding, reported as text
                failed.append(str(exc))
            now = time.monotonic()
            latencies.append(now - began)
            silence = max(silence, now - last_answer)
            last_answer = now
            done.wait(every_s)
    print(json.dumps({"latencies": latencies, "silence_s": silence, "failed": failed[:20]}))


if __name__ == "__main__":
    _probe(sys.argv[1], float(sys.argv[2]))
