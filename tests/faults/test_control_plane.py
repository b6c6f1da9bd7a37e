"""The control socket under attack and under load: it keeps answering, promptly, and flat.

Every case runs against a real daemon over real CurveZMQ sockets, with a client that does
what no gpud client would; each memory case measures the daemon's RSS before and after.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from gpud.security.keys import load_client_keypair
from gpud.security.roles import Role
from gpud.wire.client import RequestFailed
from gpud.wire.envelope import MAX_FRAME_BYTES
from tests.support.adversary import (
    MB,
    audit_records,
    authorized_keys,
    curve_socket,
    log_lines_with,
    rss,
    settle_rss,
)
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import CPU_DDP, FAST

pytestmark = pytest.mark.faults


def _request(request_id: str, type_: str, body: dict[str, object]) -> bytes:
    return json.dumps({"v": 1, "id": request_id, "type": type_, "body": body}).encode()


def _reply(sock: zmq.Socket[bytes], timeout_s: float = 10.0) -> dict[str, object]:
    assert sock.poll(int(timeout_s * 1000)), "no reply"
    reply: dict[str, object] = json.loads(sock.recv())
    return reply


def _error(reply: dict[str, object]) -> dict[str, str]:
    assert reply["ok"] is False, reply
    error = reply["error"]
    assert isinstance(error, dict)
    return error


@pytest.mark.alone  # a reply's latency, measured against the machine's load
def test_concurrent_stops_and_resumes_never_leave_the_loop_asleep(daemon: RunningDaemon) -> None:
    """run.stop and run.resume reply from a task; a reply sent from a task must not swallow
    the wake-up the serve loop waits on (it did: requests then sat for tens of seconds)."""
    keys = load_client_keypair()
    assert keys is not None
    ctx = zmq.Context()
    try:
        socks = [curve_socket(ctx, zmq.DEALER, daemon, keys) for _ in range(4)]
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        sent: dict[str, float] = {}
        in_flight = dict.fromkeys(socks, 0)
        ids = itertools.count()
        worst = 0.0
        answered = 0
        end = time.monotonic() + 20.0
        while time.monotonic() < end:
            for sock in socks:
                while in_flight[sock] < 64:  # a few hundred pipelined requests in all
                    i = next(ids)
                    kind = "run.stop" if i % 2 else "run.resume"
                    sock.send(_request(str(i), kind, {"run": f"no-such-run-{i % 5}"}))
                    sent[str(i)] = time.monotonic()
                    in_flight[sock] += 1
            for sock, _ in poller.poll(100):
                while sock.poll(0):
                    reply = json.loads(sock.recv())
                    in_flight[sock] -= 1
                    answered += 1
                    assert _error(reply)["code"] == "not_found"
                    worst = max(worst, time.monotonic() - sent.pop(str(reply["id"])))
            oldest = min(sent.values(), default=time.monotonic())
            assert time.monotonic() - oldest < 5.0, f"a request waits; {answered} answered"
        deadline = time.monotonic() + 5
        while sent and time.monotonic() < deadline:
            for sock, _ in poller.poll(100):
                while sock.poll(0):
                    reply = json.loads(sock.recv())
                    worst = max(worst, time.monotonic() - sent.pop(str(reply["id"])))
    finally:
        ctx.destroy(linger=0)
    assert not sent, f"{len(sent)} requests were never answered"
    assert answered > 2000
    assert worst < 1.0, f"a control reply took {worst:.3f}s under concurrent stop/resume"


def test_a_huge_multipart_message_is_cut_off_and_the_memory_comes_back(
    daemon: RunningDaemon,
) -> None:
    """400 parts of 2 MB, each under the 4 MB frame limit: 800 MB as one message."""
    viewer = authorized_keys(daemon, Role.VIEWER, "flooder")
    client = daemon.client()
    for _ in range(50):
        client.node_hw()  # warm up the daemon's caches and pools before the baseline
    baseline = rss(daemon)
    part = b"x" * (2 * MB)
    assert len(part) < MAX_FRAME_BYTES
    ctx = zmq.Context()
    try:
        sock = curve_socket(ctx, zmq.DEALER, daemon, viewer)
        for _ in range(399):
            sock.send(part, zmq.SNDMORE, copy=False)
        sock.send(part, copy=False)
        deadline = time.monotonic() + 60
        while not log_lines_with(daemon, "control socket: cut the connection"):
            assert time.monotonic() < deadline, "the multipart flood was never cut off"
            time.sleep(0.1)
        peak = rss(daemon)
    finally:
        ctx.destroy(linger=0)
    assert "in flight in one message" in log_lines_with(daemon, "cut the connection")[0]
    settle_rss(daemon, baseline)
    assert client.node_info().node == "node0"
    print(f"multipart flood: RSS {baseline / MB:.0f} MB → peak {peak / MB:.0f} MB → back")


def test_a_revoked_operator_loses_its_rights_on_its_open_connection(
    daemon: RunningDaemon,
) -> None:
    keys = authorized_keys(daemon, Role.OPERATOR, "mallory")
    client = daemon.client(keys=keys)
    assert client.ack_events().acknowledged == 0  # an operator action, accepted
    revoke = gpuctl("keys", "revoke", keys.public_text, "--state-dir", str(daemon.state_dir))
    assert revoke.returncode == 0, revoke.stderr
    revoked_at = time.monotonic()
    allowed = 1  # acks the daemon accepted: the first, and any before it saw the revoke
    while True:
        try:
            client.ack_events()
        except RequestFailed as exc:
            assert exc.code == "forbidden" and "not authorized" in exc.message
            break
        allowed += 1
        assert time.monotonic() - revoked_at < 2.0, "still an operator 2 s after the revoke"
        time.sleep(0.05)
    with pytest.raises(RequestFailed, match="not authorized"):
        client.node_info()  # nothing at all, not even reads
    accepted = [json.loads(r) for r in audit_records(daemon.state_dir)]
    assert [r["ok"] for r in accepted if r["caller"] == "mallory"] == [True] * allowed


def test_a_downgraded_operator_is_a_viewer_within_two_seconds(daemon: RunningDaemon) -> None:
    keys = authorized_keys(daemon, Role.OPERATOR, "oscar")
    client = daemon.client(keys=keys)
    assert client.node_info().role is Role.OPERATOR
    result = gpuctl(
        "keys",
        "authorize",
        keys.public_text,
        "--role",
        "viewer",
        "--name",
        "oscar",
        "--state-dir",
        str(daemon.state_dir),
    )
    assert result.returncode == 0, result.stderr
    changed_at = time.monotonic()
    while client.node_info().role is not Role.VIEWER:
        assert time.monotonic() - changed_at < 2.0
        time.sleep(0.05)
    with pytest.raises(RequestFailed, match="needs the operator role"):
        client.ack_events()


def test_a_revoked_viewer_stops_receiving_events(daemon: RunningDaemon) -> None:
    viewer = authorized_keys(daemon, Role.VIEWER, "valerie")
    ctx = zmq.Context()
    try:
        sub = curve_socket(ctx, zmq.SUB, daemon, viewer)
        sub.setsockopt(zmq.SUBSCRIBE, b"hw.")
        assert sub.poll(5000), "no events before the revoke"
        revoke = gpuctl("keys", "revoke", viewer.public_text, "--state-dir", str(daemon.state_dir))
        assert revoke.returncode == 0
        time.sleep(2.0)
        while sub.poll(0):
            sub.recv_multipart()  # what was queued before the cut
        assert sub.poll(1500) == 0, "a revoked viewer still receives telemetry"
    finally:
        ctx.destroy(linger=0)
    assert log_lines_with(daemon, "its key is no longer authorized")


def test_a_regex_nested_too_deeply_is_an_invalid_body_in_one_line(daemon: RunningDaemon) -> None:
    """10,000 characters of nesting: refused by its length now (RE2 takes 1000 levels)."""
    keys = load_client_keypair()
    assert keys is not None
    spec = {
        "name": "nested",
        "script": "x.py",
        "workdir": "/tmp",
        "metrics": [{"pattern": "(" * 5000 + "?P<loss>x" + ")" * 5000}],
    }
    ctx = zmq.Context()
    try:
        sock = curve_socket(ctx, zmq.DEALER, daemon, keys)
        nodes = [{"control": f"tcp://{daemon.address}"}]
        sock.send(_request("r1", "run.launch", {"spec": spec, "nodes": nodes}))
        error = _error(_reply(sock))
    finally:
        ctx.destroy(linger=0)
    assert error["code"] == "invalid_body"
    assert "metrics.0.pattern" in error["message"] and "2000 characters" in error["message"]
    assert "\n" not in error["message"] and len(error["message"]) < 300
    assert "Traceback" not in daemon.log()
    assert daemon.client().node_info().node == "node0"


def test_relative_paths_over_the_wire_are_refused(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    home = tmp_path / "daemon-cwd"
    home.mkdir()
    daemon = daemons(cwd=home)
    keys = load_client_keypair()
    assert keys is not None
    nodes = [{"control": f"tcp://{daemon.address}"}]
    cases = {
        "workdir": {"name": "rel", "script": "x.py", "workdir": "some/dir"},
        "checkpoint.dir": {
            "name": "rel",
            "script": "x.py",
            "workdir": str(tmp_path),
            "checkpoint": {"dir": "ckpt"},
        },
    }
    ctx = zmq.Context()
    try:
        sock = curve_socket(ctx, zmq.DEALER, daemon, keys)
        for where, spec in cases.items():
            sock.send(_request(where, "run.launch", {"spec": spec, "nodes": nodes}))
            error = _error(_reply(sock))
            assert error["code"] == "invalid_body"
            assert f"{where}: " in error["message"] and "relative" in error["message"]
    finally:
        ctx.destroy(linger=0)
    assert list(home.iterdir()) == [], "the daemon created a directory from a relative path"
    assert daemon.client().runs().runs == []


def test_gpuctl_resolves_a_relative_checkpoint_dir_before_sending(daemon: RunningDaemon) -> None:
    result = gpuctl(
        "--node",
        daemon.address,
        "--json",
        "launch",
        str(CPU_DDP),
        "--dry-run",
        "--set",
        FAST,
        "--set",
        "checkpoint.dir=my-ckpts",
    )
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["nodes"][0]["env"]
    workdir = CPU_DDP.resolve().parents[2]  # the example's workdir is ../..
    assert env["GPUD_CHECKPOINT_DIR"] == str(workdir / "my-ckpts")
