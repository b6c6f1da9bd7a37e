"""Two gpud daemons on one host never hand out the same MASTER_PORT in the seconds before
torchrun binds it: a pick claims the port host-wide, for whoever runs the other daemon,
until the claim times out or its process ends. The other daemon here is a real second
process running the same pick with the same random start."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from gpud.runs.placement import ports
from gpud.runs.placement.ports import CLAIM_S, HostClaims, pick_port

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="host-wide claims are Linux's abstract sockets"
)

SEED = 1234
#: The other daemon: picks with the same seed, says its port, and holds it until stdin ends.
OTHER = textwrap.dedent(
    f"""
    import random, sys
    from gpud.runs.placement.ports import pick_port
    print(pick_port(set(), random.Random({SEED})), flush=True)
    sys.stdin.read()
    """
)


def test_a_port_another_daemon_just_picked_is_skipped_until_that_daemon_is_gone() -> None:
    claims = HostClaims()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as other:
            assert other.stdout is not None
            theirs = int(other.stdout.readline())
            # Nothing has bound it yet (their torchrun is still importing torch): only the
            # claim keeps this daemon off it.
            assert ports.bindable(theirs)
            assert pick_port(set(), random.Random(SEED), claims=claims) != theirs
            other.kill()
        # Gone, however it ended (killed here): its port is free for the next pick.
        assert pick_port(set(), random.Random(SEED), claims=claims) == theirs
    finally:
        claims.close()


def test_a_claim_lapses_after_claim_s_and_is_held_until_then() -> None:
    now = [0.0]
    first, second = HostClaims(clock=lambda: now[0]), HostClaims()
    port = pick_port(set(), random.Random(SEED), claims=first)
    assert port in first.held() and not second.claim(port)
    now[0] = CLAIM_S - 1
    assert port in first.held() and not second.claim(port)
    now[0] = CLAIM_S
    assert first.held() == set()
    assert second.claim(port) and not first.claim(port)
    second.close()
    assert first.claim(port)
    first.close()


def test_a_port_in_time_wait_is_free_and_a_listened_one_is_not() -> None:
    """As torchrun's store binds (SO_REUSEADDR): a stopped run's port serves the next run
    at once, not 60 s later; a port some program listens on is skipped."""
    with socket.socket() as listener:
        # As torchrun's TCPStore listens (c10d sets SO_REUSEADDR): the TIME_WAIT its
        # connections leave keeps the flag, and a bind that sets it too may reuse the port.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not ports.bindable(port)
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()  # the store's side closes first: its end waits in TIME_WAIT
    assert "TIME-WAIT" in subprocess.run(
        ["ss", "-tan", f"sport = :{port}"], capture_output=True, text=True
    ).stdout or not shutil.which("ss")
    assert ports.bindable(port)
