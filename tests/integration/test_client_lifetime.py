"""A long-lived client process (gputop, a script) keeps working after its daemons come and go.

Regression: closing a client's socket while its monitor was still attached left libzmq
queueing monitor events with no reader; minutes later the shared context's I/O thread
blocked and every new client of the process got no answer at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support.daemons import RunningDaemon

pytestmark = pytest.mark.slow
#: Idle time after which the old close order had frozen the context (seen at ~60-100 s).
IDLE_S = 100


def test_clients_work_after_a_daemon_went_away_and_time_passed(
    daemons: Callable[..., RunningDaemon],
) -> None:
    first = daemons(node="first")
    with first.client(timeout_s=3) as client:
        assert client.node_info().node == "first"
    assert first.stop() == 0
    time.sleep(IDLE_S)
    second = daemons(node="second")
    with second.client(timeout_s=3) as client:
        assert client.node_info().node == "second"
