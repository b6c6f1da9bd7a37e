"""Which daemons gputop watches: `--node` addresses, a cluster file, or the known nodes.

A cluster file is YAML that lists nodes with their pinned server keys, so a team can hand
one file around instead of running `gpuctl keys trust` per node:

    nodes:
      - address: gpu1:7711
        server_key: "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
        name: gpu1          # optional: shown instead of the address
        group: rack-a       # optional: the fleet screen groups by it
        events: gpu1:7712   # optional: asked from the daemon otherwise
      - address: 127.0.0.1:7711
        insecure: true      # a loopback daemon started with --insecure

Every mistake a person can make here is a `TargetError` with one line that says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpud.model.endpoints import (
    DEFAULT_EVENTS_PORT,
    AddressError,
    canonical_endpoint,
    parse_endpoint,
)
from gpud.wire.client import ConfigError, NodeTarget, known_targets, resolve_target
from gpud.wire.protocol import describe_validation_error


class TargetError(Exception):
    """Bad input about which nodes to watch; `str()` is one line for a person."""


@dataclass(frozen=True)
class Target:
    node: NodeTarget
    group: str | None = None


class ClusterNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str = Field(description="control address, HOST:PORT or tcp://HOST:PORT")
    server_key: str | None = Field(
        None, min_length=40, max_length=40, description="the daemon's z85 public key, pinned"
    )
    insecure: bool = Field(False, description="the daemon runs --insecure (no CURVE)")
    name: str | None = Field(None, description="shown instead of the address")
    group: str | None = Field(None, description="the fleet screen groups nodes by it")
    events: str | None = Field(None, description="events address; asked from the daemon if unset")

    @model_validator(mode="after")
    def _key_or_insecure(self) -> ClusterNode:
        if self.server_key is None and not self.insecure:
            raise ValueError(f"{self.address}: give its server_key (or insecure: true)")
        return self


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[ClusterNode] = Field(min_length=1, description="the daemons to watch")


def load_cluster(path: Path) -> list[Target]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TargetError(f"cannot read cluster file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise TargetError(f"cluster file {path} is not valid YAML{where}") from None
    try:
        cluster = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise TargetError(f"cluster file {path}: {describe_validation_error(exc)}") from None
    targets = []
    for entry in cluster.nodes:
        try:
            control = parse_endpoint(entry.address)
            events = parse_endpoint(entry.events, DEFAULT_EVENTS_PORT) if entry.events else None
        except AddressError as exc:
            raise TargetError(f"cluster file {path}: {exc}") from None
        key = None if entry.insecure else (entry.server_key or "").encode("ascii")
        targets.append(Target(NodeTarget(control, key, events, entry.name), entry.group))
    return targets


def resolve_targets(addresses: list[str], cluster: Path | None) -> list[Target]:
    """The nodes to watch, without duplicates; TargetError on any bad input."""
    targets: list[Target] = load_cluster(cluster) if cluster is not None else []
    for address in addresses:
        try:
            targets.append(Target(resolve_target(address)))
        except ConfigError as exc:
            raise TargetError(str(exc)) from None
    if not targets:  # every known node, as gpuctl's verbs read them
        try:
            targets = [Target(node) for node in known_targets()]
        except ConfigError as exc:
            raise TargetError(str(exc)) from None
    unique: dict[str, Target] = {}
    for target in targets:
        unique.setdefault(canonical_endpoint(target.node.control), target)
    return list(unique.values())
