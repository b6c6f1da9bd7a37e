"""Clients that misbehave on purpose: raw CURVE sockets with a chosen key, and RSS checks.

Misbehaving clients are real zmq sockets speaking to a real daemon; nothing of gpud is
used on their side beyond the keys, so they can do what no gpud client would.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import zmq

from gpud.node.statedir import AUDIT_LOG
from gpud.security.audit import KEEP, REFUSED_LOG
from gpud.security.auth import authorize
from gpud.security.keys import KeyPair
from gpud.security.roles import Role
from gpud.wire.protocol import hw_topic
from tests.support.daemons import RunningDaemon

MB = 2**20
#: How far the daemon's RSS may stay above its baseline once a case is over.
RSS_SLACK = 20 * MB


def new_keys() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public=public, secret=secret)


def authorized_keys(daemon: RunningDaemon, role: Role, name: str) -> KeyPair:
    keys = new_keys()
    authorize(daemon.state_dir, keys.public_text, role, name)
    return keys


def curve_socket(
    ctx: zmq.Context[zmq.Socket[bytes]], kind: int, daemon: RunningDaemon, keys: KeyPair
) -> zmq.Socket[bytes]:
    """A socket of `kind` with `keys`, connected to the daemon's control or events socket."""
    server_key = daemon.target().server_key
    assert server_key is not None and keys.secret is not None
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.sndhwm = 0  # the adversary never blocks itself
    sock.curve_serverkey = server_key
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret
    control = kind in (zmq.DEALER, zmq.REQ)
    sock.connect(f"tcp://{daemon.address}" if control else daemon.events)
    return sock


def viewer_gets_telemetry(daemon: RunningDaemon) -> None:
    """A well-behaved viewer, with a key of its own, gets the node's snapshots."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    keys = authorized_keys(daemon, Role.VIEWER, "good-viewer")
    sub = curve_socket(ctx, zmq.SUB, daemon, keys)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, hw_topic(daemon.node).encode())
        assert sub.poll(10_000), "a well-behaved viewer got no telemetry"
        assert sub.recv_multipart()[0].decode() == hw_topic(daemon.node)
    finally:
        sub.close()
        ctx.term()


def rss(daemon: RunningDaemon) -> int:
    return int(psutil.Process(daemon.proc.pid).memory_info().rss)


def settle_rss(daemon: RunningDaemon, baseline: int, timeout_s: float = 15.0) -> int:
    """Wait for the daemon's RSS to come back within RSS_SLACK of `baseline`; returns it."""
    deadline = time.monotonic() + timeout_s
    now = rss(daemon)
    while now > baseline + RSS_SLACK and time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss(daemon)
    assert now <= baseline + RSS_SLACK, (
        f"daemon RSS stayed {(now - baseline) / MB:.1f} MB above its baseline "
        f"({baseline / MB:.1f} MB)"
    )
    return now


def log_lines_with(daemon: RunningDaemon, text: str) -> list[str]:
    return [line for line in daemon.log().splitlines() if text in line]


def audit_records(state_dir: Path) -> list[str]:
    """The audit log's lines: accepted actions and key changes, then the refusals (a file
    of their own), each file's rotations oldest first."""
    lines: list[str] = []
    for name in (AUDIT_LOG, REFUSED_LOG):
        for n in range(KEEP, -1, -1):
            path = state_dir / (f"{name}.{n}" if n else name)
            if path.exists():
                lines += path.read_text().splitlines()
    return lines


def thread_cpu(daemon: RunningDaemon) -> dict[str, float]:
    """CPU seconds of each of the daemon's threads, by name (threads of one name summed,
    the loop's own thread as "loop"): which thread a case kept busy."""
    out: dict[str, float] = {}
    pid = daemon.proc.pid
    for thread in psutil.Process(pid).threads():
        try:
            name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            continue
        if thread.id == pid:
            name = "loop"
        out[name] = out.get(name, 0.0) + thread.user_time + thread.system_time
    return out


def cpu_used(before: dict[str, float], after: dict[str, float]) -> str:
    """What each thread spent between two `thread_cpu` readings, busiest first."""
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    busy = sorted(((s, n) for n, s in spent.items() if s >= 0.01), reverse=True)
    return ", ".join(f"{n} {s:.2f} s" for s, n in busy) or "nothing"
