"""A stop that misses a node is asked again until the part has ended (issue 26 §1).

Two daemons on one host, a 2-node × 2-rank torchrun run of a script with no collectives
after `init_process_group` (so nothing makes the peers die by themselves, as NCCL ranks
waiting out a long timeout would not), `lost_after_s: 60`. Node 1's daemon is frozen
(SIGSTOP) and a rank on node 0 is killed: node 0 fails its part and asks node 1 to stop
its part, which times out. Node 1's daemon is woken 16 s later, well inside the lost
timeout: node 0 asks again, node 1 stops its ranks, and the run ends `failed` with the
SIGKILL as its cause, nothing left. With a manual stop during the freeze, the run ends
the same way: `failed`, and its reason says why (it read `stopped` with the SIGKILL
failure as its reason).

What node 0 asked lives in its memory. When node 0's daemon restarts while node 1 is
frozen, nobody is left to ask again: node 1, once it runs, asks node 0 where the run
stands (`run.gang.status`) and stops its part itself. In both tests node 0's first stop
may already be in node 1's socket buffer: then that is read once node 1 runs, and stops
the part as well.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from tests.faults.test_runs_end import restart
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, nothing_left, ranks_of, script_spec, status, wait_for
from tests.support.waiting import until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SLEEPER = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined", flush=True)
while True:
    time.sleep(0.5)
"""
#: The same, but its ranks leave their process group once all joined: nothing ties them
#: to node 0's rendezvous store, so only a stop ends them (torchrun's workers otherwise
#: fail by themselves, some seconds after node 0's store is gone: a race with the stop).
DETACHED = SLEEPER.replace(
    'print(f"rank {dist.get_rank()} joined", flush=True)',
    'print(f"rank {dist.get_rank()} joined", flush=True)\nrank = dist.get_rank()\n'
    'dist.barrier()\ndist.destroy_process_group()\nprint(f"rank {rank} left", flush=True)',
)
FROZEN_S = 16.0


def sleeper_on_two_nodes(
    daemons: Callable[..., RunningDaemon], tmp_path: Path, code: str = SLEEPER
) -> tuple[RunningDaemon, RunningDaemon, str]:
    """Two daemons and the sleeper's 2 × 2 ranks on them, all joined."""
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    spec = script_spec(tmp_path, code, name="sleeper", launcher="torchrun", nproc=2)
    run_id = launch(
        node0, "lost_after_s=60", "restart.max_attempts=0", config=spec,
        nodes=(node0.address, node1.address),
    )  # fmt: skip
    until("4 ranks joined", lambda: len(ranks_of(run_id)) == 4, timeout=90)
    # Stopped before every rank is through `init_process_group` (and, detached, out of its
    # group), node 1's ranks fail by themselves once node 0's are gone: wait for the lines.
    done = "left" if "destroy_process_group" in code else "joined"
    until(
        f"every rank {done}",
        lambda: sum(_log(d, run_id).count(f" {done}") for d in (node0, node1)) == 4,
        timeout=60,
    )
    return node0, node1, run_id


def _log(daemon: RunningDaemon, run_id: str) -> str:
    try:
        return (daemon.state_dir / "runs" / run_id / "attempt-1" / "output.log").read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("manual_stop", [False, True], ids=["by-itself", "manual-stop"])
def test_a_part_whose_daemon_missed_the_stop_is_stopped_once_it_answers(
    daemons: Callable[..., RunningDaemon], tmp_path: Path, manual_stop: bool
) -> None:
    node0, node1, run_id = sleeper_on_two_nodes(daemons, tmp_path)
    node1_ranks = [p for r, p in ranks_of(run_id).items() if r >= 2]

    node1.proc.send_signal(signal.SIGSTOP)
    try:
        ranks_of(run_id)[1].send_signal(signal.SIGKILL)
        until(
            "node 0 tried to stop node 1's part and could not",
            lambda: any(
                "could not reach node 1" in e.message for e in status(node0, run_id).events
            ),
            timeout=30,
        )
        if manual_stop:
            stopped = gpuctl("--node", node0.address, "stop", run_id, "--no-wait")
            assert stopped.returncode == 0, stopped.stderr
        time.sleep(FROZEN_S - 4)
        assert all(p.is_running() for p in node1_ranks)  # nothing made them end
        assert status(node0, run_id).run.state is RunState.STOPPING
    finally:
        node1.proc.send_signal(signal.SIGCONT)
    woke = time.monotonic()

    ended = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=30)
    took = time.monotonic() - woke
    print(f"run {ended.run.state.value} {took:.1f}s after node 1's daemon answered again")
    run = ended.run
    assert run.state is RunState.FAILED, run.reason
    assert run.cause is not None and run.cause.kind is CauseKind.SIGNAL, run.cause
    assert "SIGKILL" in (run.reason or "") and run.cause.node_rank == 0, run.reason
    if manual_stop:
        assert "a stop was asked while the other parts were stopping" in (run.reason or "")
    assert [p.state for p in ended.parts] == [RunState.FAILED, RunState.FAILED], ended.parts
    assert status(node1, run_id).run.state is RunState.FAILED
    # Whichever came first stopped it: node 0 asking again, node 1 asking node 0, or node
    # 0's first stop, written to a connection node 1's kernel had accepted before the
    # freeze, read once node 1 runs (then it is node 1's first event after the kill).
    node1_events = [e.message for e in status(node1, run_id).events]
    again = [e.message for e in status(node0, run_id).events if "answers again" in e.message]
    itself = [m for m in node1_events if "node 0 wants" in m]
    late = [m for m in node1_events if m.startswith("stop on n1: rank 1 on node n0: killed")]
    assert again or itself or late, node1_events
    assert took < 15.0, took
    nothing_left(run_id)


def test_a_frozen_node_stops_its_part_itself_when_node_0_restarted_meanwhile(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    node0, node1, run_id = sleeper_on_two_nodes(daemons, tmp_path, DETACHED)
    node1_ranks = [p for r, p in ranks_of(run_id).items() if r >= 2]

    node1.proc.send_signal(signal.SIGSTOP)
    try:
        stopped = gpuctl("--node", node0.address, "stop", run_id, "--no-wait")
        assert stopped.returncode == 0, stopped.stderr
        until(
            "node 0 tried to stop node 1's part and could not",
            lambda: any(
                "could not reach node 1" in e.message for e in status(node0, run_id).events
            ),
            timeout=30,
        )
        assert node0.stop() == 0  # what node 0 asked of node 1 goes with it
        node0 = restart(daemons, node0)
        time.sleep(3)  # node 0 is back and has nobody to ask again
        assert all(p.is_running() for p in node1_ranks)
    finally:
        node1.proc.send_signal(signal.SIGCONT)
    woke = time.monotonic()

    until("node 1's ranks ended", lambda: not any(p.is_running() for p in node1_ranks), 30)
    took = time.monotonic() - woke
    print(f"node 1 stopped its part {took:.1f}s after it ran again")
    # Node 1 asked node 0 where the run stands, or node 0's stop, written to a connection
    # node 1's kernel had accepted before node 0 went, is read once node 1 runs again.
    events = [e.message for e in status(node1, run_id).events]
    asked = [m for m in events if "node 0 wants" in m]
    late = [m for m in events if m.startswith("stop on n1: stop requested")]
    assert (asked and "node 0 has the run stopping" in asked[0]) or late, events
    # Node 0, restarted mid-stop, folds the run's end (it stayed `stopping` for good).
    ended = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=30)
    assert ended.run.state is RunState.STOPPED, ended.run.reason
    assert status(node1, run_id).run.state is RunState.STOPPED
    assert took < 10.0, took
    nothing_left(run_id)
