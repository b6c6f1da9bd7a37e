"""FLOPs of one training step, counted once with `torch.utils.flop_counter`.

The first `FlopCount.step()` block runs under `FlopCounterMode` (every matmul,
convolution and attention op of the forward and backward, counted as torch counts them);
its total is the step's FLOPs. Every later block is a shared `nullcontext`: an attribute
read, so the steps after the first pay nothing. Wrap a whole optimizer step (all its
micro-batches) so FLOPs per step match the step times the heartbeats carry. torch is
imported on the first block only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_NOTHING = contextlib.nullcontext()


class FlopCount:
    """Counts the FLOPs of the first block it wraps; `flops` holds them afterwards."""

    def __init__(self, on_counted: Callable[[float], None] | None = None) -> None:
        self.flops: float | None = None
        self._on_counted = on_counted
        self._done = False

    def step(self) -> contextlib.AbstractContextManager[Any]:
        """A context for one step: the counting one the first time, a no-op after."""
        if self._done:
            return _NOTHING
        self._done = True
        return self._count()

    @contextlib.contextmanager
    def _count(self) -> Iterator[None]:
        try:
            from torch.utils.flop_counter import FlopCounterMode
        except ImportError:  # a torch without the counter: no count, training goes on
            yield
            return
        mode = FlopCounterMode(display=False)
        with mode:
            yield
        self.flops = float(mode.get_total_flops())
        if self._on_counted is not None and self.flops > 0:
            self._on_counted(self.flops)


__all__ = ["FlopCount"]
