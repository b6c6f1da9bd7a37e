"""The heap long held is kept out of the collector's walks (issue 22 §5): frozen every
FREEZE_EVERY_S, thawed and collected once every THAW_EVERY_S."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpud.retention.heap import FREEZE_EVERY_S, THAW_EVERY_S, HeapKeeper


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_what_survived_is_frozen_at_the_first_tick_then_every_few_minutes() -> None:
    heap = HeapKeeper(now=1000.0)
    assert heap.tick(1001.0) and HeapKeeper.frozen() > 0  # start-up's heap, at once
    first = HeapKeeper.frozen()
    held = [[i] for i in range(10_000)]  # long-lived objects made since
    assert not heap.tick(1001.0 + FREEZE_EVERY_S - 1)
    assert heap.tick(1001.0 + FREEZE_EVERY_S)
    assert HeapKeeper.frozen() >= first + len(held)
    del held


def test_cyclic_garbage_frozen_once_is_collected_at_the_thaw() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    heap = HeapKeeper(now=0.0)
    cycles = [Node() for _ in range(1000)]
    heap.tick(1.0)
    frozen = HeapKeeper.frozen()
    del cycles  # garbage now, but frozen: no collection sees it
    gc.collect()
    assert HeapKeeper.frozen() > frozen - 100  # (a few others freed by their counts)
    heap.tick(1.0 + FREEZE_EVERY_S)  # a freeze: the frozen stay frozen
    assert HeapKeeper.frozen() > frozen - 100
    heap.tick(THAW_EVERY_S + 1.0)  # thawed, collected, frozen again: the cycles are gone
    assert HeapKeeper.frozen() <= frozen - 1000
