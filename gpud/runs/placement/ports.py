"""MASTER_PORT leases: node 0 hands each attempt a port no other run of its holds.

A port is leased only if it is not leased already and can be bound right now on all
interfaces, so two runs never clash on the rendezvous port, and a port some other program
holds is skipped. Leases are persisted with the run and released when it ends.
`master_host` is the host of the rendezvous: the spec's, else node 0's.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from gpud.model.run import NodeRef
from launch.spec import RunSpec

PORT_RANGE = range(29500, 30500)


class NoFreePort(Exception):
    pass


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_port(leased: Iterable[int], rng: random.Random | None = None) -> int:
    """A free, unleased port from PORT_RANGE (random start, so restarts rarely reuse one)."""
    taken = set(leased)
    ports = list(PORT_RANGE)
    start = (rng or random).randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        if port not in taken and bindable(port):
            return port
    raise NoFreePort(f"no free port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")


def master_host(spec: RunSpec, nodes: list[NodeRef]) -> str:
    """The rendezvous host: the spec's, else node 0's host as gpuctl reaches it."""
    if spec.master_addr:
        return spec.master_addr
    endpoint = nodes[0].control
    if not endpoint.startswith("tcp://"):
        return "127.0.0.1"
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("localhost", "0.0.0.0", "*") else host
