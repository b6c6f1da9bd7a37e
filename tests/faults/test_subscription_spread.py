"""One viewer key spreading subscriptions over hundreds of connections (issue 25 §1).

A real daemon, a real viewer key, and `tests/support/sub_spread.py` in a process of its
own: 340 SUB connections with 60 distinct 60-byte subscriptions each, every connection
under the per-connection caps, held for a while and then closed at once. Throughout, a
separate client asks `node.info` every 20 ms. The control plane answers promptly, the
daemon's RSS comes back, a well-behaved viewer still gets its telemetry, the cut
connections do not reconnect in a loop, and the daemon says what it refused in a few
lines, not one per reconnect. A last case holds many viewer keys, each within its own
budget, to the socket's total.

Before the events socket had its own thread and per-key budgets, `node.info` went
unanswered for 24-27 s here (libzmq removing each closed connection by walking every
subscription of the socket, on the loop's thread: `bench/xpub_trie.py`), RSS went from
53 to 163 MB and stayed 10 MB up, and the cut connections reconnected about 5 times a
second, each with a WARNING.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import zmq
from zmq.utils.monitor import parse_monitor_message

from gpud.security.keygate import BURST
from gpud.security.keys import KeyPair
from gpud.security.roles import Role
from gpud.wire.protocol import hw_topic
from gpud.wire.publisher import EVENTS_LIMITS
from tests.support.adversary import (
    MB,
    authorized_keys,
    cpu_used,
    log_lines_with,
    rss,
    thread_cpu,
    viewer_gets_telemetry,
)
from tests.support.daemons import RunningDaemon
from tests.support.probe import Prober

# Latencies measured against the machine's load: run alone (quiet: its adversary is light,
# it may run beside another quiet test).
pytestmark = [pytest.mark.faults, pytest.mark.alone, pytest.mark.quiet]

CONNECTIONS = 340
SUBSCRIPTIONS = 60
HOLD_S = 10.0


def _spread(daemon: RunningDaemon, connections: int, subs: int, hold_s: float) -> dict[str, int]:
    keys = authorized_keys(daemon, Role.VIEWER, "spreader")
    server_key = daemon.target().server_key
    assert server_key is not None and keys.secret is not None
    spreader = subprocess.run(
        [sys.executable, "-m", "tests.support.sub_spread", daemon.events, server_key.decode(),
         keys.public.decode(), keys.secret.decode(), str(connections), str(subs), str(hold_s)],
        capture_output=True, text=True, timeout=hold_s + 120,
    )  # fmt: skip
    assert spreader.returncode == 0, spreader.stderr
    counts: dict[str, int] = json.loads(spreader.stdout)
    return counts


def test_a_viewer_spreading_subscriptions_never_stalls_the_control_plane(
    daemon: RunningDaemon,
) -> None:
    viewer_gets_telemetry(daemon)  # warm: sockets and buffers in place
    baseline = rss(daemon)
    peak = baseline
    started = time.monotonic()
    cpu_before = thread_cpu(daemon)
    with Prober(daemon) as prober:
        counts = _spread(daemon, CONNECTIONS, SUBSCRIPTIONS, HOLD_S)
        peak = max(peak, rss(daemon))
        time.sleep(3.0)  # the closes, and whatever the daemon does about them
    cpu = cpu_used(cpu_before, thread_cpu(daemon))
    after = rss(daemon)
    deadline = time.monotonic() + 15
    while after > baseline + 20 * MB and time.monotonic() < deadline:
        time.sleep(0.5)
        after = rss(daemon)
    warnings = log_lines_with(daemon, "WARNING")
    print(
        f"{CONNECTIONS} connections x {SUBSCRIPTIONS} subscriptions: {prober.summary()}, "
        f"longest silence {prober.silence_s * 1000:.0f} ms; spreader {counts}; "
        f"RSS {baseline / MB:.1f} MB before, {peak / MB:.1f} MB at the close, "
        f"{after / MB:.1f} MB after; {len(warnings)} WARNING lines in "
        f"{time.monotonic() - started:.0f} s; daemon CPU by thread: {cpu}"
    )
    assert prober.failed == []
    # The target is 100 ms throughout (the README's reliability table): the 99th
    # percentile holds it; the slowest answer may be one scheduler hiccup on two cores
    # shared with the spreader's 340 CURVE handshakes and other work, never a stall.
    assert prober.percentile(0.99) < 0.1 and prober.worst_s < 1.0, prober.summary()
    assert after <= baseline + 20 * MB
    # The key's first connections got in; once one was cut, the key was refused at the
    # handshake, which ends a libzmq connection for good: no reconnect loop.
    assert counts["handshakes"] <= 2 * BURST, counts
    assert counts["refused"] <= CONNECTIONS + BURST, counts
    assert len(warnings) <= 10, "\n".join(warnings)
    assert any("over the allowance of 8192 bytes per key" in w for w in warnings)
    with daemon.client(timeout_s=5.0) as client:
        assert client.node_info().node == daemon.node
    viewer_gets_telemetry(daemon)
    assert not log_lines_with(daemon, "Traceback"), daemon.log()


def test_a_connection_cut_for_too_many_subscriptions_does_not_reconnect_in_a_loop(
    daemon: RunningDaemon,
) -> None:
    """One SUB socket with 65 subscriptions (the cap is 64): libzmq reconnects it after each
    cut and sends them all again. Before the gate it was cut about 5 times a second, each
    time with a WARNING; now its key is refused at the next handshake, and that ends it."""
    counts = _spread(daemon, 1, 65, 8.0)
    warnings = log_lines_with(daemon, "WARNING")
    print(f"one connection over its cap for 8 s: {counts}; {len(warnings)} WARNING lines")
    assert counts["handshakes"] == 1 and counts["refused"] <= 2, counts
    assert len(warnings) <= 3, "\n".join(warnings)
    assert "over the allowance of 64" in warnings[0]
    viewer_gets_telemetry(daemon)  # another key is not held to the spreader's penalty


# ---------------------------------------------------------------- the socket's total

#: One viewer connection's subscriptions: under the per-connection cap, two of them under
#: the per-key one; the socket's total holds eight such keys and not a ninth connection.
CONN_BYTES = 4000
CONNS_PER_KEY = 2
KEY_BYTES = CONNS_PER_KEY * CONN_BYTES
TOPIC_BYTES = 100
_MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_DISCONNECTED
)


def _topics(tag: str, size: int, first: bytes) -> list[bytes]:
    """`first`, then distinct topics of at most TOPIC_BYTES: `size` bytes in all."""
    out = [first]
    left = size - len(first)
    while left:
        n = left if left <= TOPIC_BYTES else min(TOPIC_BYTES, left - 20)
        out.append(f"pad.{tag}.{len(out):03d}.".encode().ljust(n, b"x"))
        left -= n
    return out


class _Viewer:
    """A real SUB connection with a viewer key and the subscriptions it was given; a
    monitor, started before it connects, sees its handshakes and disconnects."""

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], daemon: RunningDaemon, keys: KeyPair,
        topics: list[bytes],
    ) -> None:  # fmt: skip
        server_key = daemon.target().server_key
        assert server_key is not None and keys.secret is not None
        self.keys = keys
        self.sock = ctx.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.curve_serverkey = server_key
        self.sock.curve_publickey = keys.public
        self.sock.curve_secretkey = keys.secret
        self.monitor = self.sock.get_monitor_socket(_MONITORED)
        self.seen: list[int] = []
        for topic in topics:
            self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(daemon.events)

    def events(self) -> list[int]:
        while self.monitor.poll(0):
            self.seen.append(parse_monitor_message(self.monitor.recv_multipart())["event"])
        return self.seen

    def wait_for(self, event: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while event not in self.events() and time.monotonic() < deadline:
            self.monitor.poll(50)
        return event in self.seen

    def gets_telemetry(self, timeout_s: float) -> bool:
        """Whether a snapshot published from now on arrives (what was queued is dropped)."""
        while self.sock.poll(0):
            self.sock.recv_multipart()
        return bool(self.sock.poll(int(timeout_s * 1000)))

    def close(self) -> None:
        if self.sock.closed:
            return
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


def test_viewers_with_distinct_keys_are_held_to_the_sockets_total(
    daemon: RunningDaemon,
) -> None:
    """Eight viewer keys, each with two connections of 4000 subscribed bytes (under every
    per-connection and per-key cap), fill the events socket's 64 KiB total; a ninth key's
    connection goes over it and is cut (one WARNING that says so), and the key is refused
    at its reconnect. The eight keep their telemetry, a small subscription still fits, a
    key that leaves makes room for another, and node.info is answered throughout."""
    limits = EVENTS_LIMITS
    fitting = limits.total_subscription_bytes // KEY_BYTES
    hw = hw_topic(daemon.node).encode()
    assert limits.subscription_bytes >= CONN_BYTES, "one connection is under its cap"
    assert limits.subscription_bytes_per_key >= KEY_BYTES, "one key is under its cap"
    assert len(_topics("late", CONN_BYTES, hw)) <= limits.subscriptions
    assert fitting >= 2 and limits.total_subscription_bytes - fitting * KEY_BYTES < CONN_BYTES
    viewer_gets_telemetry(daemon)  # warm; its subscription is gone when it closes
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    viewers: list[_Viewer] = []  # the keys under the total, as they are now
    opened: list[_Viewer] = []  # everything, to close
    started = time.monotonic()
    try:
        with Prober(daemon) as prober:
            for k in range(fitting):
                keys = authorized_keys(daemon, Role.VIEWER, f"viewer-{k}")
                viewers += [
                    _Viewer(ctx, daemon, keys, _topics(f"k{k}c{c}", CONN_BYTES, hw))
                    for c in range(CONNS_PER_KEY)
                ]
            opened += viewers
            assert all(v.gets_telemetry(10.0) for v in viewers), "a viewer under the total"
            time.sleep(0.5)  # the rest of their subscriptions reach the guard

            late = _Viewer(
                ctx, daemon, authorized_keys(daemon, Role.VIEWER, "late"),
                _topics("late", CONN_BYTES, hw),
            )  # fmt: skip
            opened.append(late)
            assert late.wait_for(zmq.EVENT_DISCONNECTED, 10.0), late.events()
            assert late.wait_for(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 5.0), late.events()
            assert late.events().count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1, late.events()

            assert all(v.gets_telemetry(5.0) for v in viewers), "a viewer lost its events"
            assert not any(zmq.EVENT_DISCONNECTED in v.events() for v in viewers)
            viewer_gets_telemetry(daemon)  # a few bytes still fit under the total

            # A bound, not a lockout: a key that leaves makes room for another one.
            for v in viewers[:CONNS_PER_KEY]:
                v.close()
            del viewers[:CONNS_PER_KEY]
            time.sleep(0.5)  # the daemon sees the closes
            newcomer = _Viewer(
                ctx, daemon, authorized_keys(daemon, Role.VIEWER, "newcomer"),
                _topics("new", CONN_BYTES, hw),
            )  # fmt: skip
            opened.append(newcomer)
            assert newcomer.gets_telemetry(10.0), newcomer.events()
            assert zmq.EVENT_DISCONNECTED not in newcomer.events()
        warnings = log_lines_with(daemon, "WARNING")
        print(
            f"{fitting} keys x {CONNS_PER_KEY} x {CONN_BYTES} bytes, then one more connection: "
            f"{prober.summary()}; {len(warnings)} WARNING lines in "
            f"{time.monotonic() - started:.0f} s"
        )
        assert prober.failed == []
        assert prober.percentile(0.99) < 0.1 and prober.worst_s < 1.0, prober.summary()
        full = [w for w in warnings if "subscriptions are full" in w]
        assert len(full) == 1, "\n".join(warnings)
        assert late.keys.public_text[:8] in full[0] and "refused here for" in full[0]
        # The cut, and the refused reconnect: both about the late key, none about the eight.
        assert all(late.keys.public_text[:8] in w for w in warnings), "\n".join(warnings)
    finally:
        for v in opened:
            v.close()
        ctx.term()
