"""Addresses of daemons: parsing what people type, and comparing spellings of one address.

Pure functions (no files, no sockets), so run specs and settings can validate addresses
without pulling in any I/O.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

DEFAULT_CONTROL_PORT = 7711
DEFAULT_EVENTS_PORT = 7712
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+)(?::(?P<port>\d{1,5}))?$")


class AddressError(ValueError):
    """An address a person typed that cannot be used."""


def parse_endpoint(text: str, default_port: int = DEFAULT_CONTROL_PORT) -> str:
    """`HOST[:PORT]`, `tcp://HOST:PORT` or `ipc://PATH` → a zmq endpoint."""
    text = text.strip()
    if text.startswith("ipc://"):
        if len(text) <= len("ipc://"):
            raise AddressError(f"{text!r} names no socket path")
        return text
    if text.startswith("tcp://"):
        text = text[len("tcp://") :]
    elif "://" in text:
        raise AddressError(f"{text!r}: only tcp:// and ipc:// addresses are supported")
    match = _HOST_PORT.match(text)
    if not match:
        raise AddressError(f"expected HOST:PORT, got {text!r}")
    port = int(match["port"]) if match["port"] else default_port
    if not 0 < port < 65536:
        raise AddressError(f"port {port} is out of range in {text!r}")
    return f"tcp://{match['host']}:{port}"


def canonical_endpoint(endpoint: str) -> str:
    """Spellings of the same local address compare equal (localhost == 127.0.0.1)."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").lower()
    if host == "localhost":
        host = "127.0.0.1"
    return f"tcp://{host}:{parts.port}"


def endpoint_host(endpoint: str) -> str | None:
    return urlsplit(endpoint).hostname if endpoint.startswith("tcp://") else None


def is_loopback(endpoint: str) -> bool:
    """True for ipc:// and for tcp:// on a loopback host."""
    if endpoint.startswith("ipc://"):
        return True
    host = endpoint_host(endpoint)
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def events_endpoint_for(control: str, events_bound: str) -> str:
    """Where a client reaches the events socket, given the address the daemon bound.

    A daemon bound to a wildcard (`tcp://0.0.0.0:7712`) is reached on the host the client
    already uses for control; only the port is taken from the bind address.
    """
    if not events_bound.startswith("tcp://") or not control.startswith("tcp://"):
        return events_bound
    bound_host = endpoint_host(events_bound)
    if bound_host not in (None, "", "0.0.0.0", "*", "::"):
        return events_bound
    host = urlsplit(control).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{urlsplit(events_bound).port}"
