"""One run's metric patterns, evaluated in a thread of the run's own.

RE2 is linear in the line's length, but linear with a large constant for some patterns:
`[ab]{1,1000}[ab]{1,1000}c` takes 2.3 s on one 64 kB line (bench/pattern_engines.py).
RE2 releases the GIL while it matches, so here it runs beside the daemon's loop, never on
it: the loop hands lines over and moves on, a slow pattern delays only its own run's
metrics, and the budget (`extract.Budget`) disables it after its first slow line.

Lines wait in a bounded queue; what overflows it is dropped and counted (the caller makes
that one event), so a run that prints faster than its patterns match costs bounded memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpud.patterns.extract import Disabled, MetricExtractor
from gpud.patterns.frameworks import Recognizers

#: Lines waiting for the patterns, per run, before the oldest are dropped.
MAX_PENDING_LINES = 200_000
#: The thread ends after this long without lines; the next line starts it again.
IDLE_S = 10.0


@dataclass(frozen=True)
class Point:
    attempt: int
    step: int
    time: float
    values: dict[str, float]


@dataclass
class Found:
    """What one batch of lines gave: points, patterns disabled, lines never examined."""

    points: list[Point] = field(default_factory=list)
    disabled: list[Disabled] = field(default_factory=list)
    dropped: int = 0


@dataclass(frozen=True)
class _Batch:
    attempt: int
    time: float
    lines: list[str]


class PatternThread:
    """Feed it lines; it calls `deliver` (from its thread) with what the patterns found."""

    def __init__(
        self,
        name: str,
        extractor: MetricExtractor | Recognizers,
        deliver: Callable[[Found], None],
        max_pending: int = MAX_PENDING_LINES,
        idle_s: float = IDLE_S,
    ) -> None:
        self.name = name
        self.extractor = extractor
        self._deliver = deliver
        self._max_pending = max_pending
        self._idle_s = idle_s
        self._queue: deque[_Batch] = deque()
        self._pending = 0
        self._dropped = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False

    def feed(self, attempt: int, lines: list[str], when: float) -> None:
        """Queue lines for the patterns; never blocks on them."""
        if not lines or not self.extractor:
            return
        with self._cond:
            self._queue.append(_Batch(attempt, when, lines))
            self._pending += len(lines)
            while self._pending > self._max_pending and len(self._queue) > 1:
                oldest = self._queue.popleft()
                self._pending -= len(oldest.lines)
                self._dropped += len(oldest.lines)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"patterns-{self.name}", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def idle(self) -> bool:
        """Nothing queued and nothing being matched (for tests and for settling)."""
        with self._cond:
            return not self._queue and not self._busy

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait(self._idle_s)
                if not self._queue:
                    self._thread = None  # idle: end; feed() starts another
                    return
                batch = self._queue.popleft()
                self._pending -= len(batch.lines)
                dropped, self._dropped = self._dropped, 0
                self._busy = True
            try:
                found = Found(dropped=dropped)
                for line in batch.lines:
                    if not self.extractor:
                        break  # every pattern disabled
                    step, values = self.extractor.extract(line)
                    if step is not None and values:
                        found.points.append(Point(batch.attempt, step, batch.time, values))
                found.disabled = self.extractor.take_disabled()
                if found.points or found.disabled or found.dropped:
                    self._deliver(found)
            finally:
                with self._cond:
                    self._busy = False
