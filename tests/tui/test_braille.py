"""The braille plot lays out a curve, its axes and its resume marks as plain text runs."""

from __future__ import annotations

from tui.model import braille
from tui.model.series import MetricSeries


def text_of(plot: braille.Plot) -> list[str]:
    return ["".join(text for text, _ in row) for row in plot.rows]


def test_a_falling_curve_with_a_resume_mark() -> None:
    series = MetricSeries()
    for step in range(0, 600):
        series.append(1, step, 1.0 / (1 + step / 50))
    for step in range(500, 1000):
        series.append(2, step, 1.0 / (1 + step / 50))
    plot = braille.plot(series.drawn(120), 60, 16, "loss")
    lines = text_of(plot)
    assert len(lines) == 16
    assert lines[0].strip() == "loss"
    assert all(len(line) <= 60 for line in lines)
    body = lines[1:-2]
    assert any(0x2800 < ord(ch) <= 0x28FF for line in body for ch in line)
    # Both attempts have their own colour, and the resume has its marker colour.
    colors = {color for row in plot.rows for _, color in row}
    assert {braille.SERIES, braille.SERIES + 1, braille.MARKER} <= colors
    assert "└" in lines[-2] and "┬" in lines[-2]
    assert "0" in lines[-1] and "500" in lines[-1]
    # Falling: the first column's dots are high, the last column's low.
    first_row = next(
        i for i, line in enumerate(body) if line[line.index("│" if "│" in line else "┤") + 1] != " "
    )
    assert first_row < 3


def test_ticks_are_round_and_inside_the_range() -> None:
    assert braille.ticks(0, 1, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert braille.ticks(3, 97, 4) == [25.0, 50.0, 75.0]
    assert braille.label(0.000123) == "1.2e-04"
    assert braille.label(1234.0) == "1234"


def test_too_small_or_empty_plots_show_only_the_title() -> None:
    empty = MetricSeries()
    assert text_of(braille.plot(empty.drawn(10), 40, 10, "loss")) == ["loss"]
    series = MetricSeries()
    series.append(1, 0, 1.0)
    assert text_of(braille.plot(series.drawn(10), 8, 3, "loss")) == ["loss"]
