"""The daemon's CPU by component (issue 22 §5): what a component's thread spends, and only
that, is charged to it."""

from __future__ import annotations

import threading
import time

from gpud.ledger import COMPONENTS, CpuLedger


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
