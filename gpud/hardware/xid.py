"""XID bookkeeping: per-GPU counters and the last few codes with their times.

An XID is an event, not a level, so it is kept as counts plus a bounded history; a
last-value gauge would hide a burst between two samples.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable

from gpud.model.snapshot import NodeSnapshot, XidRecord, XidSummary

RECENT_XIDS = 16


class XidTracker:
    """Thread-safe: the NVML event thread records, the sampler thread reads."""

    def __init__(self, gpu_count: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = [Counter[int]() for _ in range(gpu_count)]
        self._recent = [deque[XidRecord](maxlen=RECENT_XIDS) for _ in range(gpu_count)]
        self._unacked = [0] * gpu_count
        self._acked_at: list[float | None] = [None] * gpu_count

    def record(self, gpu_index: int, code: int) -> None:
        with self._lock:
            self._counts[gpu_index][code] += 1
            self._recent[gpu_index].append(XidRecord(code=code, time=self._clock()))
            self._unacked[gpu_index] += 1

    def summary(self, gpu_index: int) -> XidSummary:
        with self._lock:
            counts = self._counts[gpu_index]
            return XidSummary(
                total=sum(counts.values()),
                counts=dict(counts),
                recent=list(self._recent[gpu_index]),
                unacknowledged=self._unacked[gpu_index],
                acknowledged_at=self._acked_at[gpu_index],
            )

    def acknowledge(self, gpu_index: int | None) -> int:
        """Mark the GPU's events (every GPU's: None) handled: counted no more as
        unacknowledged, and no reason for a preflight to keep the GPU out."""
        with self._lock:
            indexes = range(len(self._unacked)) if gpu_index is None else [gpu_index]
            cleared = 0
            now = self._clock()
            for i in indexes:
                if 0 <= i < len(self._unacked):
                    cleared += self._unacked[i]
                    self._unacked[i] = 0
                    self._acked_at[i] = now
            return cleared


def acknowledged(snapshot: NodeSnapshot, indices: set[int], now: float) -> NodeSnapshot:
    """The snapshot with those GPUs' XIDs acknowledged at `now`, as the tracker's next
    sample will read: a launch right after must not wait a sample for it."""
    gpus = [
        g.model_copy(
            update={"xid": g.xid.model_copy(update={"unacknowledged": 0, "acknowledged_at": now})}
        )
        if g.index in indices
        else g
        for g in snapshot.gpus
    ]
    return snapshot.model_copy(update={"gpus": gpus})
