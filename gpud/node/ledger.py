"""What the daemon's own CPU goes to, by component (issue 22 §5).

A daemon left alone for months must stay cheap, and when it is not, the operator (and
`bench/daemon_overhead.py`) must see which part grew rather than guess. Each periodic
part of the daemon charges the CPU time its thread spent (`time.thread_time`, so time
spent waiting, or by other threads, is never counted) to its component:

- `sampler`: NVML and psutil, in the executor thread;
- `snapshot`: a sample's events, quarantine rules, and its encoding on the events socket;
- `brief`: the node in brief (`gpud.wire.brief`);
- `supervision`: the supervisor's tick (runs, parts, gang, logs followed);
- `goodput`: node 0's goodput accounting (`gpud.runs.health.goodput`), inside the tick and as
  rank 0's metrics arrive;
- `store`: SQLite writes held back and retried;
- `housekeeping`: throttled logs and the audit log flushed;
- `retention`: a retention pass's reads, file removals and compaction, in its thread
  (its batches of deletes on the loop are the loop's);
- `gc`: Python's garbage collector, in whichever thread it ran (`watch_gc`: the daemon's
  ledger). A collection inside a charged block is the collector's, not the block's: a
  heap grown with a thousand runs held shows here, not as a slower component.

What no component claims (zmq's I/O threads, the event loop itself, control requests)
is the rest: the process's CPU less the sum. The totals are in
`node.info` (`cpu_by_component`) and on /metrics (`gpud_daemon_component_cpu_seconds`).
A charge costs two `thread_time` calls, about 1 µs. Charges nest: a block's own CPU is
what it spent less what the charges inside it spent, so the components add up.

An idle daemon's cost is mostly its wake-ups, not its work: each costs a thread switch
and a cold pass through the interpreter. Its periodic parts therefore wake on one beat
(`next_beat`, `until_beat`): every timer of a period lands on the same multiple of that
period on the loop's clock, so the sampler, the housekeeping, the supervisor's idle tick
and the control guard's idle check share one wake-up of the loop a second instead of one
each (idle, the loop wakes 2.5 times a second, was 5: docs/DESIGN.md).
"""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

COMPONENTS = (
    "sampler", "snapshot", "brief", "supervision", "goodput", "store", "housekeeping",
    "retention", "gc",
)  # fmt: skip


class CpuLedger:
    """CPU seconds by component; safe to charge from any thread."""

    def __init__(self, *, watch_gc: bool = False) -> None:
        self._seconds = dict.fromkeys(COMPONENTS, 0.0)
        self._lock = threading.Lock()
        #: Per thread: when its collection started, and its collections' CPU so far.
        self._local = threading.local()
        self._gc_seconds = 0.0
        if watch_gc:
            gc.callbacks.append(self._collected)

    def close(self) -> None:
        """Stop watching the collector (a ledger that did)."""
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside a collection, in the thread that triggered it, without our lock (that
        # thread may hold it): collections never overlap, so the sum needs none.
        local = self._local
        if phase == "start":
            local.gc_start = time.thread_time()
            return
        start = getattr(local, "gc_start", None)
        if start is None:
            return
        spent = time.thread_time() - start
        local.gc_start = None
        local.claimed = getattr(local, "claimed", 0.0) + spent
        self._gc_seconds += spent

    @contextmanager
    def charge(self, component: str) -> Iterator[None]:
        """Charge the CPU this thread spends in the block to `component`, less what blocks
        inside it claimed (a nested charge, a collection: each counted once, where it is
        most specific). Around synchronous code, or across an `await` whose other tasks'
        charged blocks then count as nested."""
        local = self._local
        claimed = getattr(local, "claimed", 0.0)
        start = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - start
            inner = getattr(local, "claimed", 0.0) - claimed
            local.claimed = claimed + spent  # what this block claims from any around it
            with self._lock:
                own = max(0.0, spent - inner)
                self._seconds[component] = self._seconds.get(component, 0.0) + own

    def charged(self, component: str, work: Callable[[], T]) -> Callable[[], T]:
        """`work`, charging its CPU to `component` wherever it runs (an executor's thread)."""

        def run() -> T:
            with self.charge(component):
                return work()

        return run

    def totals(self) -> dict[str, float]:
        with self._lock:
            totals = {name: round(seconds, 6) for name, seconds in self._seconds.items()}
        totals["gc"] = round(self._gc_seconds, 6)
        return totals


def next_beat(now: float, period: float) -> float:
    """The first multiple of `period` after `now` (seconds on one monotonic clock): the
    moment every periodic part with this period wakes, together."""
    return (math.floor(now / period) + 1) * period


async def until_beat(period: float) -> None:
    """Sleep to the next beat of `period` on the running loop's clock. Timers set for the
    same moment run in one turn of the loop, so the parts on one beat cost one wake-up."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    timer = loop.call_at(next_beat(loop.time(), period), _wake, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
