"""Which daemons a user knows, and the server key pinned for each.

`<config-dir>/nodes.json` lists nodes by control address. A daemon started by the same
user records itself there (address, events address, public key), so a local gpuctl or
gputop needs no key set-up; remote nodes are added with `gpuctl keys trust`, which pins
their key. A client never talks CURVE to an address whose key it does not know.
"""

from __future__ import annotations

import ipaddress
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpud.paths import atomic_write, config_dir, exclusive

KNOWN_NODES = "nodes.json"
DEFAULT_CONTROL_PORT = 7711
DEFAULT_EVENTS_PORT = 7712
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+)(?::(?P<port>\d{1,5}))?$")


class AddressError(ValueError):
    """An address a person typed that cannot be used."""


class KnownNode(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    control: str = Field(description="control endpoint, e.g. tcp://10.0.0.5:7711")
    events: str | None = Field(None, description="events endpoint; asked from node.info if None")
    server_key: str | None = Field(None, description="pinned z85 public key of the daemon")
    insecure: bool = Field(False, description="the daemon runs without CURVE (loopback only)")
    name: str | None = None
    state_dir: str | None = Field(None, description="set by a local daemon for its own entry")
    updated: float = Field(default_factory=time.time)


class KnownNodes(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    nodes: list[KnownNode] = Field(default_factory=list)

    def find(self, control: str) -> KnownNode | None:
        wanted = canonical_endpoint(control)
        return next((n for n in self.nodes if canonical_endpoint(n.control) == wanted), None)


def known_nodes_path() -> Path:
    return config_dir() / KNOWN_NODES


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


def load_known_nodes(path: Path | None = None) -> KnownNodes:
    path = path or known_nodes_path()
    try:
        return KnownNodes.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return KnownNodes()
    except ValidationError as exc:
        raise AddressError(
            f"{path} is not a valid known-nodes file ({exc.errors()[0]['msg']}); fix or delete it"
        ) from None


def remember_node(node: KnownNode, path: Path | None = None) -> None:
    """Add or replace the entry with the same control address."""
    path = path or known_nodes_path()
    with exclusive(path):
        current = load_known_nodes(path)
        wanted = canonical_endpoint(node.control)
        kept = [n for n in current.nodes if canonical_endpoint(n.control) != wanted]
        kept.append(node)
        atomic_write(path, KnownNodes(nodes=kept).model_dump_json(indent=2).encode())


def forget_node(control: str, path: Path | None = None) -> bool:
    path = path or known_nodes_path()
    with exclusive(path):
        current = load_known_nodes(path)
        wanted = canonical_endpoint(control)
        kept = [n for n in current.nodes if canonical_endpoint(n.control) != wanted]
        if len(kept) == len(current.nodes):
            return False
        atomic_write(path, KnownNodes(nodes=kept).model_dump_json(indent=2).encode())
    return True
