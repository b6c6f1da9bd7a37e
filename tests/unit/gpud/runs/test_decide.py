"""Gang decisions from plain records and a fake clock: no daemons, no sockets."""

from __future__ import annotations

import pytest

from gpud.model.run import CauseKind, FailureCause, NodeRef, RunRecord, RunState
from gpud.runs.multinode.decide import GangDecision, RestartPolicy, decide, gang_state
from gpud.wire.run_messages import PartView

NODES = [NodeRef(control=f"tcp://10.0.0.{i}:5555", name=f"n{i}") for i in range(3)]
NO_RESTART = RestartPolicy()
CAUSE = FailureCause(kind=CauseKind.NCCL, summary="NCCL timeout", node_rank=0, node="n0")


def run(state: RunState = RunState.RUNNING, **changes: object) -> RunRecord:
    record = RunRecord(
        id="r-1",
        name="r",
        created_at=0.0,
        spec={},
        nodes=NODES,
        node_rank=0,
        state=state,
        state_since=0.0,
        run_dir="/tmp/r",
        checkpoint_dir="/tmp/r/ck",
    )
    return record.model_copy(update=changes)


def parts(*states: RunState | None, seen: float | None = None) -> dict[int, PartView]:
    return {
        rank: PartView(node_rank=rank, node=NODES[rank], state=state, reason=f"why {rank}",
                       seen_at=seen)
        for rank, state in enumerate(states)
    }  # fmt: skip


def at(
    now: float,
    record: RunRecord,
    views: dict[int, PartView],
    restart: RestartPolicy = NO_RESTART,
    cause: FailureCause | None = None,
    step: int | None = None,
) -> GangDecision:
    return decide(
        record,
        views,
        now=now,
        since=0.0,
        lost_after_s=30.0,
        restart=restart,
        cause=cause,
        step_of=lambda: step,
    )


def test_a_silent_node_is_lost_only_after_the_timeout() -> None:
    views = parts(RunState.RUNNING, RunState.RUNNING, RunState.RUNNING, seen=100.0)
    assert at(129.9, run(), views) == GangDecision(RunState.RUNNING, "attempt 1")
    decision = at(130.0, run(), views)
    assert decision.lost == [1, 2]
    assert decision.state is RunState.STOPPING  # node 0's own part still runs
    assert decision.propagate is not None
    assert decision.propagate.startswith("node 1 (n1): lost, no answer for 30s")


def test_a_node_never_heard_from_counts_from_the_start_of_the_attempt() -> None:
    views = parts(RunState.RUNNING, None)
    assert at(29.0, run(), views).lost == []
    assert at(30.0, run(), views).lost == [1]


def test_a_run_with_a_lost_part_ends_failed_with_node_n_lost() -> None:
    views = parts(RunState.RUNNING, RunState.RUNNING, RunState.SUCCEEDED, seen=1.0)
    first = at(31.0, run(), views, step=6)
    assert first.propagate == "node 1 (n1): lost, no answer for 30s (network, step 6 of attempt 1)"
    assert first.cause is not None and first.cause.kind is CauseKind.NETWORK
    views = parts(RunState.FAILED, RunState.LOST, RunState.SUCCEEDED, seen=1.0)
    decision = at(32.0, run(RunState.STOPPING), views, cause=first.cause, step=6)
    assert decision.state is RunState.FAILED
    assert decision.reason == first.propagate
    assert decision.propagate is None  # already done once


def test_a_part_that_ended_is_never_lost() -> None:
    views = parts(RunState.RUNNING, RunState.SUCCEEDED, RunState.RUNNING, seen=0.0)
    views[2] = views[2].model_copy(update={"seen_at": 1000.0})
    assert at(1000.0, run(), views).lost == []


def test_a_failed_part_stops_the_others_once_and_fails_the_run_when_all_ended() -> None:
    views = parts(RunState.RUNNING, RunState.FAILED, RunState.RUNNING, seen=9.0)
    first = at(10.0, run(), views)
    assert first.state is RunState.STOPPING
    assert first.propagate == "node 1 (n1): why 1 (unknown, attempt 1)"
    assert at(10.5, run(), views, cause=first.cause).propagate is None
    # The others end failed too, each with the cause as its reason; the run keeps the cause.
    ended = parts(RunState.FAILED, RunState.FAILED, RunState.FAILED, seen=11.0)
    final = at(11.0, run(RunState.STOPPING), ended, cause=first.cause)
    assert (final.state, final.reason) == (RunState.FAILED, first.propagate)
    # Without a propagated cause (node 0 restarted meanwhile), the lowest failed node.
    assert (
        at(11.0, run(RunState.STOPPING), ended).reason == "node 0 (n0): why 0 (unknown, attempt 1)"
    )


def test_the_earliest_cause_a_part_found_is_the_runs_and_says_where_and_when() -> None:
    views = parts(RunState.FAILED, RunState.FAILED, RunState.RUNNING, seen=9.0)
    echo = FailureCause(
        kind=CauseKind.NETWORK, summary="Connection closed by peer", rank=0, time=101.0
    )
    first = FailureCause(
        kind=CauseKind.USER,
        summary="ValueError: bad shard 17",
        rank=5,
        time=100.5,
        lines=["Traceback", "ValueError: bad shard 17"],
    )
    views[0] = views[0].model_copy(update={"cause": echo})
    views[1] = views[1].model_copy(update={"cause": first})
    decision = at(10.0, run(), views, step=0)
    assert decision.reason == (
        "rank 5 on node n1: ValueError: bad shard 17 (user code, step 0 of attempt 1);"
        " stopping the other parts"
    )
    assert decision.cause is not None
    assert (decision.cause.node_rank, decision.cause.lines[-1]) == (1, "ValueError: bad shard 17")


def test_a_restart_waits_its_backoff_and_doubles_it() -> None:
    ended = parts(RunState.FAILED, RunState.STOPPED, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=3, backoff_s=10.0, backoff_max_s=25.0)
    first = at(50.0, run(RunState.STOPPING), ended, policy, cause=CAUSE)
    assert (first.state, first.restart_at) == (RunState.PENDING, 60.0)
    assert "restart 1 of 3" in (first.reason or "")
    third = at(50.0, run(RunState.STOPPING, restarts=2), ended, policy, cause=CAUSE)
    assert third.restart_at == 75.0  # 10·2² = 40, capped at 25
    spent = at(50.0, run(RunState.STOPPING, restarts=3), ended, policy, cause=CAUSE)
    assert spent.state is RunState.FAILED


def test_restarts_only_for_the_kinds_in_restart_on() -> None:
    ended = parts(RunState.FAILED, RunState.STOPPED, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=3, backoff_s=1.0)
    user = CAUSE.model_copy(update={"kind": CauseKind.USER, "summary": "KeyError: 'x'"})
    decision = at(50.0, run(RunState.STOPPING), ended, policy, cause=user)
    assert decision.state is RunState.FAILED
    assert (decision.reason or "").endswith("; not restarted: user is not in restart.on")
    everything = RestartPolicy(max_attempts=3, backoff_s=1.0, on=frozenset(CauseKind))
    assert at(50.0, run(RunState.STOPPING), ended, everything, cause=user).state is RunState.PENDING


def test_an_environment_failure_is_not_restarted_by_default_and_keeps_its_hint() -> None:
    ended = parts(RunState.FAILED, RunState.STOPPED, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=2, backoff_s=1.0)
    no_nccl = FailureCause(
        kind=CauseKind.ENVIRONMENT,
        summary="RuntimeError: Distributed package doesn't have NCCL built in",
        rank=0,
    )
    views = {**ended, 0: ended[0].model_copy(update={"cause": no_nccl})}
    decision = at(50.0, run(RunState.STOPPING), views, policy)
    assert decision.state is RunState.FAILED
    assert (decision.reason or "").endswith("; not restarted: environment is not in restart.on")
    # A cause its node sent without a hint (an older peer) gets one on node 0.
    assert decision.cause is not None and "built without NCCL" in (decision.cause.hint or "")


def test_the_nccl_hint_names_the_findings_of_every_part() -> None:
    ended = parts(RunState.FAILED, RunState.FAILED, RunState.STOPPED, seen=50.0)
    timeout = FailureCause(
        kind=CauseKind.NCCL,
        summary="[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
        rank=0,
        hint="written on node 0 before the other parts' dumps were read",
    )
    found = "collective #9 (all_reduce) never entered by rank 5 at train.py:80"
    views = {
        **ended,
        0: ended[0].model_copy(update={"cause": timeout}),
        1: ended[1].model_copy(update={"flight_recorder": [found]}),
    }
    decision = at(50.0, run(RunState.STOPPING), views)
    assert decision.cause is not None and decision.cause.flight_recorder == [found]
    assert f"the flight recorder found: {found}" in (decision.cause.hint or "")


def test_the_same_error_at_the_same_step_twice_stops_the_retries() -> None:
    ended = parts(RunState.FAILED, RunState.STOPPED, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=5, backoff_s=1.0)
    before = CAUSE.model_copy(update={"attempt": 1, "step": 40})
    again = CAUSE.model_copy(update={"attempt": 2, "step": 40})
    second = run(RunState.STOPPING, attempt=2, restarts=1, cause=before)
    decision = at(50.0, second, ended, policy, cause=again)
    assert decision.state is RunState.FAILED
    assert (decision.reason or "").endswith(
        "not restarted: the same error at the same step as attempt 1"
    )
    later = again.model_copy(update={"step": 41})  # it got further: worth another try
    assert at(50.0, second, ended, policy, cause=later).state is RunState.PENDING
    older = run(RunState.STOPPING, attempt=3, restarts=2, cause=before)  # not the one before
    assert at(50.0, older, ended, policy, cause=again).state is RunState.PENDING


def test_a_restart_after_a_lost_node_says_it_waits_for_every_node() -> None:
    ended = parts(RunState.FAILED, RunState.LOST, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=1, backoff_s=1.0)
    decision = at(50.0, run(RunState.STOPPING), ended, policy, cause=CAUSE)
    assert decision.state is RunState.PENDING
    assert (decision.reason or "").endswith("once every node answers")


def test_an_elastic_run_restarts_at_once_without_its_lost_node() -> None:
    """Issue 33 §4: a lost node that the next attempt leaves out is no crash loop: no
    backoff (10 s, then 20 s, added to each recovery with the README's own settings)."""
    ended = parts(RunState.FAILED, RunState.LOST, RunState.STOPPED, seen=50.0)
    policy = RestartPolicy(max_attempts=5, backoff_s=10.0, elastic=True)
    for restarts in (0, 1, 3):
        decision = at(50.0, run(RunState.STOPPING, restarts=restarts), ended, policy,
                      cause=CAUSE)  # fmt: skip
        assert decision.state is RunState.PENDING and decision.restart_at == 50.0
        assert (decision.reason or "").endswith(
            f"; restarting now without node 1 (restart {restarts + 1} of 5)"
        )
    # a failure with no node lost still backs off
    crashed = parts(RunState.FAILED, RunState.STOPPED, RunState.STOPPED, seen=50.0)
    again = at(50.0, run(RunState.STOPPING, restarts=1), crashed, policy, cause=CAUSE)
    assert again.restart_at == 70.0 and "restarting in 20s" in (again.reason or "")


def test_a_user_stop_ends_stopped_even_with_a_lost_node_and_says_so() -> None:
    stopping = run(RunState.STOPPING, stop_requested=True, reason="stop requested by ops")
    views = parts(RunState.STOPPED, RunState.RUNNING, RunState.STOPPED, seen=0.0)
    assert at(10.0, stopping, views).state is RunState.STOPPING
    decision = at(30.0, stopping, views)
    assert decision.lost == [1]
    assert decision.state is RunState.STOPPED
    assert decision.reason == "stop requested by ops; node 1 (n1) lost"
    assert decision.propagate is None  # a user stop is not a failure


def test_a_single_node_run_that_failed_has_nothing_to_propagate() -> None:
    single = run(nodes=NODES[:1])
    decision = at(1.0, single, parts(RunState.FAILED))
    assert (decision.state, decision.propagate) == (RunState.FAILED, None)


@pytest.mark.parametrize(
    ("states", "stop", "expected"),
    [
        ([RunState.RUNNING, None], False, RunState.RUNNING),
        ([RunState.SUCCEEDED, RunState.SUCCEEDED], False, RunState.SUCCEEDED),
        ([RunState.SUCCEEDED, RunState.STOPPED], False, RunState.STOPPED),
        ([RunState.RUNNING, RunState.LOST], False, RunState.FAILED),
        ([RunState.STOPPED, RunState.LOST], True, RunState.STOPPED),
        ([RunState.RUNNING, RunState.LOST], True, RunState.STOPPING),
    ],
)
def test_gang_state_folds_lost_parts_like_failures(
    states: list[RunState | None], stop: bool, expected: RunState
) -> None:
    assert gang_state(states, user_stop=stop) is expected


def test_a_stop_asked_while_a_failure_was_stopping_the_parts_ends_failed_with_it() -> None:
    """Issue 26 §1: it read `stopped` with the SIGKILL failure as its reason."""
    killed = FailureCause(kind=CauseKind.SIGNAL, summary="killed by SIGKILL", node_rank=0)
    stopping = run(RunState.STOPPING, stop_requested=True, reason="…; stopping the other parts")
    views = parts(RunState.FAILED, RunState.FAILED)
    decision = at(5.0, stopping, views, cause=killed)
    assert decision.state is RunState.FAILED and decision.cause == killed
    assert decision.reason is not None and decision.reason.startswith(killed.one_line())
    assert "stop was asked" in decision.reason and decision.restart_at is None
    # Without a failure before it, the same stop ends the run stopped.
    assert at(5.0, stopping, parts(RunState.STOPPED, RunState.STOPPED)).state is RunState.STOPPED
    # A stop of a run waiting for its restart cancels the restart: stopped.
    pending = run(RunState.PENDING, stop_requested=True)
    assert at(5.0, pending, views, cause=killed).state is RunState.STOPPED


def test_a_part_that_exited_0_while_the_others_saw_connection_errors_is_the_cause() -> None:
    """Issue 26 §3: rank 1 returns 0 at step 100; rank 0 fails on gloo's Read error."""
    gloo = FailureCause(kind=CauseKind.NETWORK, summary="gloo: Read error", rank=0, node_rank=0)
    record = run(RunState.STOPPING, spec={"nproc_per_node": 1, "training": {"max_steps": 500}})
    views = parts(RunState.FAILED, RunState.SUCCEEDED)
    views[0] = views[0].model_copy(update={"cause": gloo})
    decision = at(5.0, record, views, cause=gloo, step=99)
    assert decision.state is RunState.FAILED and decision.cause is not None
    assert decision.cause.kind is CauseKind.USER and decision.cause.rank == 1
    assert decision.reason == (
        "rank 1 on node n1: rank 1 exited 0 after step 99 while the others were training (the"
        " script ended early on one rank) (user code, step 99 of attempt 1)"
    )
    # Not at the end of training (a teardown error), nor beside a failure of its own kind.
    assert at(5.0, record, views, cause=gloo, step=499).cause == gloo.model_copy(
        update={"node": "n0", "attempt": 1, "step": 499}
    )
    own = FailureCause(kind=CauseKind.USER, summary="ValueError: x", rank=0, node_rank=0)
    views[0] = views[0].model_copy(update={"cause": own})
    assert at(5.0, record, views, step=99).cause.summary == "ValueError: x"  # type: ignore[union-attr]


def test_the_same_failure_is_the_same_rank_and_step_whatever_gloo_says() -> None:
    first = FailureCause(kind=CauseKind.NETWORK, summary="pair.cc:537 Read error", rank=0, step=99)
    second = first.model_copy(update={"summary": "pair.cc:553 Connection closed"})
    assert first.same_failure(second)
    assert not first.same_failure(second.model_copy(update={"step": 150}))
    assert not first.same_failure(second.model_copy(update={"rank": 1}))
    user = FailureCause(kind=CauseKind.USER, summary="ValueError: a", rank=0, step=9)
    assert user.same_failure(user) and not user.same_failure(
        user.model_copy(update={"summary": "KeyError: b"})
    )
