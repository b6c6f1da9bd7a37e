"""What both callbacks do at a framework's steps, framework-free: the Run's calls in the
order a training loop makes them (`trainers.run` documents each)."""

from __future__ import annotations

import atexit
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from trainers.run import Run, init

#: A framework's names for what gpud names otherwise (as `metrics: auto` reads them).
RENAMED = {"learning_rate": "lr"}


class FrameworkSteps:
    """One rank's account of a framework's training: steps, metrics, FLOPs, checkpoints,
    and the stop. Made at the framework's train start, after its process group exists."""

    def __init__(self, run: Run | None = None) -> None:
        self.run = run if run is not None else init()
        self.stopping = False
        self.last_step: int | None = None
        self._flops = contextlib.ExitStack()
        self._quiet_since = time.monotonic()
        if self.run.launched:
            atexit.register(self.run.close)  # the framework owns the exit: flush before it

    def step_begin(self) -> None:
        """An optimizer step starts (its first micro-batch): its FLOPs are counted, once."""
        if self.last_step is None:
            self._flops.enter_context(self.run.count_flops())

    def step_end(self, step: int, values: Mapping[str, Any] | None = None) -> bool:
        """Step `step` (0-based) is done on this rank; rank 0 also records `values` (the
        numbers among them). True when the ranks agreed to stop after it: the callback
        saves a checkpoint and ends training, then calls `stopped`."""
        self._flops.close()
        self.last_step = step
        # only rank 0's are kept: a tensor's `item()` elsewhere would be a device sync for nothing
        self.run.log(step, **(numbers(values or {}) if self.run.rank == 0 else {}))
        self._quiet_since = time.monotonic()
        if not self.stopping and self.run.should_stop():
            self.stopping = True
        return self.stopping

    def values(self, step: int, values: Mapping[str, Any]) -> None:
        """More of step `step`'s metrics, logged after it ended (rank 0 records them)."""
        found = numbers(values) if self.run.rank == 0 else {}
        if found:
            self.run.log(step, **found)
        self._quiet_since = time.monotonic()

    def busy(self) -> None:
        """Something other than a checkpoint ran since the step (an evaluation)."""
        self._quiet_since = time.monotonic()

    def saved(self, path: str, step: int) -> None:
        """A checkpoint was written; the time since the step ended (or since `busy`) is
        its save time. After a stop it is the stop's checkpoint."""
        self.run.checkpoint_saved(path, step, seconds=time.monotonic() - self._quiet_since)
        if self.stopping:
            self.run.stopped(path, step)

    def ended(self) -> None:
        self._flops.close()
        self.run.ended()


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The values that are numbers (plain, or a one-element tensor), under gpud's names."""
    found: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            continue
        number = value
        if not isinstance(value, int | float):
            item = getattr(value, "item", None)
            if item is None or getattr(value, "numel", lambda: 0)() != 1:
                continue
            number = item()
        found[RENAMED.get(key, key)] = float(number)
    return found


__all__ = ["RENAMED", "FrameworkSteps", "numbers"]
