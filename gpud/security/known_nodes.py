"""Which daemons a user knows, and the server key pinned for each.

`<config-dir>/nodes.json` lists nodes by control address. A daemon started by the same
user records itself there (address, events address, public key), so a local gpuctl or
gputop needs no key set-up; remote nodes are added with `gpuctl keys trust`, which pins
their key. A client never talks CURVE to an address whose key it does not know.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpud.model.endpoints import AddressError, canonical_endpoint
from gpud.node.paths import atomic_write, config_dir, exclusive

KNOWN_NODES = "nodes.json"


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
