"""Bounded series: recent samples for sparklines, and whole metric histories for plots.

`Recent` is a fixed-length window of the last readings of one GPU field (None stays None:
not available is not zero). `MetricSeries` keeps one metric of one run over every attempt,
as (step, value) pairs in `array('d')`; when it grows past its capacity it halves itself
with the same shape-keeping downsampling the plots use, so memory stays bounded however
long a run trains, and a million-point curve still draws its shape.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from tui.model.lttb import downsample

#: Samples kept per GPU field: two minutes at the default 1 s interval.
RECENT_SAMPLES = 120
#: Points kept per metric before the series compacts itself.
METRIC_CAPACITY = 250_000


class Recent:
    """The last `maxlen` readings of one field; None means not available."""

    def __init__(self, maxlen: int = RECENT_SAMPLES) -> None:
        self._values: deque[float | None] = deque(maxlen=maxlen)

    def add(self, value: float | None) -> None:
        self._values.append(value)

    def values(self) -> list[float | None]:
        return list(self._values)

    def present(self) -> list[float]:
        """The readings that were available, oldest first."""
        return [v for v in self._values if v is not None]

    def __len__(self) -> int:
        return len(self._values)


#: Points per block of a segment's envelope.
BLOCK = 32


@dataclass
class Segment:
    """The points of one attempt, in step order, and their envelope.

    The envelope keeps the minimum and maximum of every complete block of `BLOCK` points,
    updated as points arrive; drawing a long segment downsamples the envelope (and the
    few points after it) instead of every point, so a frame of a million-point curve is
    as cheap as one of a few thousand.
    """

    attempt: int
    steps: array[float] = field(default_factory=lambda: array("d"))
    values: array[float] = field(default_factory=lambda: array("d"))
    env_steps: array[float] = field(default_factory=lambda: array("d"))
    env_values: array[float] = field(default_factory=lambda: array("d"))
    _low: int = 0  # index of the current block's minimum
    _high: int = 0  # and of its maximum

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: float, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        i = len(self.values) - 1
        if i % BLOCK == 0:
            self._low = self._high = i
        elif value < self.values[self._low]:
            self._low = i
        elif value > self.values[self._high]:
            self._high = i
        if (i + 1) % BLOCK == 0:
            for k in sorted({self._low, self._high}):
                self.env_steps.append(self.steps[k])
                self.env_values.append(self.values[k])

    def rebuild(self, steps: list[float], values: list[float]) -> None:
        self.steps, self.values = array("d"), array("d")
        self.env_steps, self.env_values = array("d"), array("d")
        for step, value in zip(steps, values, strict=True):
            self.add(step, value)

    def candidates(self) -> tuple[list[float], list[float]]:
        """The envelope, the points after its last block, and the first point."""
        tail = len(self.steps) - len(self.steps) % BLOCK
        xs = [self.steps[0], *self.env_steps, *self.steps[tail:]]
        ys = [self.values[0], *self.env_values, *self.values[tail:]]
        if len(xs) > 1 and xs[1] == xs[0]:
            del xs[0], ys[0]
        return xs, ys


@dataclass(frozen=True)
class Drawn:
    """A series made ready to draw: per attempt, at most the points asked for."""

    segments: tuple[tuple[int, list[float], list[float]], ...]
    resumed_at: tuple[float, ...]
    points: int  # how many points the drawn ones stand for

    def bounds(self) -> tuple[float, float] | None:
        ys = [y for _, _, seg in self.segments for y in seg]
        return (min(ys), max(ys)) if ys else None


class MetricSeries:
    """One metric of one run across attempts; bounded by `capacity` points."""

    def __init__(self, capacity: int = METRIC_CAPACITY) -> None:
        self.capacity = capacity
        self.segments: list[Segment] = []
        self.version = 0
        self.compactions = 0
        self._size = 0
        self._cache: tuple[int, int, Drawn] | None = None

    def __len__(self) -> int:
        return self._size

    def last(self) -> tuple[int, float, float] | None:
        """(attempt, step, value) of the newest point."""
        for seg in reversed(self.segments):
            if seg.steps:
                return seg.attempt, seg.steps[-1], seg.values[-1]
        return None

    def append(self, attempt: int, step: float, value: float) -> bool:
        """Add a point; a point at or before the newest one of its attempt is a duplicate."""
        seg = self.segments[-1] if self.segments else None
        if seg is None or attempt > seg.attempt:
            seg = Segment(attempt)
            self.segments.append(seg)
        elif attempt < seg.attempt:
            return False  # a late point of an earlier attempt: history already has it
        elif seg.steps and step <= seg.steps[-1]:
            return False
        seg.add(step, value)
        self._size += 1
        self.version += 1
        if self._size > self.capacity:
            self._compact()
        return True

    def _compact(self) -> None:
        """Halve the stored points, keeping each attempt's shape and extremes."""
        target = self.capacity // 2
        for seg in self.segments:
            keep = max(2, len(seg) * target // max(1, self._size))
            if len(seg) > keep:
                seg.rebuild(*downsample(seg.steps, seg.values, keep))
        self._size = sum(len(s) for s in self.segments)
        self.compactions += 1

    def resumed_at(self) -> tuple[float, ...]:
        """The first step of every attempt after the first (where a resume started)."""
        return tuple(seg.steps[0] for seg in self.segments[1:] if seg.steps)

    def points(self) -> Iterator[tuple[int, float, float]]:
        for seg in self.segments:
            for x, y in zip(seg.steps, seg.values, strict=True):
                yield seg.attempt, x, y

    def drawn(self, n_out: int) -> Drawn:
        """At most about `n_out` points in all, shared between attempts by their length."""
        if self._cache is not None and self._cache[:2] == (self.version, n_out):
            return self._cache[2]
        parts = []
        total = max(1, self._size)
        for seg in self.segments:
            if not seg.steps:
                continue
            budget = max(4, n_out * len(seg) // total)
            if len(seg.env_steps) >= 4 * budget:
                xs, ys = downsample(*seg.candidates(), budget)
            else:
                xs, ys = downsample(seg.steps, seg.values, budget)
            parts.append((seg.attempt, xs, ys))
        drawn = Drawn(tuple(parts), self.resumed_at(), self._size)
        self._cache = (self.version, n_out, drawn)
        return drawn
