"""Thinning old metric points keeps the curve's shape: ends, spikes and dips."""

from __future__ import annotations

import math
import random

from gpud.retention.reduce import BUCKETS, dropped_steps, kept_steps


def loss_curve(n: int) -> list[tuple[int, float]]:
    rng = random.Random(7)
    points = [(s, 3.0 * math.exp(-s / 20_000) + rng.gauss(0, 0.05)) for s in range(n)]
    points[31_337] = (31_337, 9.5)  # a spike
    points[42_000] = (42_000, -1.0)  # a dip
    return points


def test_old_points_shrink_to_four_a_bucket_and_the_last_steps_stay_whole() -> None:
    points = loss_curve(100_000)
    keep = kept_steps(points, cutoff=100_000 - 10_000)
    assert set(range(90_001, 100_000)) <= keep
    assert len(keep) <= 9_999 + 4 * BUCKETS
    assert len(keep) < len(points) // 5


def test_first_last_and_extremes_survive_in_every_bucket() -> None:
    points = loss_curve(100_000)
    keep = kept_steps(points, cutoff=90_000)
    values = dict(points)
    assert {0, 99_999, 31_337, 42_000} <= keep
    kept = [values[s] for s in keep]
    assert max(kept) == max(values.values()) and min(kept) == min(values.values())
    # Each bucket (equal step widths of the old part) keeps its range: the thinned curve
    # has the envelope of the original.
    old = [(s, v) for s, v in points if s <= 90_000]
    for b in range(0, BUCKETS, 37):
        bucket = [v for s, v in old if s * BUCKETS // 90_001 == b]
        thinned = [values[s] for s in keep if s <= 90_000 and s * BUCKETS // 90_001 == b]
        assert max(thinned) == max(bucket) and min(thinned) == min(bucket)


def test_thinning_again_keeps_the_same_points_and_short_series_stay_whole() -> None:
    points = loss_curve(60_000)
    once = kept_steps(points, cutoff=50_000)
    again = [(s, v) for s, v in points if s in once]
    assert kept_steps(again, cutoff=50_000) == once
    short = points[:3_000]
    assert dropped_steps(short, cutoff=0) == []


def test_nan_values_do_not_hide_the_extremes() -> None:
    points = [(s, float("nan") if s % 3 == 0 else float(s % 17)) for s in range(20_000)]
    keep = kept_steps(points, cutoff=19_000, buckets=100)
    assert max(points[s][1] for s in keep if not math.isnan(points[s][1])) == 16.0
