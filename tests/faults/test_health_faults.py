"""Health under a frozen rank: a real 2-rank DDP run (gloo) under a real daemon, one of its
ranks stopped with SIGSTOP and woken with SIGCONT.

A stopped rank cannot say anything (its heartbeat thread is frozen with it), so the daemon
has to work it out from the others: the healthy rank waits in DDP's gradient all-reduce,
and health must name the stopped rank and count down to the collective timeout. Once the
rank runs again, the step it was frozen in must not make it read as a straggler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil
import pytest

from gpud.model.run import HealthSummary
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import FAST, health, launch, nothing_left, ranks_of, wait_for_step

# Latencies and step times measured against the machine's load: run alone.
pytestmark = [pytest.mark.faults, pytest.mark.alone]

TIMEOUT_S = 120
SLOW = "args=[--width, '1024', --depth, '4', --log-every, '5']"


def until(
    daemon: RunningDaemon,
    run_id: str,
    ok: Callable[[HealthSummary], bool],
    timeout: float,
    what: str,
) -> HealthSummary:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = health(daemon, run_id)
        if ok(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"health never showed {what} in {timeout:.0f}s; last: {last}")


@contextmanager
def running_ddp(daemon: RunningDaemon, args: str = FAST) -> Iterator[tuple[str, psutil.Process]]:
    """A 2-rank DDP run past its start-up, healthy, and the process of its rank 1; stopped
    at the end whatever happened (a daemon leaves its runs running when it exits)."""
    run_id = launch(daemon, args, "training.max_steps=100000", f"nccl.timeout_s={TIMEOUT_S}")
    try:
        wait_for_step(daemon, run_id, 10)
        until(
            daemon,
            run_id,
            lambda h: h.verdict == "ok" and all(r.compute_s is not None for r in h.ranks),
            30,
            "a healthy start: every rank has reported its steps",
        )
        workers = ranks_of(run_id)
        assert sorted(workers) == [0, 1], workers
        yield run_id, workers[1]
    finally:
        stopped = gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    nothing_left(run_id)


def test_a_stopped_rank_is_the_stall_culprit_and_the_countdown_moves(
    daemon: RunningDaemon,
) -> None:
    with running_ddp(daemon) as (run_id, victim):
        victim.suspend()  # SIGSTOP: every thread of the rank, its heartbeats too
        try:
            stalled = until(
                daemon,
                run_id,
                lambda h: h.stall is not None and h.stall.rank == 1,
                10,
                "a stall with rank 1 as its culprit",
            )
            time.sleep(2.0)
            later = health(daemon, run_id)
        finally:
            victim.resume()
    assert stalled.verdict == "stalled", stalled.reasons
    assert stalled.ranks[1].pid == victim.pid
    assert stalled.ranks[1].stalled and not stalled.ranks[0].stalled
    # rank 0 is blocked in DDP's gradient all-reduce (or the library's stop agreement): it
    # says so from the moment it entered, not only once the collective completes.
    assert stalled.ranks[0].phase == "collective", stalled.ranks[0]
    assert stalled.ranks[0].phase_for_s > 0.5, stalled.ranks[0]
    first = stalled.stall
    assert first is not None and first.timeout_s == TIMEOUT_S
    assert first.countdown_s < TIMEOUT_S, first
    # Two seconds on, the same culprit, and the countdown ran with the time rank 0 waited.
    assert later.stall is not None and later.stall.rank == 1, later.stall
    assert first.countdown_s - 4.0 < later.stall.countdown_s < first.countdown_s - 0.8, (
        first,
        later.stall,
    )
    # (+0.5, not +2: under load a health round can lag a heartbeat behind.)
    assert later.stall.stuck_for_s > first.stuck_for_s + 0.5


def test_a_rank_resumed_after_a_pause_is_not_a_straggler(daemon: RunningDaemon) -> None:
    # Steps of a few hundred ms: a heartbeat sees few steps, so whatever a measurement
    # keeps of the frozen step shows in many heartbeats.
    with running_ddp(daemon, SLOW) as (run_id, victim):
        victim.suspend()
        try:
            until(daemon, run_id, lambda h: h.verdict == "stalled", 10, "a stall")
            time.sleep(3.0)  # one very long step on rank 1 (and a long wait on rank 0)
        finally:
            victim.resume()
        until(daemon, run_id, lambda h: h.verdict == "ok", 10, "OK again after SIGCONT")
        # The step rank 1 was frozen in is not how fast it computes: no straggler, once.
        reads = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            reads.append(health(daemon, run_id))
            time.sleep(0.25)
    flagged = [(h.straggler, h.reasons) for h in reads if h.straggler or h.verdict != "ok"]
    assert not flagged, flagged
    assert len(reads) > 10
    # Training went on all along: these were reads of a live run, not of a stuck one.
    steps = [h.ranks[1].last_step or 0 for h in reads]
    assert steps[-1] > steps[0] + 5, steps


def test_no_straggler_in_the_30_s_after_a_rank_of_a_two_node_run_continues(
    daemons: Callable[..., RunningDaemon],
) -> None:
    """Issue 24 §5: rank 1 of a 2-node gloo run SIGSTOPped for 18 s, then SIGCONTed. The
    stall is reported; then, for 30 s, neither the rank that was frozen nor the peer that
    only waited is named a straggler for the catch-up, and the verdict does not flap."""
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    nodes = (node0.address, node1.address)
    # SLOW, not FAST: with steps of ~5 ms of compute, the few ms that rank 0 spends on
    # metrics and the two daemons on this one host take (both ranks share its cores) read
    # as a steady 1.4-1.8x straggler, whatever the stall did. This test is about the stall.
    run_id = launch(
        node0, SLOW, "training.max_steps=100000", f"nccl.timeout_s={TIMEOUT_S}",
        "nproc_per_node=1", nodes=nodes,
    )  # fmt: skip
    try:
        wait_for_step(node0, run_id, 10)
        # Both ranks have reported a step: a rank frozen before its first one is start-up
        # to health, not a stall (this test once froze rank 1 at step 0, under load).
        until(
            node0, run_id,
            lambda h: h.verdict == "ok" and len(h.ranks) == 2
            and all(r.last_step is not None for r in h.ranks),
            30, "healthy, both ranks stepping",
        )  # fmt: skip
        victim = ranks_of(run_id)[1]
        victim.suspend()
        try:
            until(node0, run_id, lambda h: h.stall is not None and h.stall.rank == 1, 10, "stall")
            time.sleep(16.0)
        finally:
            victim.resume()
        reads: list[HealthSummary] = []
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            reads.append(health(node0, run_id))
            time.sleep(0.5)
    finally:
        stopped = gpuctl("--node", node0.address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    verdicts = [h.verdict for h in reads]
    named = [(h.straggler.rank, h.straggler.ratio) for h in reads if h.straggler]
    print("verdicts after SIGCONT:", verdicts, "stragglers:", named)
    assert named == [], named
    # stalled for as long as the stall takes to clear, then ok for good: no flapping
    settled = verdicts.index("ok")
    assert set(verdicts[:settled]) <= {"stalled"}, verdicts
    assert set(verdicts[settled:]) == {"ok"}, verdicts
    steps = [h.ranks[1].last_step or 0 for h in reads]
    assert steps[-1] > steps[0] + 20, steps  # it trained all along
    nothing_left(run_id)
