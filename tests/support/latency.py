"""The control plane's latency as a client sees it, measured from a process of its own.

A prober thread inside the test process shares the test's GIL with whatever else the test
does (decoding status replies, polling health), and would charge that to the daemon. This
one asks `node.info` every `every_s` from a child process and reports every answer's time.

    with ControlProbe(daemon.address) as probe:
        ...                      # the abuse
    probe.result.worst_s         # the slowest answer while it ran
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from gpud.client import Client, resolve_target


@dataclass
class ProbeResult:
    asked: int = 0
    worst_s: float = 0.0
    p99_s: float = 0.0
    median_s: float = 0.0
    failed: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"node.info: {self.asked} asked, median {self.median_s * 1000:.1f} ms,"
            f" p99 {self.p99_s * 1000:.1f} ms, slowest {self.worst_s * 1000:.0f} ms"
        )


class ControlProbe:
    def __init__(self, address: str, every_s: float = 0.02) -> None:
        self.address = address
        self.every_s = every_s
        self.result = ProbeResult()
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ControlProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.latency", self.address, str(self.every_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()  # the first answer came: it is measuring
        assert ready.strip() == "ready", ready
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        out, _ = self._proc.communicate(timeout=30)
        self.result = ProbeResult(**json.loads(out.strip().splitlines()[-1]))


def _probe(address: str, every_s: float) -> None:
    done = threading.Event()

    def finish(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, finish)
    times: list[float] = []
    failed: list[str] = []
    with Client(resolve_target(address), timeout_s=10) as client:
        client.node_info()
        print("ready", flush=True)
        while not done.is_set():
            began = time.monotonic()
            try:
                client.node_info()
            except Exception as exc:  # any failure is a finding, reported as text
                failed.append(str(exc))
            times.append(time.monotonic() - began)
            done.wait(every_s)
    ordered = sorted(times) or [0.0]
    result = ProbeResult(
        asked=len(times),
        worst_s=ordered[-1],
        p99_s=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        median_s=statistics.median(ordered),
        failed=failed[:10],
    )
    print(json.dumps(result.__dict__), flush=True)


if __name__ == "__main__":
    _probe(sys.argv[1], float(sys.argv[2]))
