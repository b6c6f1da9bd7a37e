"""Runs always end: daemons killed mid-run, ranks killed, whole nodes gone for good.

Real daemons (two per test for the multi-node cases, on one host as a shared box has
them), real torchrun, real gloo ranks, real signals. Each case checks what an operator
sees — every node's state and reason, how long it took — and that no process is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from gpud.model.run import AttemptRecord, CauseKind, RunState
from gpud.runs.process import procs
from gpud.runs.state.part import Part
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    FAST,
    assert_no_gap,
    kill_rank,
    launch,
    nothing_left,
    status,
    steps_recorded,
    wait_for,
    wait_for_part,
    wait_for_step,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

Daemons = Callable[..., RunningDaemon]


def two_nodes(daemons: Daemons) -> tuple[RunningDaemon, RunningDaemon]:
    return daemons(node="n0", simulate_gpus=None), daemons(node="n1", simulate_gpus=None)


def restart(daemons: Daemons, old: RunningDaemon) -> RunningDaemon:
    """The same daemon again: same node name, state dir and ports."""
    started = time.monotonic()
    new = daemons(
        node=old.node,
        simulate_gpus=None,
        state_dir=old.state_dir,
        control_port=int(old.address.rsplit(":", 1)[1]),
        events_port=int(old.events.rsplit(":", 1)[1]),
    )
    print(f"{old.node} back and answering (parts re-adopted) in {time.monotonic() - started:.2f}s")
    return new


def kill_daemon(daemon: RunningDaemon) -> None:
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)


def part_processes(daemon: RunningDaemon, run_id: str, node_rank: int) -> list[psutil.Process]:
    """Everything of the run on one node besides its daemon: the shim and every rank."""
    shim = status(daemon, run_id).attempts[-1].shim_pid
    found = procs.tagged(run_id, node_rank=node_rank)
    if shim is not None:
        found.append(psutil.Process(shim))
    return found


def kill_node(daemon: RunningDaemon, run_id: str, node_rank: int) -> None:
    """The node dies whole: its daemon, its shim and every rank it ran."""
    doomed = part_processes(daemon, run_id, node_rank)
    kill_daemon(daemon)
    procs.send(doomed, signal.SIGKILL)


def long_two_node_run(node0: RunningDaemon, node1: RunningDaemon, *sets: str) -> str:
    """A run across both nodes that would go on for good, past its first steps."""
    run_id = launch(
        node0, FAST, "training.max_steps=100000", *sets, nodes=(node0.address, node1.address)
    )
    wait_for_step(node0, run_id, 3)
    return run_id


# --------------------------------------------------------------------------- daemons die


@pytest.mark.parametrize("victim", [0, 1], ids=["coordinator", "worker"])
def test_a_daemon_killed_mid_run_and_restarted_loses_nothing(daemons: Daemons, victim: int) -> None:
    nodes = list(two_nodes(daemons))
    total = 300  # 30 s paced: long enough to outlive the daemon restart on a busy machine
    launched = time.monotonic()
    run_id = launch(
        nodes[0], FAST, f"training.max_steps={total}", "nproc_per_node=1",
        nodes=(nodes[0].address, nodes[1].address),
    )  # fmt: skip
    wait_for_step(nodes[0], run_id, 10)
    to_step_10 = time.monotonic() - launched
    kill_daemon(nodes[victim])
    killed = time.monotonic()
    time.sleep(3.0)  # the ranks go on without it; rank 0 keeps logging metrics
    nodes[victim] = restart(daemons, nodes[victim])
    down = time.monotonic() - killed
    assert "re-adopted" in nodes[victim].log()
    s0 = wait_for(nodes[0], run_id, {"succeeded", "failed", "stopped"}, timeout=180)
    assert s0.run.state is RunState.SUCCEEDED, s0.run.reason
    # Goodput carried over node 0's restart (issue 23 §2): the stored account went on, as
    # far as the steps the store kept, and the time no daemon watched is its own bucket
    # (issue 33 §6), every second in one bucket. Had the account been lost, the restarted
    # clock would have put everything up to its first step after the restart in
    # `starting`.
    g = s0.goodput
    assert g is not None and g.ended and g.ratio is not None
    wall = s0.run.state_since - s0.run.created_at
    assert abs(sum(g.seconds.values()) - wall) <= 0.01 * wall, (g.seconds, wall)
    assert 0 < g.seconds["starting"] <= to_step_10 + 1.0, (g.seconds, to_step_10)
    # the rest ran: trained, saved, or (on a machine busy enough to hold a paced step up)
    # stalled; none of it restarting or lost, which a lost account would have made
    ran = g.seconds["training"] + g.seconds["checkpointing"] + g.seconds["stalled"]
    unwatched = g.seconds["unwatched"]
    assert ran + unwatched >= wall - to_step_10 - 2.0, (g.seconds, wall)
    if victim == 0:  # down, and up to a record's age (PERSIST_S) before it
        assert 0 < unwatched <= down + 10.0, (g.seconds, down)
    else:
        assert unwatched == 0, g.seconds  # node 0 watched throughout
    assert g.seconds["restarting"] == g.seconds["lost"] == g.seconds["queued"] == 0, g.seconds
    assert not g.attempts[0].unstepped
    assert [p.state for p in s0.parts] == [RunState.SUCCEEDED, RunState.SUCCEEDED]
    assert status(nodes[1], run_id).run.state is RunState.SUCCEEDED
    assert_no_gap(steps_recorded(nodes[0], run_id), total)
    nothing_left(run_id)


# --------------------------------------------------------------------------- ranks die


@pytest.mark.alone  # 5 s from the kill to every node, measured against the machine's load
@pytest.mark.parametrize("rank", [1, 3], ids=["rank-on-node0", "rank-on-node1"])
def test_a_killed_rank_fails_every_node_within_5s(daemons: Daemons, rank: int) -> None:
    node0, node1 = two_nodes(daemons)
    run_id = long_two_node_run(node0, node1)
    kill_rank(run_id, rank)
    killed_at = time.monotonic()
    s0 = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=30)
    s1 = wait_for(node1, run_id, {"failed", "stopped", "succeeded"}, timeout=30)
    took = time.monotonic() - killed_at
    assert (s0.run.state, s1.run.state) == (RunState.FAILED, RunState.FAILED), (
        s0.run.reason,
        s1.run.reason,
    )
    print(f"rank {rank} killed: every node reported failed in {took:.2f}s")
    assert took < 5.0, f"the failure took {took:.1f}s to reach every node"
    # The cause is the killed rank, not its peers' connection errors (gloo does not wait:
    # they fail too, on both nodes, often before torchrun reports the kill).
    cause = s0.run.cause
    assert cause is not None and (cause.kind, cause.rank) == (CauseKind.SIGNAL, rank), cause
    assert f"rank {rank} on node n{rank // 2}: killed by SIGKILL (signal" in (s0.run.reason or "")
    nothing_left(run_id)


def test_a_restarted_run_resumes_from_its_checkpoint_with_no_metric_gap(
    daemon: RunningDaemon,
) -> None:
    total = 120
    run_id = launch(
        daemon,
        FAST,
        f"training.max_steps={total}",
        "checkpoint.every_steps=10",
        "restart.max_attempts=1",
        "restart.backoff_s=0.5",
    )
    wait_for_step(daemon, run_id, 35)
    saved = status(daemon, run_id).run.last_checkpoint
    assert saved is not None and saved.step is not None
    kill_rank(run_id, 1)
    s = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=180)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert (s.run.attempt, s.run.restarts) == (2, 1)
    resumed_from = s.attempts[1].resume_from
    assert resumed_from is not None
    resumed_step = int(Path(resumed_from).name.removeprefix("step_").removesuffix(".pt"))
    assert resumed_step >= saved.step  # the latest checkpoint, not the first
    assert_no_gap(steps_recorded(daemon, run_id), total)
    nothing_left(run_id)


# --------------------------------------------------------------------------- nodes die


def test_a_node_killed_whole_ends_the_run_within_the_lost_timeout(daemons: Daemons) -> None:
    """kill -9 of the node's daemon and every process it ran. The kernel closes their
    sockets, so node 0's gloo ranks may abort before the lost timeout runs out: either
    way the run ends failed within lost_after_s + 10 s and node 1's part ends lost."""
    node0, node1 = two_nodes(daemons)
    run_id = long_two_node_run(node0, node1, "lost_after_s=5", "nproc_per_node=1")
    kill_node(node1, run_id, node_rank=1)
    killed_at = time.monotonic()
    s0 = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=60)
    took = time.monotonic() - killed_at
    print(f"node 1 killed whole: the run ended in {took:.2f}s (lost_after_s=5): {s0.run.reason}")
    assert s0.run.state is RunState.FAILED, s0.run.reason
    reason = s0.run.reason or ""
    # Node 1 lost, or node 0's ranks saw their gloo peers go first: the network, either way.
    assert s0.run.cause is not None and s0.run.cause.kind is CauseKind.NETWORK, reason
    assert took < 5 + 10, f"the run took {took:.1f}s to end"
    assert s0.parts[0].state is RunState.FAILED
    s0 = wait_for_part(node0, run_id, 1, RunState.LOST, timeout=5 + 10 - took + 5)
    assert any(e.kind == "lost" for e in s0.events)
    assert node0.client().node_info().node == "n0"  # the daemon still answers
    nothing_left(run_id)


def test_a_frozen_node_is_lost_and_node0_stops_its_own_hanging_ranks(daemons: Daemons) -> None:
    """A node that stops answering without closing anything (power cut, partition): its
    daemon and ranks are frozen with SIGSTOP, so node 0's ranks hang in gloo instead of
    erroring. Node 0 must call node 1 lost after lost_after_s and stop its own part."""
    node0, node1 = two_nodes(daemons)
    run_id = long_two_node_run(node0, node1, "lost_after_s=5", "nproc_per_node=1")
    frozen = [psutil.Process(node1.proc.pid), *part_processes(node1, run_id, 1)]
    try:
        procs.send(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        s0 = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=60)
        took = time.monotonic() - frozen_at
        print(f"node 1 frozen: the run ended in {took:.2f}s (lost_after_s=5)")
        assert s0.run.state is RunState.FAILED, s0.run.reason
        assert (s0.run.reason or "").startswith("node 1 (n1): lost, no answer for 5s (network")
        assert took < 5 + 10, f"the run took {took:.1f}s to end"
        assert [p.state for p in s0.parts] == [RunState.FAILED, RunState.LOST]
        assert any(e.kind == "lost" for e in s0.events)
        assert procs.tagged(run_id, node_rank=0) == [], "node 0 left its hanging ranks"
    finally:
        procs.send(frozen, signal.SIGKILL)
        node1.proc.wait(timeout=10)
    nothing_left(run_id)


def test_a_forced_stop_returns_within_15s_when_a_node_is_gone(daemons: Daemons) -> None:
    node0, node1 = two_nodes(daemons)
    run_id = long_two_node_run(node0, node1, "nproc_per_node=1")
    kill_node(node1, run_id, node_rank=1)
    started = time.monotonic()
    stop = gpuctl("--node", node0.address, "stop", run_id, "--force", timeout=60)
    took = time.monotonic() - started
    print(f"stop --force with node 1 gone returned in {took:.2f}s")
    assert took < 15, f"stop --force took {took:.1f}s"
    assert stop.returncode == 0, stop.stdout + stop.stderr
    s0 = status(node0, run_id)
    assert s0.run.state is RunState.STOPPED
    assert "node 1 (n1) lost" in (s0.run.reason or ""), s0.run.reason
    nothing_left(run_id)


def test_a_restart_after_a_lost_node_waits_for_it_then_finishes(daemons: Daemons) -> None:
    node0, node1 = two_nodes(daemons)
    run_id = launch(
        node0,
        FAST,
        "training.max_steps=80",
        "nproc_per_node=1",
        "lost_after_s=3",
        "restart.max_attempts=1",
        "restart.backoff_s=0.5",
        "checkpoint.every_steps=10",
        nodes=(node0.address, node1.address),
    )
    wait_for_step(node0, run_id, 15)
    kill_node(node1, run_id, node_rank=1)
    deadline = time.monotonic() + 60
    while "restart waits" not in (status(node0, run_id).run.reason or ""):
        assert time.monotonic() < deadline, status(node0, run_id).run
        time.sleep(0.3)
    waiting = status(node0, run_id)
    assert waiting.run.state is RunState.PENDING
    assert waiting.run.attempt == 1  # nothing started while node 1 is silent
    restart(daemons, node1)
    s0 = wait_for(node0, run_id, {"succeeded", "failed", "stopped"}, timeout=240)
    assert s0.run.state is RunState.SUCCEEDED, s0.run.reason
    assert (s0.run.attempt, s0.run.restarts) == (2, 1)
    assert s0.attempts[1].resume_from is not None
    nothing_left(run_id)


# --------------------------------------------------------------------------- shared host


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, **env},
        start_new_session=True,
    )


def test_cleanup_on_a_shared_host_touches_only_its_own_nodes_processes(tmp_path: Path) -> None:
    """Two daemons on one box run node 0 and node 1 of the same run and attempt: node 1's
    leftover scan and dead-shim handling must never kill node 0's ranks."""
    tags = {"GPUD_RUN_ID": "shared-abc123", "GPUD_ATTEMPT": "1"}
    dirs = {rank: tmp_path / f"state-n{rank}" / "runs" / "shared-abc123" for rank in (0, 1)}
    mine = _sleeper({**tags, "GPUD_NODE_RANK": "1", "GPUD_RUN_DIR": str(dirs[1])})
    theirs = _sleeper({**tags, "GPUD_NODE_RANK": "0", "GPUD_RUN_DIR": str(dirs[0])})
    try:
        deadline = time.monotonic() + 10
        while len(procs.tagged("shared-abc123")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        record = AttemptRecord(
            run_id="shared-abc123",
            attempt=1,
            node_rank=1,
            state=RunState.RUNNING,
            state_since=0.0,
            master_addr="127.0.0.1",
            master_port=29500,
            nproc=1,
            attempt_dir=str(dirs[1] / "attempt-1"),
            shim_pid=None,  # the shim is gone: kill -9, or a reboot of the daemon's view
        )
        part = Part(record, time.time)
        assert part.leftovers() == [mine.pid]
        outcome = part.outcome()
        assert outcome is not None and outcome.state is RunState.FAILED
        assert outcome.exit.leftovers_killed == [mine.pid]
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert theirs.poll() is None, "node 1 killed a process of node 0"
    finally:
        for proc in (mine, theirs):
            proc.kill()
            proc.wait()
