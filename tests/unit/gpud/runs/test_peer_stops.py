"""Node 0 asks again, until each part has ended, a stop a node missed (issue 26 §1)."""

from __future__ import annotations

from gpud.model.run import NodeRef, RunRecord, RunState
from gpud.runs.multinode.peer_stops import RETRY_S, PeerStops
from gpud.wire.run_messages import PartStopRequest, PartView

NODES = [NodeRef(control=f"tcp://10.0.0.{i}:5555", name=f"n{i}") for i in range(3)]


def run(state: RunState = RunState.STOPPING, attempt: int = 1) -> RunRecord:
    return RunRecord(
        id="r-1", name="r", created_at=0.0, spec={}, nodes=NODES, node_rank=0, state=state,
        state_since=0.0, run_dir="/tmp/r", checkpoint_dir="/tmp/r/ck", attempt=attempt,
    )  # fmt: skip


def views(*states: RunState | None) -> dict[int, PartView]:
    return {
        r + 1: PartView(node_rank=r + 1, node=NODES[r + 1], state=s) for r, s in enumerate(states)
    }


def stop(failed: bool = False, force: bool = False, reason: str = "r") -> PartStopRequest:
    return PartStopRequest(run_id="r-1", failed=failed, force=force, reason=reason)


def test_a_part_not_over_is_asked_again_every_retry_until_it_is() -> None:
    stops = PeerStops()
    stops.want(run(), stop(failed=True, reason="rank 1 killed"))
    for rank in (1, 2):
        stops.sending("r-1", rank, 0.0)
    assert stops.answered("r-1", 1, reached=False) is False
    stops.answered("r-1", 2, reached=True)
    assert stops.due(run(), views(RunState.RUNNING, RunState.FAILED), 1.0) is None  # too soon
    due = stops.due(run(), views(RunState.RUNNING, RunState.FAILED), RETRY_S)
    assert due is not None and due[1] == [1] and due[0].failed
    stops.sending("r-1", 1, RETRY_S)
    # in flight: not asked twice at once
    assert stops.due(run(), views(RunState.RUNNING, None), 10 * RETRY_S) == (due[0], [2])
    assert stops.answered("r-1", 1, reached=True) is True  # got through after a miss
    assert stops.due(run(), views(RunState.FAILED, RunState.FAILED), 20 * RETRY_S) is None


def test_a_later_user_stop_keeps_the_failure_and_its_reason() -> None:
    stops = PeerStops()
    stops.want(run(), stop(failed=True, reason="rank 1 killed"))
    merged = stops.want(run(), stop(force=True, reason="stop requested by alice"))
    assert merged.failed and merged.force and merged.reason == "rank 1 killed"


def test_a_wish_ends_with_its_run_or_its_attempt() -> None:
    stops = PeerStops()
    stops.want(run(), stop())
    assert stops.due(run(RunState.FAILED), views(RunState.RUNNING), 99.0) is None
    assert stops.due(run(), views(RunState.RUNNING), 99.0) is None  # forgotten
    stops.want(run(), stop())
    assert stops.due(run(attempt=2), views(RunState.RUNNING), 99.0) is None
