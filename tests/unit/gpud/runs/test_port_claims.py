"""Two gpud daemons on one host never hand out the same MASTER_PORT in the seconds before
torchrun binds it: a pick claims the port host-wide, for whoever runs the other daemon,
until the claim times out or its process ends. The other daemon here is a real second
process running the same pick with the same random start."""

from __future__ import annotations

import random
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
