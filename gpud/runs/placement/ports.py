"""MASTER_PORT leases: node 0 hands each attempt a port no other run of its holds.

A port is leased only if it is not leased already and can be bound right now on all
interfaces, so two runs never clash on the rendezvous port, and a port some other program
holds is skipped. Leases are persisted with the run and released when it ends.

Between the pick and torchrun's own bind (its agent imports torch first: seconds, more
on a loaded machine) the port is free to anyone. Another gpud daemon on the same host (a
second user's, or the several one test machine runs) could pick it in that window, and
one of the two runs would fail its rendezvous. So a pick also claims the port host-wide
(`HostClaims`) for `CLAIM_S`, and every daemon skips a port another has claimed.
`master_host` is the host of the rendezvous: the spec's, else node 0's.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import sys
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from gpud.model.run import NodeRef
from launch.spec import RunSpec

PORT_RANGE = range(29500, 30500)
#: How long a picked port stays claimed host-wide: time for its torchrun to bind it (from
#: then on the bind itself keeps others off), with room for a loaded machine.
CLAIM_S = 120.0

log = logging.getLogger("gpud.runs")


class NoFreePort(Exception):
    pass


class HostClaims:
    """Claims on rendezvous ports that every gpud process on this host honours, whoever
    runs it: one abstract unix socket per claimed port (Linux). The abstract namespace has
    the scope TCP ports have (the network namespace), needs no file and no permission, and
    a claim is gone with the process that held it, however it ended. Held `CLAIM_S`, then
    dropped at the next claim. Elsewhere than Linux every claim succeeds (ports are still
    leased per daemon and checked by binding)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[int, tuple[socket.socket, float]] = {}
        self._supported = sys.platform.startswith("linux")

    def claim(self, port: int) -> bool:
        """Claim `port` for this process; False when another process holds it."""
        self._expire()
        if port in self._held or not self._supported:
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0gpud/master-port/{port}")
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return False
            log.warning("cannot claim ports host-wide here (%s); leasing per daemon only", exc)
            self._supported = False
            return True
        self._held[port] = (sock, self._clock())
        return True

    def close(self) -> None:
        """Drop every claim (a process's end does as much)."""
        for sock, _ in self._held.values():
            sock.close()
        self._held.clear()

    def held(self) -> set[int]:
        self._expire()
        return set(self._held)

    def _expire(self) -> None:
        now = self._clock()
        for port, (sock, since) in list(self._held.items()):
            if now - since >= CLAIM_S:
                sock.close()
                del self._held[port]


#: This process's claims.
CLAIMS = HostClaims()


def bindable(port: int) -> bool:
    """Whether torchrun's store could listen on `port` now: bound as it binds, with
    SO_REUSEADDR, so the TIME_WAIT a stopped run's connections leave (60 s) does not keep
    its port from the next run, and a port another program listens on is still taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_port(
    leased: Iterable[int],
    rng: random.Random | None = None,
    claims: HostClaims = CLAIMS,
    ports: range | None = None,
) -> int:
    """A free port of `ports` (the daemon's `--master-ports`, PORT_RANGE by default) that
    no run of this daemon has leased and no other gpud on the host has just picked;
    claimed host-wide (random start, so restarts rarely reuse one)."""
    taken = set(leased)
    span = ports if ports is not None else PORT_RANGE
    candidates = list(span)
    start = (rng or random).randrange(len(candidates))
    for port in candidates[start:] + candidates[:start]:
        if port not in taken and bindable(port) and claims.claim(port):
            return port
    raise NoFreePort(
        f"no free MASTER_PORT in {span.start}-{span.stop - 1} (the daemon's --master-ports):"
        " every one is leased to a run, bound, or just picked by another gpud on this host"
    )


def master_host(spec: RunSpec, nodes: list[NodeRef]) -> str:
    """The rendezvous host: the spec's, else node 0's host as gpuctl reaches it."""
    if spec.master_addr:
        return spec.master_addr
    endpoint = nodes[0].control
    if not endpoint.startswith("tcp://"):
        return "127.0.0.1"
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("localhost", "0.0.0.0", "*") else host
