"""Downsampling keeps what a person reads off a curve: its ends, its extremes, its shape."""

from __future__ import annotations

import math
import random
import time
from array import array

from tui.model.lttb import downsample, lttb


def curve(n: int) -> tuple[array[float], array[float]]:
    xs = array("d", range(n))
    ys = array("d", (math.exp(-i / (n / 5)) + 0.02 * math.sin(i / (n / 200)) for i in range(n)))
    return xs, ys


def interpolate(xs: list[float], ys: list[float], x: float) -> float:
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    if xs[hi] == xs[lo]:
        return ys[lo]
    t = (x - xs[lo]) / (xs[hi] - xs[lo])
    return ys[lo] + t * (ys[hi] - ys[lo])


def test_short_series_are_returned_whole() -> None:
    assert downsample([1.0, 2.0, 3.0], [3.0, 1.0, 2.0], 10) == ([1.0, 2.0, 3.0], [3.0, 1.0, 2.0])
    assert lttb([0.0, 1.0], [5.0, 6.0], 1) == ([0.0, 1.0], [5.0, 6.0])


def test_lttb_keeps_the_endpoints_and_the_count() -> None:
    xs, ys = curve(10_000)
    out_x, out_y = lttb(xs, ys, 100)
    assert len(out_x) == len(out_y) == 100
    assert (out_x[0], out_y[0]) == (xs[0], ys[0])
    assert (out_x[-1], out_y[-1]) == (xs[-1], ys[-1])
    assert out_x == sorted(out_x)


def test_a_million_points_keep_endpoints_extremes_and_shape() -> None:
    xs, ys = curve(1_000_000)
    ys[123_457] = 9.0  # a loss spike one step wide
    ys[876_543] = -1.0  # and a dip
    out_x, out_y = downsample(xs, ys, 400)
    assert len(out_x) <= 400
    assert (out_x[0], out_y[0]) == (0.0, ys[0])
    assert (out_x[-1], out_y[-1]) == (999_999.0, ys[-1])
    assert max(out_y) == 9.0 and out_x[out_y.index(9.0)] == 123_457
    assert min(out_y) == -1.0 and out_x[out_y.index(-1.0)] == 876_543
    assert out_x == sorted(out_x)
    # Shape: away from the two spikes, the drawn curve follows the real one closely.
    rng = random.Random(7)
    for _ in range(200):
        i = rng.randrange(1, 999_999)
        if abs(i - 123_457) < 5000 or abs(i - 876_543) < 5000:
            continue
        assert abs(interpolate(out_x, out_y, float(i)) - ys[i]) < 0.05


def test_downsampling_a_million_points_is_quick() -> None:
    # Not a benchmark (bench/tui_scale.py times it): a guard against an accidental
    # quadratic or per-point-Python regression, with a bound far above the ~50 ms it takes.
    xs, ys = curve(1_000_000)
    started = time.perf_counter()
    downsample(xs, ys, 400)
    assert time.perf_counter() - started < 2.0


def test_flat_and_noisy_series() -> None:
    flat_x = [float(i) for i in range(5000)]
    out_x, out_y = downsample(flat_x, [1.0] * 5000, 50)
    assert len(out_x) <= 50 and set(out_y) == {1.0}
    rng = random.Random(1)
    noisy = [rng.gauss(0, 1) for _ in range(50_000)]
    out_x, out_y = downsample([float(i) for i in range(50_000)], noisy, 300)
    assert max(out_y) == max(noisy) and min(out_y) == min(noisy)
