"""A node asks node 0 where a run stands and stops its part itself (issue 26 §1)."""

from __future__ import annotations

import pytest

from gpud.model.run import NodeRef, RunRecord, RunState
from gpud.runs.multinode.coordinator_watch import GAP_S, WATCH_S, CoordinatorWatch, stop_for
from gpud.runs.multinode.gang import _orphan_reason
from gpud.runs.multinode.peer_stops import PeerStops
from gpud.runs.state.book import check_member
from gpud.security.auth import Caller
from gpud.security.roles import Role
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.run_messages import GangStatus, PartStopRequest

NODES = [
    NodeRef(control=f"tcp://10.0.0.{i}:5555", name=f"n{i}", server_key=f"key-{i}") for i in range(3)
]


def status(state: RunState, attempt: int = 1, **kw: object) -> GangStatus:
    return GangStatus(run_id="r-1", state=state, attempt=attempt, **kw)


def test_a_part_goes_on_while_node_0_has_the_run_running_or_restarting() -> None:
    for state in (RunState.STARTING, RunState.RUNNING, RunState.PENDING, RunState.QUEUED):
        assert stop_for(status(state), attempt=1, rank=1) is None


def test_node_0_stopping_or_ended_stops_the_part_saying_why() -> None:
    stopping = stop_for(status(RunState.STOPPING, reason="stop requested by ann"), 1, 1)
    assert stopping is not None and not stopping.failed
    assert stopping.reason == "node 0 has the run stopping: stop requested by ann"
    failed = stop_for(status(RunState.FAILED, reason="rank 1: SIGKILL"), attempt=1, rank=1)
    assert failed is not None and failed.failed and "rank 1: SIGKILL" in failed.reason
    stopped = stop_for(status(RunState.STOPPED), attempt=1, rank=1)
    assert stopped is not None and not stopped.failed


def test_what_node_0_asked_wins_and_a_later_attempt_ends_an_old_part() -> None:
    asked = PartStopRequest(run_id="r-1", failed=True, reason="node 0's part failed", dump=True)
    assert stop_for(status(RunState.STOPPING, stop=asked), attempt=1, rank=1) == asked
    moved = stop_for(status(RunState.RUNNING, attempt=3), attempt=2, rank=1)
    assert moved is not None and moved.failed
    assert moved.reason == "node 0 has moved on to attempt 3"
    # an ask about an older attempt says nothing about this one
    assert stop_for(status(RunState.RUNNING, attempt=2, stop=asked), attempt=3, rank=1) is None


def test_a_node_an_elastic_attempt_left_out_hears_the_run_went_on_without_it() -> None:
    """The node asks first (its loop was frozen): it is told the same as when node 0 finds
    its stale part (`_orphan_reason`), not that the run moved on as if it were in it."""
    left = status(RunState.RUNNING, attempt=2, members=[0, 1])
    stale = stop_for(left, attempt=1, rank=2)
    assert stale is not None and stale.failed
    assert stale.reason == (
        "this part of attempt 1 is stale: run r-1 went on without node 2 (attempt 2, on its"
        " other nodes)"
    )
    assert stale.reason == _orphan_reason(run_record(0, attempt=2), 1, 2)
    member = stop_for(left, attempt=1, rank=1)
    assert member is not None and member.reason == "node 0 has moved on to attempt 2"
    ended = stop_for(status(RunState.FAILED, attempt=2, members=[0, 1]), attempt=1, rank=2)
    assert ended is not None and ended.reason == "node 0 has moved on to attempt 2"


def test_asks_every_watch_interval_and_at_once_after_a_freeze() -> None:
    watch = CoordinatorWatch()
    assert watch.tick(0.0) is False
    assert watch.due("r-1", 0.0, woke=False)
    watch.sending("r-1", 0.0)
    assert not watch.due("r-1", WATCH_S + 1, woke=True)  # one ask in flight at a time
    watch.answered("r-1")
    assert not watch.due("r-1", 1.0, woke=False)
    assert watch.due("r-1", WATCH_S, woke=False)
    assert watch.tick(0.25) is False
    assert watch.tick(0.25 + GAP_S + 0.1) is True  # the loop was frozen
    assert watch.due("r-1", 1.0, woke=True)


def run_record(node_rank: int = 0, attempt: int = 1) -> RunRecord:
    return RunRecord(
        id="r-1", name="r", created_at=0.0, spec={}, nodes=NODES, node_rank=node_rank,
        state=RunState.STOPPING, state_since=0.0, run_dir="/tmp/r", checkpoint_dir="/tmp/r/ck",
        attempt=attempt, coordinator=None if node_rank == 0 else NODES[0],
    )  # fmt: skip


def peer(key: str) -> Caller:
    return Caller(key=key, role=Role.PEER, name=key)


def test_only_the_runs_other_nodes_may_ask_node_0() -> None:
    check_member(run_record(), peer("key-1"))
    check_member(run_record(), peer("key-2"))
    for caller, where in ((peer("key-9"), run_record()), (peer("key-0"), run_record(1))):
        with pytest.raises(ProtocolError) as refused:
            check_member(where, caller)
        assert refused.value.code is ErrorCode.FORBIDDEN


def test_node_0_tells_what_it_asked_of_the_current_attempt_only() -> None:
    stops = PeerStops()
    asked = PartStopRequest(run_id="r-1", reason="rank 1 killed", failed=True)
    stops.want(run_record(), asked)
    assert stops.wanted(run_record()) == asked
    assert stops.wanted(run_record(attempt=2)) is None


def test_a_stale_part_stopped_by_node_0_is_told_the_run_went_on_not_that_it_ended() -> None:
    """Issue 33 §4: an elastic run's left-out node that came back had its part's log say
    `run … ended` while the run trained on elsewhere."""
    going_on = run_record(attempt=2).model_copy(update={"state": RunState.RUNNING})
    why = _orphan_reason(going_on, 1, 2)
    assert "run r-1 ended" not in why
    assert why == (
        "this part of attempt 1 is stale: run r-1 went on without node 2 (attempt 2, on its"
        " other nodes)"
    )
    ended = going_on.model_copy(update={"state": RunState.FAILED})
    assert _orphan_reason(ended, 1, 2) == "run r-1 ended"
