"""Addresses people type, and the known-nodes file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.model.endpoints import AddressError, events_endpoint_for, is_loopback, parse_endpoint
from gpud.security.known_nodes import KnownNode, forget_node, load_known_nodes, remember_node


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("127.0.0.1:7711", "tcp://127.0.0.1:7711"),
        ("gpu-01", "tcp://gpu-01:7711"),
        ("tcp://10.0.0.5:9000", "tcp://10.0.0.5:9000"),
        ("[::1]:7711", "tcp://[::1]:7711"),
        ("ipc:///tmp/gpud.sock", "ipc:///tmp/gpud.sock"),
    ],
)
def test_parse_endpoint(text: str, endpoint: str) -> None:
    assert parse_endpoint(text) == endpoint


@pytest.mark.parametrize("text", ["http://x:1", "host:99999", "a b:1", "", "ipc://", "host:port"])
def test_parse_endpoint_refuses_nonsense(text: str) -> None:
    with pytest.raises(AddressError):
        parse_endpoint(text)


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:1", True),
        ("tcp://127.8.0.1:1", True),
        ("tcp://localhost:1", True),
        ("tcp://[::1]:1", True),
        ("ipc:///tmp/x", True),
        ("tcp://0.0.0.0:1", False),
        ("tcp://10.1.2.3:1", False),
        ("tcp://gpu-01:1", False),
    ],
)
def test_is_loopback(endpoint: str, loopback: bool) -> None:
    assert is_loopback(endpoint) is loopback


def test_events_endpoint_follows_the_control_host_for_wildcard_binds() -> None:
    assert events_endpoint_for("tcp://gpu1:7711", "tcp://0.0.0.0:7712") == "tcp://gpu1:7712"
    assert events_endpoint_for("tcp://gpu1:7711", "tcp://10.0.0.9:7712") == "tcp://10.0.0.9:7712"
    assert events_endpoint_for("tcp://gpu1:7711", "ipc:///x") == "ipc:///x"


def test_remember_replaces_by_address_and_localhost_matches(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    remember_node(KnownNode(control="tcp://127.0.0.1:7711", server_key="a" * 40), path)
    remember_node(KnownNode(control="tcp://localhost:7711", server_key="b" * 40), path)
    remember_node(KnownNode(control="tcp://10.0.0.1:7711", server_key="c" * 40), path)
    known = load_known_nodes(path)
    assert len(known.nodes) == 2
    found = known.find("tcp://127.0.0.1:7711")
    assert found is not None and found.server_key == "b" * 40
    assert forget_node("tcp://10.0.0.1:7711", path)
    assert not forget_node("tcp://10.0.0.1:7711", path)
    assert [n.control for n in load_known_nodes(path).nodes] == ["tcp://localhost:7711"]


def test_corrupt_known_nodes_file_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text('{"nodes": 5}')
    with pytest.raises(AddressError, match="fix or delete it"):
        load_known_nodes(path)
