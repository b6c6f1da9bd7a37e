"""What the daemon's own CPU goes to, by component (issue 22 §5).

A daemon left alone for months must stay cheap, and when it is not, the operator (and
`bench/daemon_overhead.py`) must see which part grew rather than guess. Each periodic
part of the daemon charges the CPU time its thread spent (`time.thread_time`, so time
spent waiting, or by other threads, is never counted) to its component:

- `sampler`: NVML and psutil, in the executor thread;
- `snapshot`: a sample's events, quarantine rules, and its encoding on the events socket;
- `brief`: the node in brief (`gpud.brief`);
- `supervision`: the supervisor's tick (runs, parts, gang, logs followed);
- `store`: SQLite writes held back and retried;
- `housekeeping`: throttled logs and the audit log flushed;
- `retention`: a retention pass's reads, file removals and compaction, in its thread
  (its batches of deletes on the loop are the loop's).

What no component claims (zmq's I/O threads, the event loop itself, control requests,
the garbage collector) is the rest: the process's CPU less the sum. The totals are in
`node.info` (`cpu_by_component`) and on /metrics (`gpud_daemon_component_cpu_seconds`).
A charge costs two `thread_time` calls, about 1 µs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Lock
from typing import TypeVar

T = TypeVar("T")

COMPONENTS = ("sampler", "snapshot", "brief", "supervision", "store", "housekeeping", "retention")


class CpuLedger:
    """CPU seconds by component; safe to charge from any thread."""

    def __init__(self) -> None:
        self._seconds = dict.fromkeys(COMPONENTS, 0.0)
        self._lock = Lock()

    @contextmanager
    def charge(self, component: str) -> Iterator[None]:
        """Charge the CPU this thread spends in the block. Around synchronous code only:
        across an `await`, other tasks' CPU would be charged too."""
        start = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - start
            with self._lock:
                self._seconds[component] = self._seconds.get(component, 0.0) + spent

    def charged(self, component: str, work: Callable[[], T]) -> Callable[[], T]:
        """`work`, charging its CPU to `component` wherever it runs (an executor's thread)."""

        def run() -> T:
            with self.charge(component):
                return work()

        return run

    def totals(self) -> dict[str, float]:
        with self._lock:
            return {name: round(seconds, 6) for name, seconds in self._seconds.items()}
