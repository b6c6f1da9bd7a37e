"""Turning cumulative counters into per-second rates."""

from __future__ import annotations

from collections.abc import Callable, Hashable


class RateTracker:
    """Remembers the last value of each counter; `rate()` gives units per second.

    The first reading of a counter has no rate (None), and neither has a counter that went
    backwards (reset or wrapped): a made-up number would be worse than none.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[Hashable, tuple[float, float]] = {}

    def rate(self, key: Hashable, value: float | None, now: float | None = None) -> float | None:
        if value is None:
            self._last.pop(key, None)
            return None
        t = self._clock() if now is None else now
        last = self._last.get(key)
        self._last[key] = (t, value)
        if last is None or t <= last[0] or value < last[1]:
            return None
        return (value - last[1]) / (t - last[0])
