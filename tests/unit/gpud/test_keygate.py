"""Which key may open another events connection (gpud/security/keygate.py)."""

from __future__ import annotations

from gpud.security.keygate import KeyGate
from tests.support.clock import ManualClock


def test_a_burst_then_one_per_refill() -> None:
    clock = ManualClock(50.0)
    gate = KeyGate(burst=3, refill_s=2.0, clock=clock)
    assert [gate.admit("k") for _ in range(3)] == [None, None, None]
    refused = gate.admit("k")
    assert refused is not None and "over 3 connections at once" in refused
    assert gate.admit("other") is None  # per key
    clock.now += 2.0
    assert gate.admit("k") is None
    assert gate.admit("k") is not None


def test_a_penalized_key_waits_then_comes_back() -> None:
    clock = ManualClock(50.0)
    gate = KeyGate(burst=3, penalty_s=30.0, clock=clock)
    gate.penalize("k")
    assert gate.penalized("k")
    refused = gate.admit("k")
    assert refused is not None and "refused for 30 s more" in refused
    clock.now += 29.0
    assert gate.admit("k") is not None
    clock.now += 1.5
    assert not gate.penalized("k")
    assert gate.admit("k") is None
