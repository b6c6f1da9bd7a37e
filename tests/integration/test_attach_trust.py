"""The attach socket's trust model (issue 12; docs/DESIGN.md "Runs gpud did not start"):
another local user cannot report into someone else's run.

A real daemon (root, with --attach) and two real local users: alice attaches her run and
reports through the shared ingest with her token; mallory, on the same box, tries every
way in — attaching to alice's run id, sending on the shared ingest with no token, a
made-up token, and her own token, claiming a Slurm job she is not in, and the daemon's
private ingest — and none of it lands. Her own run attaches fine: the refusals are about
who she is, not about reaching the socket.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from gpud.attach.client import AttachLink
from gpud.attach.wire import AttachRequest
from gpud.node.statedir import StateDir
from gpud.wire.client import Client
from gpud.wire.protocol import RUN_METRICS, RUN_STATUS
from gpud.wire.run_messages import MetricsRequest, RunRef
from tests.support import users
from tests.support.daemons import RunningDaemon

pytestmark = pytest.mark.skipif(users.missing() is not None, reason=str(users.missing()))
Daemons = Callable[..., RunningDaemon]
RUN = "alice-run-1"


@pytest.fixture
def box(daemons: Daemons) -> Iterator[tuple[RunningDaemon, Path]]:
    """A daemon whose attach dir other users can reach (tmp_path is root's alone)."""
    attach = Path(tempfile.mkdtemp(prefix="gpud-attach-"))
    os.chmod(attach, 0o755)
    yield daemons(extra=("--attach", str(attach / "sock"))), attach / "sock"


def request(run_id: str, token: str, **changes: Any) -> AttachRequest:
    fields: dict[str, Any] = {
        "run_id": run_id, "name": run_id.rsplit("-", 1)[0], "attempt": 1, "node_rank": 0,
        "nnodes": 1, "nproc": 1, "host": socket.gethostname(), "scheduler": "manual",
        "run_dir": f"/tmp/{run_id}", "attempt_dir": f"/tmp/{run_id}/attempt-1/node-0",
        "created_at": time.time(), "spec": {"name": "x", "script": "x.py"}, "token": token,
    }  # fmt: skip
    return AttachRequest(**{**fields, **changes})


def attach(sock: Path, req: AttachRequest) -> str:
    """Attach and close at once; "" when accepted, else the daemon's refusal."""
    link, why = AttachLink.open(sock / "attach.sock", req)
    if link is not None:
        link.close()
    return why


def push(endpoint: str, frames: list[list[bytes]]) -> None:
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(endpoint)
    for message in frames:
        out.send_multipart(message)
    out.close()
    ctx.term()


def metrics(run: str, step: int, loss: float) -> bytes:
    body = {"run": run, "attempt": 1, "time": time.time(), "step": step, "values": {"loss": loss}}
    return json.dumps(body).encode()


def losses(daemon: RunningDaemon) -> dict[int, float]:
    with Client(daemon.target(), timeout_s=10) as client:
        reply = client.call(RUN_METRICS, MetricsRequest(run=RUN, name="loss"))
    return {row.step: row.values["loss"] for row in reply.rows}


def test_another_local_user_cannot_report_into_someone_elses_run(
    box: tuple[RunningDaemon, Path],
) -> None:
    daemon, sock = box
    alice, mallory = users.local_user("gpud-alice"), users.local_user("gpud-mallory")
    token = secrets.token_hex(16)
    shared = f"ipc://{sock / 'ingest.sock'}"
    private = StateDir(daemon.state_dir).ipc_endpoint("ingest")

    def alice_reports(stop: Callable[[], None]) -> str:
        link, why = AttachLink.open(sock / "attach.sock", request(RUN, token))
        if link is None:
            return why
        push(shared, [[b"metrics", metrics(RUN, s, 1.0 / (s + 1)), token.encode()]
                      for s in range(5)])  # fmt: skip
        stop()  # hold the part "running" while mallory tries
        link.close()
        return ""

    holder = users.AsUser(alice, alice_reports)
    deadline = time.monotonic() + 20
    while len(losses(daemon) if _known(daemon) else {}) < 5:
        assert time.monotonic() < deadline, "alice's own metrics never arrived"
        time.sleep(0.2)
    with Client(daemon.target()) as client:
        status = client.call(RUN_STATUS, RunRef(run=RUN))
    assert status.run.attached is not None and status.run.attached.user == "gpud-alice"
    assert status.run.attached.uid == alice.uid

    def mallory_tries() -> dict[str, str]:
        own = secrets.token_hex(16)
        tried = {
            "attach alice's run": attach(sock, request(RUN, own)),
            "attach alice's run as a Slurm job": attach(
                sock, request(RUN, own, scheduler="slurm", job_id="1")
            ),
            "a Slurm job she is not in": attach(
                sock, request("mallory-job-1", own, scheduler="slurm", job_id="4242")
            ),
            "her own run": attach(sock, request("mallory-run-1", own)),
        }
        push(shared, [
            [b"metrics", metrics(RUN, 100, 666.0)],  # no token
            [b"metrics", metrics(RUN, 101, 666.0), secrets.token_hex(16).encode()],
            [b"metrics", metrics(RUN, 102, 666.0), own.encode()],  # her own run's token
            [b"metrics", metrics(RUN, 103, 666.0), b"0" * 32],
        ])  # fmt: skip
        # The daemon's own ingest (no token needed) is in its private dir: not hers to reach.
        push(private, [[b"metrics", metrics(RUN, 104, 666.0)]])
        return tried

    tried = users.run_as(mallory, mallory_tries)
    assert tried["her own run"] == "", tried  # the socket works for her...
    refused = tried["attach alice's run"]
    assert "belongs to gpud-alice" in refused and f"uid {mallory.uid} may not" in refused
    assert "belongs to gpud-alice" in tried["attach alice's run as a Slurm job"] or (
        "not in Slurm job 1" in tried["attach alice's run as a Slurm job"]
    )
    assert "is not in Slurm job 4242" in tried["a Slurm job she is not in"]
    time.sleep(1.5)  # anything that was going to land has landed
    assert losses(daemon) == {s: 1.0 / (s + 1) for s in range(5)}  # alice's, and only hers
    assert "no valid token for run 'alice-run-1'" in daemon.log()
    holder.stop()
    assert holder.result() == ""
    with Client(daemon.target()) as client:
        status = client.call(RUN_STATUS, RunRef(run="mallory-run-1"))
    assert status.run.attached is not None and status.run.attached.user == "gpud-mallory"


def _known(daemon: RunningDaemon) -> bool:
    with Client(daemon.target()) as client:
        return any(r.id == RUN for r in client.runs().runs)
