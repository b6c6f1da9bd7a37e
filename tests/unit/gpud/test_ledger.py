"""The daemon's CPU by component (issue 22 §5): what a component's thread spends, and only
that, is charged to it."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from gpud.node.ledger import COMPONENTS, CpuLedger, next_beat, until_beat


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_is_charged_to_its_component_and_waiting_is_not() -> None:
    ledger = CpuLedger()
    with ledger.charge("sampler"):
        spin(0.05)
    with ledger.charge("store"):
        time.sleep(0.1)  # waiting costs no CPU
    totals = ledger.totals()
    assert set(COMPONENTS) <= set(totals)
    assert 0.04 <= totals["sampler"] < 0.5, totals
    assert totals["store"] < 0.01, totals
    assert totals["brief"] == 0.0


def test_work_charged_in_another_thread_counts_that_threads_cpu_only() -> None:
    ledger = CpuLedger()

    def sample() -> int:
        spin(0.05)
        return 7

    work = ledger.charged("sampler", sample)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    with ledger.charge("snapshot"):  # this thread waits for the other one meanwhile
        thread.start()
        thread.join()
    assert result == [7]
    totals = ledger.totals()
    assert totals["sampler"] >= 0.04 and totals["snapshot"] < 0.02, totals


def test_a_collection_inside_a_charged_block_is_the_collectors_not_the_blocks() -> None:
    ledger = CpuLedger(watch_gc=True)
    try:
        # A heap of cycles: a full collection over it takes measurable CPU.
        heap = []
        for _ in range(300_000):
            node: list[object] = []
            node.append(node)
            heap.append(node)
        with ledger.charge("retention"):
            before = time.thread_time()
            gc.collect()
            collecting = time.thread_time() - before
        totals = ledger.totals()
    finally:
        ledger.close()
    assert collecting > 0.01, collecting
    assert totals["gc"] >= 0.8 * collecting, (totals, collecting)
    assert totals["retention"] < 0.2 * collecting + 0.005, (totals, collecting)
    del heap


def test_only_a_ledger_that_watches_the_collector_counts_it_and_close_lets_go() -> None:
    quiet, watching = CpuLedger(), CpuLedger(watch_gc=True)
    watching.close()
    watching.close()  # idempotent
    gc.collect()
    assert quiet.totals()["gc"] == 0.0 and watching.totals()["gc"] == 0.0


def test_a_charge_inside_another_is_counted_once_where_it_is_most_specific() -> None:
    ledger = CpuLedger()
    with ledger.charge("supervision"):
        spin(0.03)
        with ledger.charge("goodput"):
            spin(0.05)
            with ledger.charge("store"):
                spin(0.02)
        spin(0.01)
    totals = ledger.totals()
    assert 0.035 <= totals["supervision"] < 0.07, totals  # its own 0.04 s only
    assert 0.045 <= totals["goodput"] < 0.08, totals  # less the store's
    assert 0.018 <= totals["store"] < 0.04, totals
    assert 0.09 <= sum(totals.values()) < 0.15, totals  # the 0.11 s spent, once


def test_the_next_beat_is_the_next_multiple_of_the_period() -> None:
    assert next_beat(10.2, 1.0) == 11.0
    assert next_beat(11.0, 1.0) == 12.0  # on a beat: the next one, never now
    assert next_beat(10.2, 0.5) == 10.5
    assert next_beat(0.0, 0.25) == 0.25


@pytest.mark.asyncio
async def test_parts_that_sleep_at_different_moments_wake_together_on_the_beat() -> None:
    """What keeps an idle daemon cheap: three periodic parts that start to wait 30 and 70 ms
    apart wake in one turn of the loop, on a multiple of the period (each alone would wake
    0.2 s after its own start, 70 ms apart)."""
    loop = asyncio.get_running_loop()
    woke: list[float] = []

    async def part(delay: float) -> None:
        await asyncio.sleep(delay)
        await until_beat(0.2)
        woke.append(loop.time())

    await until_beat(0.2)  # start just after a beat, so all three wait for the next one
    await asyncio.gather(part(0.0), part(0.03), part(0.07))
    assert len(woke) == 3
    assert max(woke) - min(woke) < 0.02, woke  # together: one wake-up
    beat = round(min(woke) / 0.2) * 0.2
    assert 0 <= min(woke) - beat < 0.1, woke  # on a beat
