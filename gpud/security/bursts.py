"""Bursts of the same thing, told once: the first at once, then one summary per interval.

A client that misbehaves in a loop (a revoked key still asking, a viewer reconnecting
after every cut, an operator refused 8,000 times a second) must not turn the daemon's log
or its audit trail into a copy of its loop. `Bursts` decides, per key, what to tell: the
first occurrence at once; the ones after it, for as long as they keep coming, only as a
count, reported when each interval is over. A key quiet for a whole interval is
forgotten, so its next occurrence is told at once again.

`ThrottledLog` is the logging front of it. Everything here is thread-safe: the ZAP
thread, the events thread and the loop all report through it, and the daemon flushes
every throttled log once a second (`flush_all`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: Seconds between two summaries of one key.
INTERVAL_S = 10.0
#: Keys followed at once; beyond them, occurrences of new keys are counted under OTHERS.
MAX_KEYS = 1024
OTHERS = ("others",)


@dataclass
class Summary(Generic[K]):
    """What was held back of one key in one interval."""

    key: K | tuple[str]
    count: int
    since: float  # the clock's time the interval began
    seconds: float  # how long the interval was
    last: str  # the last held-back occurrence's text, as a sample


@dataclass
class _Window:
    since: float
    count: int = 0
    last: str = ""


class Bursts(Generic[K]):
    """Per key: tell the first occurrence, count the rest, summarize once per interval."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[K | tuple[str], _Window] = {}

    def admit(self, key: K, text: str = "") -> bool:
        """True: tell this occurrence now. False: it was counted for the next summary."""
        with self._lock:
            now = self._clock()
            window = self._windows.get(key)
            if window is None:
                if len(self._windows) < self._max_keys:
                    self._windows[key] = _Window(now)
                    return True
                window = self._windows.setdefault(OTHERS, _Window(now))
            window.count += 1
            window.last = text
            return False

    def due(self) -> list[Summary[K]]:
        """Summaries of the intervals that are over (those with anything held back), in the
        order their keys first came; keys quiet for a whole interval are forgotten."""
        with self._lock:
            now = self._clock()
            out: list[Summary[K]] = []
            for key, window in list(self._windows.items()):
                if now - window.since < self.interval_s:
                    continue
                if window.count:
                    out.append(
                        Summary(key, window.count, window.since, now - window.since, window.last)
                    )
                    self._windows[key] = _Window(now)  # still coming: keep counting
                else:
                    del self._windows[key]
            return out

    def drain(self) -> list[Summary[K]]:
        """Every count held back so far, interval over or not (at shutdown)."""
        with self._lock:
            now = self._clock()
            out = [
                Summary(key, w.count, w.since, now - w.since, w.last)
                for key, w in self._windows.items()
                if w.count
            ]
            self._windows.clear()
            return out


_LOGS: weakref.WeakSet[ThrottledLog] = weakref.WeakSet()


class ThrottledLog:
    """A logger whose repeated lines (same key) come out once per interval with a count."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.bursts: Bursts[Hashable] = Bursts(interval_s, clock=clock)
        self._levels: dict[Hashable, int] = {}
        _LOGS.add(self)

    def log(self, level: int, key: Hashable, message: str) -> None:
        """Log `message` now if `key` has been quiet; else count it for the summary."""
        if self.bursts.admit(key, message):
            self._levels[key] = level
            self.logger.log(level, "%s", message)

    def warning(self, key: Hashable, message: str) -> None:
        self.log(logging.WARNING, key, message)

    def flush(self, everything: bool = False) -> None:
        """Log the summaries that are due (all of them with `everything`)."""
        summaries = self.bursts.drain() if everything else self.bursts.due()
        for s in summaries:
            level = self._levels.get(s.key, logging.WARNING)
            if s.key == OTHERS:
                what = f"{s.count} more line(s) like it for other keys"
            else:
                what = f"{s.count} more like it"
            self.logger.log(level, "%s (%s in the last %.0f s)", s.last, what, s.seconds)


def flush_all(everything: bool = False) -> None:
    """Flush every throttled log of the process (the daemon calls this once a second)."""
    for throttled in list(_LOGS):
        throttled.flush(everything)
