"""A client that keeps asking a daemon `node.info`, to measure how long the control plane
goes unanswered while something else happens to the daemon."""

from __future__ import annotations

import threading
import time

from gpud.client import Client
from tests.support.daemons import RunningDaemon


class Prober:
    """Asks node.info every `every_s` in a thread of its own; keeps the slowest answer.

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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.daemon.target(), timeout_s=60) as client:
            last_answer = time.monotonic()
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    client.node_info()
                except Exception as exc:
                    self.failed.append(str(exc))
                now = time.monotonic()
                self.latencies.append(now - began)
                self.worst_s = max(self.worst_s, now - began)
                self.silence_s = max(self.silence_s, now - last_answer)
                last_answer = now
                self.asked += 1
                time.sleep(self.every_s)

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
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(70)
