"""Bursts of the same thing told once, then as counts (gpud/security/bursts.py)."""

from __future__ import annotations

import logging

import pytest

from gpud.security.bursts import OTHERS, Bursts, ThrottledLog
from tests.support.clock import ManualClock


def test_the_first_is_told_the_rest_counted_and_summarized_per_interval() -> None:
    clock = ManualClock(1000.0)
    bursts: Bursts[str] = Bursts(10.0, clock=clock)
    assert bursts.admit("a", "first")
    assert not any(bursts.admit("a", f"again {i}") for i in range(5))
    assert bursts.admit("b", "another key")  # keys are counted apart
    clock.now += 9.9
    assert bursts.due() == []  # the interval is not over
    clock.now += 0.2
    (summary,) = bursts.due()
    assert (summary.key, summary.count, summary.last) == ("a", 5, "again 4")
    assert summary.seconds == pytest.approx(10.1)
    # Still coming: counted on, not told in full again.
    assert not bursts.admit("a", "more")
    clock.now += 10.5
    assert [(s.key, s.count) for s in bursts.due()] == [("a", 1)]
    # Quiet for a whole interval: forgotten, so the next one is told at once.
    clock.now += 10.5
    assert bursts.due() == []
    assert bursts.admit("a", "back")


def test_keys_past_the_limit_are_counted_together() -> None:
    clock = ManualClock(1000.0)
    bursts: Bursts[int] = Bursts(10.0, max_keys=3, clock=clock)
    assert all(bursts.admit(i) for i in range(3))
    assert not bursts.admit(99, "a new key past the limit")
    assert not bursts.admit(100)
    assert [(s.key, s.count) for s in bursts.drain()] == [(OTHERS, 2)]


def test_a_throttled_log_writes_one_line_then_one_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(1000.0)
    throttled = ThrottledLog(logging.getLogger("test.bursts"), 10.0, clock=clock)
    with caplog.at_level(logging.INFO, "test.bursts"):
        for i in range(41):
            throttled.warning("revoked-key", f"refused request {i}")
        throttled.flush()
        clock.now += 10.0
        throttled.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "refused request 0",
        "refused request 40 (40 more like it in the last 10 s)",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
