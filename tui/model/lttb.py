"""Downsampling long series for drawing: LTTB, with a min/max pre-pass for long inputs.

Largest-Triangle-Three-Buckets (Steinarsson, 2013) keeps the points that carry a curve's
visual shape. On its own it walks every input point in Python, which is too slow for a
million points inside a 50 ms frame. MinMaxLTTB (Van Der Donckt et al., 2023) first keeps
only the minimum and maximum of many small buckets — found with C-level `min`/`max` over
array slices — and runs LTTB on those few thousand candidates. The result always keeps the
first and last points and the global minimum and maximum, so spikes never vanish.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

#: Candidates kept per output point by the min/max pre-pass.
MINMAX_RATIO = 4


def lttb(xs: Sequence[float], ys: Sequence[float], n_out: int) -> tuple[list[float], list[float]]:
    """Classic LTTB: `n_out` points of (xs, ys), first and last always kept."""
    n = len(xs)
    if n_out >= n or n <= 2:
        return list(xs), list(ys)
    if n_out < 3:
        return [xs[0], xs[-1]], [ys[0], ys[-1]]
    out_x = [xs[0]]
    out_y = [ys[0]]
    every = (n - 2) / (n_out - 2)
    a = 0
    for i in range(n_out - 2):
        lo = int(i * every) + 1
        hi = int((i + 1) * every) + 1
        nlo = hi
        nhi = min(int((i + 2) * every) + 1, n)
        if nlo >= nhi:  # the last bucket: the next "bucket" is the last point
            nlo, nhi = n - 1, n
        count = nhi - nlo
        cx = sum(xs[nlo:nhi]) / count
        cy = sum(ys[nlo:nhi]) / count
        ax, ay = xs[a], ys[a]
        # Twice the triangle area is |(ax-cx)(y-ay) - (ax-x)(cy-ay)|, linear in (x, y):
        # |p*y + q*x + r|. Its maximum over the bucket is at the max or min of p*y + q*x.
        p = ax - cx
        q = cy - ay
        r = -p * ay - q * ax
        best = lo
        best_area = -1.0
        for j in range(lo, hi):
            area = abs(p * ys[j] + q * xs[j] + r)
            if area > best_area:
                best_area = area
                best = j
        out_x.append(xs[best])
        out_y.append(ys[best])
        a = best
    out_x.append(xs[-1])
    out_y.append(ys[-1])
    return out_x, out_y


def _minmax_candidates(xs: Sequence[float], ys: Sequence[float], buckets: int) -> list[int]:
    """Indices of the min and max of `buckets` equal slices, in index order."""
    n = len(ys)
    keep = [0]
    every = (n - 2) / buckets
    for b in range(buckets):
        lo = int(b * every) + 1
        hi = int((b + 1) * every) + 1
        if hi <= lo:
            continue
        chunk = ys[lo:hi]
        i_min = chunk.index(min(chunk))
        i_max = chunk.index(max(chunk))
        if i_min < i_max:
            keep += (lo + i_min, lo + i_max)
        elif i_max < i_min:
            keep += (lo + i_max, lo + i_min)
        else:
            keep.append(lo + i_min)
    keep.append(n - 1)
    return keep


def downsample(
    xs: Sequence[float], ys: Sequence[float], n_out: int
) -> tuple[list[float], list[float]]:
    """At most `n_out` points that draw like all of them; endpoints and extremes kept.

    `xs` must be sorted. Works on lists and on `array('d')` (whose slices stay arrays,
    so the pre-pass never builds Python floats for the points it drops).
    """
    n = len(xs)
    if n <= n_out or n <= 2:
        return list(xs), list(ys)
    if n_out < 4:
        return [xs[0], xs[-1]], [ys[0], ys[-1]]
    if n > n_out * MINMAX_RATIO * 2:
        if not isinstance(ys, (list, array)):
            ys = list(ys)
        idx = _minmax_candidates(xs, ys, n_out * MINMAX_RATIO // 2)
        cx = [xs[i] for i in idx]
        cy = [ys[i] for i in idx]
    else:
        cx, cy = list(xs), list(ys)
    out_x, out_y = lttb(cx, cy, n_out)
    _keep_extremes(cx, cy, out_x, out_y)
    return out_x, out_y


def _keep_extremes(
    cx: list[float], cy: list[float], out_x: list[float], out_y: list[float]
) -> None:
    """Put the global min and max in place of the output point nearest to each."""
    if len(out_x) < 3:
        return
    for value in (min(cy), max(cy)):
        if value in out_y:
            continue
        x = cx[cy.index(value)]
        # Replace the nearest interior output point (never an endpoint).
        best = min(range(1, len(out_x) - 1), key=lambda k: abs(out_x[k] - x))
        out_x[best] = x
        out_y[best] = value
    # Replacing can break x order when two points were close; keep it sorted.
    if any(out_x[k] > out_x[k + 1] for k in range(len(out_x) - 1)):
        pairs = sorted(zip(out_x, out_y, strict=True))
        out_x[:] = [p[0] for p in pairs]
        out_y[:] = [p[1] for p in pairs]
