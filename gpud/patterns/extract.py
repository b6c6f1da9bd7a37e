"""Metrics from log lines: the spec's patterns, each on a time budget.

RE2 bounds a pattern's time by the line's length, but a long pattern against a 64 kB line
can still cost milliseconds, and a run may print thousands of lines a second. So every
pattern is timed as it runs: one line over `line_s`, or more than `window_s` of matching
in any `window` seconds, disables it for this run — the caller turns `take_disabled()`
into one warning event that names it — and the run goes on without it. A pattern the
engine refuses (a spec stored before RE2, say) is disabled the same way, from the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpud.patterns.engine import Pattern, PatternError, compile_pattern

#: The part of a line the patterns see: its first 16 kB (a metric line is far shorter; the
#: worst pattern RE2 takes is a second or two on this much, once, before it is disabled).
MAX_LINE_BYTES = 16 * 1024


@dataclass(frozen=True)
class Budget:
    #: One line may take this long in one pattern.
    line_s: float = 0.05
    #: A pattern may spend this long matching in any window of `window` seconds: 5% of a
    #: core, against about 1 µs a line for a typical pattern.
    window_s: float = 0.5
    window: float = 10.0


@dataclass(frozen=True)
class Disabled:
    """A pattern taken out of a run, and why: one line for the run's events."""

    source: str
    why: str

    def line(self) -> str:
        return f"metrics pattern {self.source!r} disabled for this run: {self.why}"


@dataclass
class _Timed:
    pattern: Pattern
    window_start: float | None = None
    spent_s: float = 0.0


class MetricExtractor:
    """The spec's `metrics` patterns: each named group is a metric, `step` is the step."""

    def __init__(
        self,
        patterns: list[str],
        budget: Budget | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.budget = budget or Budget()
        self._clock = clock
        # A match is charged the CPU its thread spent on it, at most its wall time: on a
        # loaded box a thread waits for a core mid-match, and that wait is not the
        # pattern's cost (a microsecond match read 53 ms of wall time once, and was cut).
        self._cpu = cpu
        self._active: list[_Timed] = []
        self._disabled: list[Disabled] = []
        self._unreported = 0
        for source in patterns:
            try:
                self._active.append(_Timed(compile_pattern(source)))
            except PatternError as exc:
                self._disable(source, str(exc))

    def __bool__(self) -> bool:
        return bool(self._active)

    @property
    def disabled(self) -> list[Disabled]:
        return list(self._disabled)

    def take_disabled(self) -> list[Disabled]:
        """Patterns disabled since the last call (each is reported once)."""
        new = self._disabled[len(self._disabled) - self._unreported :]
        self._unreported = 0
        return new

    def _disable(self, source: str, why: str) -> None:
        self._disabled.append(Disabled(source, why))
        self._unreported += 1

    def extract(self, text: str) -> tuple[int | None, dict[str, float]]:
        """(step, values) from one line: every active pattern that matches adds to them."""
        if not self._active:
            return None, {}
        data = text.encode(errors="replace")[:MAX_LINE_BYTES]
        step: int | None = None
        values: dict[str, float] = {}
        over: list[_Timed] = []
        for timed in self._active:
            began, began_cpu = self._clock(), self._cpu()
            found = timed.pattern.search_bytes(data)
            ended, took_cpu = self._clock(), self._cpu() - began_cpu
            if self._charge(timed, began, ended, took_cpu):
                over.append(timed)
            if not found:
                continue
            for name, raw in found.items():
                try:
                    number = float(raw)
                except ValueError:
                    continue
                if name == "step":
                    if number.is_integer() and number >= 0:
                        step = int(number)
                else:
                    values[name] = number
        for timed in over:
            self._active.remove(timed)
        return step, values

    def _charge(self, timed: _Timed, began: float, ended: float, took_cpu: float) -> bool:
        """Count a match's time against its pattern; True when it is over budget now."""
        took = min(ended - began, took_cpu)
        budget = self.budget
        if timed.window_start is None or ended - timed.window_start >= budget.window:
            timed.window_start, timed.spent_s = began, 0.0
        timed.spent_s += took
        source = timed.pattern.source
        if took > budget.line_s:
            self._disable(source, f"one line took {took * 1000:.0f} ms (budget"
                          f" {budget.line_s * 1000:.0f} ms a line)")  # fmt: skip
            return True
        if timed.spent_s > budget.window_s:
            self._disable(source, f"{timed.spent_s:.2f} s of matching within"
                          f" {budget.window:g} s (budget {budget.window_s:g} s)")  # fmt: skip
            return True
        return False
