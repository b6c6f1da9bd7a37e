"""How node 0 words a queued run's reason as it asks again each tick (issue 33 §9)."""

from __future__ import annotations

from gpud.runs.multinode.gang import _same_words

FULL = (
    "waiting for room: n0: the state dir /s is full (database or disk is full);"
    " 39 write(s) wait in memory: no new launch"
)


def test_a_full_stores_count_of_waiting_writes_is_no_news() -> None:
    assert _same_words(FULL, FULL.replace("39 write", "40 write"))


def test_other_numbers_are_news_and_a_first_reason_always_is() -> None:
    assert not _same_words(
        "waiting for GPUs: n0: GPU 0 is held", "waiting for GPUs: n0: GPU 1 is held"
    )
    assert not _same_words(None, FULL)
