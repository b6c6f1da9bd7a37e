"""Thinning a finished run's old metric points so its curve keeps its shape. Pure.

Every point of the run's last `full_steps` steps stays. Older points are split into
`BUCKETS` buckets of equal step width, and each bucket keeps its first, last, lowest and
highest point (the M4 reduction): the curve's start, its end, every spike and every dip
survive, so a loss curve drawn from what is left looks as it did, at a few thousand
points instead of millions. Applying it again to what it kept keeps the same points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Buckets of the older part of a series: at most 4 points each.
BUCKETS = 1000


def kept_steps(
    points: Sequence[tuple[int, float]], cutoff: int, buckets: int = BUCKETS
) -> set[int]:
    """The steps of one series (one attempt, one metric; `points` in step order) to keep:
    every step after `cutoff`, and of the rest each bucket's first, last, min and max."""
    old = [(s, v) for s, v in points if s <= cutoff]
    keep = {s for s, _ in points if s > cutoff}
    if len(old) <= 4 * buckets:
        return keep | {s for s, _ in old}
    first, last = old[0][0], old[-1][0]
    width = last - first + 1
    chosen: dict[int, list[tuple[int, float]]] = {}
    for step, value in old:
        chosen.setdefault((step - first) * buckets // width, []).append((step, value))
    for bucket in chosen.values():
        keep.add(bucket[0][0])
        keep.add(bucket[-1][0])
        real = [(v, s) for s, v in bucket if not math.isnan(v)]
        if real:
            keep.add(min(real)[1])
            keep.add(max(real)[1])
    return keep


def dropped_steps(
    points: Sequence[tuple[int, float]], cutoff: int, buckets: int = BUCKETS
) -> list[int]:
    """The steps `kept_steps` leaves out, in order."""
    keep = kept_steps(points, cutoff, buckets)
    return [s for s, _ in points if s not in keep]
