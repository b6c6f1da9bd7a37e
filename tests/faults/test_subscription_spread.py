"""One viewer key spreading subscriptions over hundreds of connections (issue 25 §1).

A real daemon, a real viewer key, and `tests/support/sub_spread.py` in a process of its
own: 340 SUB connections with 60 distinct 60-byte subscriptions each, every connection
under the per-connection caps, held for a while and then closed at once. Throughout, a
separate client asks `node.info` every 20 ms. The control plane answers promptly, the
daemon's RSS comes back, a well-behaved viewer still gets its telemetry, the cut
connections do not reconnect in a loop, and the daemon says what it refused in a few
lines, not one per reconnect.

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

from gpud.keygate import BURST
from gpud.protocol import Role
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

pytestmark = pytest.mark.faults

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
    # The target is 100 ms (met on a quiet machine, see the README's reliability table);
    # two cores shared with the spreader's 340 CURVE handshakes and other work give slack.
    assert prober.worst_s < 1.0, prober.summary()
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
