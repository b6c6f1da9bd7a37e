"""The daemon's heap, kept cheap for the collector over months (issue 22 §5).

A daemon holds hundreds of finished runs' records, and more objects every hour it runs.
Python's collector walks every tracked object in its oldest generation on each full
collection, which the allocations of the sampler and the ticks set off every minute or
two: in the soak, with 500 runs held, that was 0.15 % of a core of an idle daemon's 0.63.
Objects that have lived this long will live on, so they are moved out of the collector's
sight (`gc.freeze`, as Instagram's and Meta's long-lived Python servers do): every
`FREEZE_EVERY_S`, one collection of what is not frozen yet, then what survived is frozen.
Every `THAW_EVERY_S` everything is thawed and collected once, so cycles among records
that were frozen and since let go (retention removed their run) are not kept for good.

Clocked by its caller (the daemon's housekeeping); its collections are charged to `gc`.
"""

from __future__ import annotations

import gc

#: How often what survived is frozen; how often everything is thawed and collected.
FREEZE_EVERY_S = 300.0
THAW_EVERY_S = 3600.0


class HeapKeeper:
    def __init__(self, now: float) -> None:
        self._frozen_at = now - FREEZE_EVERY_S  # the first tick freezes the start-up's heap
        self._thawed_at = now

    def tick(self, now: float) -> bool:
        """Freeze (or thaw, collect and freeze) when due; True when it did."""
        if now - self._frozen_at < FREEZE_EVERY_S:
            return False
        if now - self._thawed_at >= THAW_EVERY_S:
            gc.unfreeze()
            self._thawed_at = now
        gc.collect()
        gc.freeze()
        self._frozen_at = now
        return True

    @staticmethod
    def frozen() -> int:
        """Objects out of the collector's sight now."""
        return gc.get_freeze_count()
