"""Who may attach what, and how an attached run moves: `AttachedRuns` over a real run book
and store (the socket and the kernel's peer credentials are the integration tests')."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from gpud.attach.wire import AttachRequest, CoordinatorUpdate, EndReport, NodesUpdate
from gpud.model.run import RunRecord, RunState
from gpud.model.trainer_messages import HeartbeatMessage
from gpud.node.store import Store
from gpud.runs.lifecycle.attached import REATTACH_S, AttachConfig, AttachedRuns, Peer
from gpud.runs.state.book import RunBook
from gpud.runs.state.part import Part
from gpud.security.auth import PeerKeys
from gpud.wire.run_messages import NodeRefIn

ALICE = Peer(pid=os.getpid(), uid=1001, gid=1001)
MALLORY = Peer(pid=os.getpid(), uid=1002, gid=1002)
KEY = "k" * 40


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: Path) -> tuple[AttachedRuns, RunBook, PeerKeys, Clock]:
    clock = Clock()
    book = RunBook("n1", Store(tmp_path / "state.db"), lambda topic, m: None, clock, strict=True)
    keys = PeerKeys()
    jobs = {os.getpid(): "77"}  # the Slurm job each pid is in, as the daemon would read it
    config = AttachConfig(
        control="tcp://n1:7711", ingest="ipc:///run/gpud/ingest.sock",
        job_of=lambda pid: jobs.get(pid, ""), user_of={1001: "alice"}.get,
        trusted_uids=frozenset({0}),
    )  # fmt: skip
    return AttachedRuns(book, keys, node="n1", server_key=KEY, config=config), book, keys, clock


def request(**changes: Any) -> AttachRequest:
    fields: dict[str, Any] = {
        "run_id": "ddp-abc123", "name": "ddp", "attempt": 1, "node_rank": 0, "nnodes": 2,
        "nproc": 2, "host": "n1", "scheduler": "slurm", "job_id": "77",
        "run_dir": "/shared/ddp-abc123", "attempt_dir": "/shared/ddp-abc123/attempt-1/node-0",
        "created_at": 1_799_999_000.0, "spec": {"name": "ddp", "script": "x.py"},
        "token": "a" * 32,
    }  # fmt: skip
    return AttachRequest(**{**fields, **changes})


def beat(attempt: int = 1, run: str = "ddp-abc123") -> HeartbeatMessage:
    return HeartbeatMessage(run=run, attempt=attempt, time=0.0, rank=0, local_rank=0,
                            world_size=4, phase_since=0.0, host="n1", pid=1)  # fmt: skip


def test_a_slurm_part_attaches_as_a_running_run_of_its_user(setup: Any) -> None:
    attached, book, _, _ = setup
    reply = attached.attach(request(), ALICE)
    assert reply.ok and reply.ingest == "ipc:///run/gpud/ingest.sock"
    assert (reply.node, reply.control, reply.server_key) == ("n1", "tcp://n1:7711", KEY)
    run = book.get("ddp-abc123")
    assert run is not None and run.state is RunState.RUNNING
    assert run.attached is not None and run.attached.job_id == "77"
    assert (run.attached.uid, run.attached.user) == (1001, "alice")
    assert [n.control for n in run.nodes] == ["tcp://n1:7711", ""]  # node 1: not known yet
    part = book.part("ddp-abc123")
    assert part is not None and part.external and part.record.nproc == 2
    assert attached.authorize("a" * 32, beat())
    assert not attached.authorize("b" * 32, beat())
    assert not attached.authorize("a" * 32, beat(attempt=2))  # a token is for one attempt
    assert not attached.authorize("a" * 32, beat(run="other-run"))


@pytest.mark.parametrize(
    ("peer", "changes", "refusal"),
    [
        (MALLORY, {}, "belongs to alice (1001); uid 1002 may not attach to it"),
        (ALICE, {"job_id": "78"}, "is not in Slurm job 78 (it is in Slurm job 77)"),
        (ALICE, {"job_id": None}, "a Slurm part must name its job_id"),
        (ALICE, {"node_rank": 1}, "node 0 of run ddp-abc123 is attached here already"),
    ],
)
def test_what_is_refused(setup: Any, peer: Peer, changes: dict[str, Any], refusal: str) -> None:
    attached, _, _, _ = setup
    assert attached.attach(request(), ALICE).ok
    reply = attached.attach(request(**changes, token="c" * 32), peer)
    assert not reply.ok and reply.error is not None
    assert refusal in reply.error.message, reply.error.message
    assert not attached.authorize("c" * 32, beat())  # a refused attach gets no token


def test_root_may_attach_anything_but_a_run_gpud_launched_is_nobodys(setup: Any) -> None:
    attached, book, _, clock = setup
    assert attached.attach(request(), ALICE).ok
    again = attached.attach(request(token="d" * 32), Peer(os.getpid(), 0, 0))
    assert again.ok  # root (and the daemon's user) can read any process's token anyway
    book.add(
        RunRecord(id="ours-1", name="ours", created_at=clock(), spec={}, nodes=[],
                  node_rank=0, state=RunState.RUNNING, state_since=clock(),
                  run_dir="/x", checkpoint_dir="/x/c")
    )  # fmt: skip
    reply = attached.attach(request(run_id="ours-1"), ALICE)
    assert reply.error is not None and "was launched by gpud here" in reply.error.message


def test_a_requeue_attaches_the_next_attempt_and_an_older_one_is_refused(setup: Any) -> None:
    attached, book, _, _ = setup
    attached.attach(request(), ALICE)
    attached.ended("ddp-abc123", 1, EndReport(state=RunState.STOPPED, reason="time limit"))
    run = book.get("ddp-abc123")
    assert run is not None and run.state is RunState.STOPPED
    assert attached.attach(request(attempt=2, token="e" * 32), ALICE).ok
    run = book.get("ddp-abc123")
    assert run is not None and (run.state, run.attempt) == (RunState.RUNNING, 2)
    assert attached.authorize("e" * 32, beat(attempt=2))
    assert not attached.authorize("a" * 32, beat(attempt=1))  # the old attempt's token
    old = attached.attach(request(attempt=1, token="f" * 32), ALICE)
    assert old.error is not None and "older than its attempt 2" in old.error.message
    # Attempt 3 while attempt 2 still runs (its end report never came): it moves on.
    assert attached.attach(request(attempt=3, token="1" * 32), ALICE).ok
    run = book.get("ddp-abc123")
    assert run is not None and (run.state, run.attempt) == (RunState.RUNNING, 3)


def test_the_end_report_or_its_absence_ends_the_run(setup: Any) -> None:
    attached, book, _, _ = setup
    attached.attach(request(), ALICE)
    attached.ended("ddp-abc123", 1, None)
    run = book.get("ddp-abc123")
    assert run is not None and run.state is RunState.STOPPED
    assert "ended without a report" in (run.reason or "")
    assert not attached.authorize("a" * 32, beat())  # no token outlives its part
    again = attached.attach(request(), ALICE)  # the same attempt cannot come back
    assert again.error is not None and "already ended" in again.error.message


def test_nodes_and_coordinator_updates(setup: Any) -> None:
    attached, book, keys, _ = setup
    attached.attach(request(), ALICE)
    other = NodeRefIn(control="tcp://n2:7711", server_key="s" * 40, name="n2")
    attached.update("ddp-abc123", 1, NodesUpdate(nodes=[None, other]))
    run = book.get("ddp-abc123")
    assert run is not None and [n.control for n in run.nodes] == ["tcp://n1:7711", "tcp://n2:7711"]
    # Node 1 of another run, here: its node 0's daemon may then read it as a peer.
    attached.attach(request(run_id="ddp-def456", node_rank=1, token="2" * 32), ALICE)
    coordinator = NodeRefIn(control="tcp://n0:7711", server_key="c" * 40, name="n0")
    attached.update("ddp-def456", 1, CoordinatorUpdate(coordinator=coordinator))
    assert keys.runs_of("c" * 40) == frozenset({"ddp-def456"})
    run = book.get("ddp-def456")
    assert run is not None and run.coordinator is not None
    assert run.coordinator.control == "tcp://n0:7711"


def test_after_a_daemon_restart_a_part_that_does_not_attach_again_is_given_up(
    setup: Any,
) -> None:
    attached, book, _, clock = setup
    attached.attach(request(), ALICE)
    part = book.part("ddp-abc123")
    assert part is not None
    fresh = Part(part.record, clock)  # what the next daemon reads back from its store
    attached.adopt(fresh, clock())
    assert fresh.external
    clock.now += REATTACH_S - 1
    attached.tick(clock())
    run = book.get("ddp-abc123")
    assert run is not None and run.state is RunState.RUNNING
    clock.now += 2
    attached.tick(clock())
    run = book.get("ddp-abc123")
    assert run is not None and run.state is RunState.STOPPED


def test_a_token_is_compared_whole(setup: Any) -> None:
    attached, _, _, _ = setup
    token = secrets.token_hex(16)
    attached.attach(request(token=token), ALICE)
    assert attached.authorize(token, beat())
    assert not attached.authorize(token[:-1] + ("0" if token[-1] != "0" else "1"), beat())
    assert not attached.authorize(token + "00", beat())


def test_a_pod_or_a_command_run_again_is_the_next_attempt_a_slurm_job_is_not(
    setup: Any,
) -> None:
    attached, book, _, _ = setup
    manual = {"scheduler": "manual", "job_id": None, "run_id": "mine-1"}
    attached.attach(request(**manual), ALICE)
    attached.ended("mine-1", 1, EndReport(state=RunState.SUCCEEDED, reason="exit 0"))
    reply = attached.attach(request(**manual, token="3" * 32), ALICE)
    assert reply.ok and reply.attempt == 2
    part = book.part("mine-1")
    assert part is not None and part.record.attempt_dir.endswith("/attempt-2/node-0")
    assert attached.authorize("3" * 32, beat(attempt=2, run="mine-1"))
