"""A straggler verdict that holds still: a rank is named only when it has been the slowest,
by enough, for most of the last seconds, and a stall's aftermath is never judged.

`health.find_straggler` looks at one instant: each rank's median compute time per step
over about five seconds of heartbeats. That instant is noisy. On a shared or busy host a
rank that the scheduler passed over for a moment computes slowly for a few heartbeats,
and in the seconds after a stall the rank released from it and the peer that only waited
both measure steps that mixed waiting and catching up. Naming every such instant made the
verdict flap between `degraded` and `ok`, naming either rank in turn (issue 24 §5).

So the verdict is a score over reporting windows, as nvidia-resiliency-ext's straggler
detection scores ranks per window against a threshold: once a second (`EVERY_S`) the
instant's candidate is recorded, and a rank is named when it was the candidate in at
least `NAME_AT` of the last `WINDOWS` records; it stays named until it was in at most
`CLEAR_AT` of them (hysteresis: a ratio hovering at the threshold holds its verdict).
A rank slowed for the whole run is named in `NAME_AT` seconds. A stall clears the record
and nothing is judged for `SETTLE_S` after it ends: two compute windows, so every median
is made of steps taken after the stall.

Pure and clocked by its caller: the daemon's telemetry keeps one per run attempt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpud.model.run import Straggler

#: How often the candidate is recorded; health asked more often reads the verdict only.
EVERY_S = 0.9
#: Records kept (about a second apart), how many name a rank, how few clear it.
WINDOWS = 10
NAME_AT = 7
CLEAR_AT = 3
#: Nothing is judged for this long after a stall ends (two 5 s compute windows).
SETTLE_S = 10.0


@dataclass
class StragglerWatch:
    """One run attempt's straggler verdict over time (see the module)."""

    #: The candidate rank of each recent record (None: no candidate then).
    _record: deque[int | None] = field(default_factory=lambda: deque(maxlen=WINDOWS))
    _recorded_at: float | None = None
    _latest: dict[int, Straggler] = field(default_factory=dict)
    _named: int | None = None
    _quiet_until: float = float("-inf")

    def stalled(self, now: float) -> None:
        """The run is stalled now: forget the record; judge nothing until it has settled."""
        self._record.clear()
        self._latest.clear()
        self._named = None
        self._recorded_at = None
        self._quiet_until = now + SETTLE_S

    def judge(self, now: float, candidate: Straggler | None) -> Straggler | None:
        """Record this instant's candidate (at most once per EVERY_S) and return the
        verdict: the named rank with its latest measurement, or None."""
        if now < self._quiet_until:
            return None
        if self._recorded_at is None or now - self._recorded_at >= EVERY_S:
            self._recorded_at = now
            self._record.append(candidate.rank if candidate else None)
            if candidate is not None:
                self._latest[candidate.rank] = candidate
            self._update()
        if self._named is None:
            return None
        return self._latest.get(self._named)

    def _update(self) -> None:
        counts: dict[int, int] = {}
        for rank in self._record:
            if rank is not None:
                counts[rank] = counts.get(rank, 0) + 1
        if self._named is not None and counts.get(self._named, 0) <= CLEAR_AT:
            self._named = None
        if self._named is None:
            top = max(counts.items(), key=lambda kv: kv[1], default=None)
            if top is not None and top[1] >= NAME_AT:
                self._named = top[0]

    @property
    def score(self) -> tuple[int, int]:
        """(records naming the named rank, records kept): '7 of the last 10 s'."""
        named = sum(1 for r in self._record if r is not None and r == self._named)
        return named, len(self._record)
