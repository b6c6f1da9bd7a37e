"""A rank's pulse: its phase from the moment it enters a collective, and step and
collective times measured afresh over each heartbeat interval (a pause leaves no trace).

Times are given, not read: in a rank the link thread calls `heartbeat` every 20 ms; here
`Rank` plays both threads at the times a test chooses.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainers.pulse import Pulse


class Rank:
    def __init__(self) -> None:
        self.pulse = Pulse(0.0)
        self.sent: list[dict[str, Any]] = []  # the heartbeats the link thread got

    def steps(self, first: int, count: int, start: float, each: float, wait: float = 0.0) -> float:
        """`count` steps of `each` seconds from `start`, the last `wait` of each in a
        collective, the link thread ticking all along. Returns when the last one ended."""
        now = start
        for step in range(first, first + count):
            compute_end = now + each - wait
            self.tick(now, compute_end)
            if wait:
                self.pulse.enter_collective(compute_end)
                self.tick(compute_end, now + each)
                self.pulse.leave_collective(now + each)
            now += each
            self.pulse.step_done(step, now)
        return now

    def tick(self, start: float, end: float) -> None:
        t = start
        while t < end:
            if (body := self.pulse.heartbeat(t)) is not None:
                self.sent.append(body)
            t += 0.02

    def beat(self, now: float) -> dict[str, Any]:
        body = self.pulse.heartbeat(now, force=True)
        assert body is not None
        return body


def test_entering_a_collective_is_the_collective_phase_at_once() -> None:
    rank = Rank()
    pulse = rank.pulse
    pulse.step_done(0, 1.0)
    pulse.enter_collective(1.5)  # e.g. DDP launched a gradient all-reduce; not completed
    body = rank.beat(9.0)
    assert (body["phase"], body["phase_since"]) == ("collective", 1.5)
    # A second bucket in flight, the first completes: still waiting since the first.
    pulse.enter_collective(2.0)
    pulse.leave_collective(3.0)
    body = rank.beat(9.5)
    assert (body["phase"], body["phase_since"]) == ("collective", 1.5)
    pulse.leave_collective(4.0)
    body = rank.beat(10.0)
    assert (body["phase"], body["phase_since"]) == ("compute", 4.0)
    # Overlapping collectives count once: 1.5 → 4.0.
    assert pulse.collective_time(10.0) == pytest.approx(2.5)
    pulse.leave_collective(5.0)  # a leave without an enter changes nothing
    assert rank.beat(10.5)["phase"] == "compute"


def test_collective_time_counts_while_one_is_still_in_flight() -> None:
    rank = Rank()
    pulse = rank.pulse
    pulse.step_done(0, 0.0)
    pulse.enter_collective(0.2)
    pulse.step_done(1, 0.5)  # a step ends while an all-reduce is in flight
    pulse.leave_collective(0.6)
    pulse.step_done(2, 1.0)
    body = rank.beat(1.0)
    assert body["step_time_s"] == pytest.approx(0.5)
    assert body["collective_s"] == pytest.approx(0.2)  # 0.3 s then 0.1 s, per step


def test_each_heartbeat_measures_its_own_interval() -> None:
    rank = Rank()
    end = rank.steps(0, 11, 0.0, 0.05, wait=0.02)
    body = rank.beat(end)
    assert body["step"] == 10
    assert body["step_time_s"] == pytest.approx(0.05)
    assert body["collective_s"] == pytest.approx(0.02)
    # The steps get four times slower: the next heartbeat says so in full, at once.
    end = rank.steps(11, 3, end, 0.2, wait=0.02)
    body = rank.beat(end)
    assert body["step_time_s"] == pytest.approx(0.2)
    assert body["collective_s"] == pytest.approx(0.02)
    # No step finished since: the last measurement stands.
    assert rank.beat(end + 0.1)["step_time_s"] == pytest.approx(0.2)


def test_one_long_step_marks_one_interval_only() -> None:
    rank = Rank()
    end = rank.steps(0, 10, 0.0, 0.05)
    rank.beat(end)
    end = rank.steps(10, 1, end, 2.0)  # one 2 s step (the link thread kept ticking)
    assert rank.beat(end)["step_time_s"] == pytest.approx(2.0)
    end = rank.steps(11, 10, end, 0.05)
    assert rank.beat(end)["step_time_s"] == pytest.approx(0.05)


@pytest.mark.parametrize("link_first", [True, False], ids=["link-wakes-first", "step-ends-first"])
def test_a_step_frozen_by_a_pause_is_not_measured(link_first: bool) -> None:
    """SIGSTOP in the middle of a step, SIGCONT 5 s later: every thread was frozen, and
    whichever wakes first, the frozen step is in no heartbeat."""
    rank = Rank()
    end = rank.steps(0, 14, 0.0, 0.05)
    # Step 14 starts at `end`; the process is frozen from end + 0.01 to end + 5.01.
    rank.tick(end, end + 0.01)
    woke = end + 5.01
    rank.sent.clear()
    if link_first:
        rank.tick(woke, woke + 0.01)  # sees the 5 s gap
        rank.pulse.step_done(14, woke + 0.04)
    else:
        rank.pulse.step_done(14, woke + 0.04)
        rank.tick(woke + 0.04, woke + 0.05)  # sees the gap after the step ended
    rank.steps(15, 40, woke + 0.04, 0.05)
    # Heartbeats went out since (the first one at once): none held the frozen step.
    assert len(rank.sent) >= 4 and rank.sent[-1]["step"] > 40
    assert [b["step_time_s"] for b in rank.sent] == [pytest.approx(0.05)] * len(rank.sent)


def test_a_slow_rank_reads_slow_in_every_interval() -> None:
    rank = Rank()
    now = 0.0
    for n in range(4):
        now = rank.steps(n * 5, 5, now, 0.13)
        assert rank.beat(now)["step_time_s"] == pytest.approx(0.13)
