"""The events socket under attack: a viewer key must not be able to grow the daemon.

Every case is a real CURVE client with a real viewer key doing what no gputop would —
huge subscriptions, floods of subscriptions, garbage, data sent up an XSUB — against a
real daemon (`tests/support/xsub_attack.py`, in a process of its own). After each case the
daemon's RSS is back near its baseline, it still answers, a well-behaved viewer still gets
its telemetry, and it still stops on SIGTERM (the fixture checks the exit code).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpud.security.roles import Role
from tests.support.adversary import (
    MB,
    authorized_keys,
    log_lines_with,
    rss,
    settle_rss,
    viewer_gets_telemetry,
)
from tests.support.daemons import RunningDaemon

pytestmark = pytest.mark.faults

CASES = {
    "sub-1mb": "one 1 MB subscription",
    "sub-64mb": "one 64 MB subscription",
    "subs-100k": "100k subscriptions",
    "garbage": "garbage frames",
    "xsub-data": "data sent up an XSUB",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_viewer_cannot_grow_the_daemon_through_the_events_socket(
    daemon: RunningDaemon, case: str
) -> None:
    viewer_gets_telemetry(daemon)  # warm: sockets and buffers in place
    baseline = rss(daemon)
    keys = authorized_keys(daemon, Role.VIEWER, "bad-viewer")
    server_key = daemon.target().server_key
    assert server_key is not None and keys.secret is not None
    started = time.monotonic()
    attacker = subprocess.run(
        [sys.executable, "-m", "tests.support.xsub_attack", case, daemon.events,
         server_key.decode(), keys.public.decode(), keys.secret.decode()],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert attacker.stdout.strip() == "sent", attacker.stderr
    peak = rss(daemon)
    after = settle_rss(daemon, baseline)
    print(
        f"{CASES[case]}: daemon RSS {baseline / MB:.1f} MB before, {peak / MB:.1f} MB right "
        f"after, {after / MB:.1f} MB settled ({time.monotonic() - started:.1f}s)"
    )
    with daemon.client(timeout_s=5.0) as client:
        assert client.node_info().node == daemon.node
    viewer_gets_telemetry(daemon)
    assert not log_lines_with(daemon, "Traceback"), daemon.log()
