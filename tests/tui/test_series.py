"""Histories stay bounded however long a run trains, and keep their attempts apart."""

from __future__ import annotations

from tui.model.series import MetricSeries, Recent


def test_recent_keeps_the_last_readings_and_not_available() -> None:
    recent = Recent(maxlen=3)
    for value in (1.0, None, 3.0, 4.0):
        recent.add(value)
    assert recent.values() == [None, 3.0, 4.0]
    assert recent.present() == [3.0, 4.0]
    assert len(recent) == 3


def test_points_are_kept_per_attempt_and_duplicates_dropped() -> None:
    series = MetricSeries()
    assert series.append(1, 0, 1.0)
    assert series.append(1, 1, 0.9)
    assert not series.append(1, 1, 0.9)  # the same step again (history and live overlap)
    assert not series.append(1, 0, 1.0)
    assert series.append(2, 1, 0.95)  # a resume from the step-0 checkpoint
    assert not series.append(1, 2, 0.8)  # a late point of attempt 1
    assert len(series) == 3
    assert series.resumed_at() == (1.0,)
    assert series.last() == (2, 1.0, 0.95)
    assert [s.attempt for s in series.segments] == [1, 2]


def test_a_long_series_compacts_itself_and_keeps_its_extremes() -> None:
    series = MetricSeries(capacity=10_000)
    for step in range(50_000):
        value = 100.0 if step == 31_337 else 1.0 / (1 + step)
        series.append(1 if step < 25_000 else 2, step, value)
    assert len(series) <= 10_000
    assert series.compactions >= 1
    values = [v for _, _, v in series.points()]
    assert max(values) == 100.0
    assert series.resumed_at() == (25_000.0,)
    first = next(series.points())
    assert first == (1, 0.0, 1.0)
    assert series.last() == (2, 49_999.0, 1.0 / 50_000)


def test_drawn_shares_points_between_attempts_and_is_cached() -> None:
    series = MetricSeries()
    for step in range(3000):
        series.append(1, step, float(step))
    for step in range(2000, 4000):
        series.append(2, step, float(step))
    drawn = series.drawn(200)
    assert [a for a, _, _ in drawn.segments] == [1, 2]
    assert sum(len(xs) for _, xs, _ in drawn.segments) <= 200 + 8
    assert drawn.resumed_at == (2000.0,)
    assert drawn.points == 5000
    assert series.drawn(200) is drawn
    series.append(2, 4000, 1.0)
    assert series.drawn(200) is not drawn


def test_a_long_segment_is_drawn_from_its_envelope_with_ends_and_spikes() -> None:
    series = MetricSeries()
    n = 200_003  # not a whole number of envelope blocks: the tail counts too
    for step in range(n):
        series.append(1, step, 1.0 / (1 + step / 1000) + (50.0 if step == 123_456 else 0.0))
    segment = series.segments[0]
    assert len(segment.env_steps) >= 4 * 300
    drawn = series.drawn(300)
    ((_, xs, ys),) = drawn.segments
    assert len(xs) <= 300
    assert xs[0] == 0.0 and xs[-1] == n - 1
    assert max(ys) > 50 and xs[ys.index(max(ys))] == 123_456
    assert xs == sorted(xs)
