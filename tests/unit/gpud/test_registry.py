"""The method registry: the daemon serves every protocol method with exactly one handler.

The daemon's bindings come from a real `Daemon` started in this process (insecure, one
simulated GPU, a temporary state dir), the way `gpud serve` builds its registry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpud.daemon import Daemon
from gpud.security.auth import Caller
from gpud.settings import ServeSettings
from gpud.wire.control import Binding, IncompleteRegistry, Registry, bind
from gpud.wire.node_messages import Empty, NodeInfo
from gpud.wire.protocol import METHODS, NODE_INFO
from tests.support.daemons import free_port


@pytest.fixture
def bindings(tmp_path: Path) -> Iterator[list[Binding[Any, Any]]]:
    settings = ServeSettings(
        control=f"tcp://127.0.0.1:{free_port()}",
        events=f"tcp://127.0.0.1:{free_port()}",
        state_dir=tmp_path / "state",
        node_name="registry-test",
        simulate_gpus=1,
        insecure=True,
    )
    daemon = Daemon(settings)
    daemon.start()
    try:
        yield daemon.bindings()
    finally:
        daemon.close()


def test_the_daemon_binds_every_protocol_method_exactly_once(
    bindings: list[Binding[Any, Any]],
) -> None:
    counts = Counter(b.method.name for b in bindings)
    assert sorted(counts) == sorted(METHODS)
    assert {name: n for name, n in counts.items() if n != 1} == {}
    assert all(b.method is METHODS[b.method.name] for b in bindings)
    registry = Registry(bindings)
    for method in METHODS.values():
        assert callable(registry.handler(method))


def test_a_method_without_a_handler_is_refused_by_name(
    bindings: list[Binding[Any, Any]],
) -> None:
    for missing in bindings:
        rest = [b for b in bindings if b is not missing]
        with pytest.raises(IncompleteRegistry) as caught:
            Registry(rest)
        assert str(caught.value) == f"no handler for {missing.method.name}"
    with pytest.raises(IncompleteRegistry, match=r"^no handler for node\.hw, node\.info$"):
        Registry([b for b in bindings if b.method.name not in ("node.info", "node.hw")])


def test_a_method_bound_twice_is_refused(bindings: list[Binding[Any, Any]]) -> None:
    with pytest.raises(IncompleteRegistry, match=r"^run\.stop is bound twice$"):
        Registry([*bindings, next(b for b in bindings if b.method.name == "run.stop")])

    def other_node_info(body: Empty, caller: Caller) -> NodeInfo:
        raise AssertionError("never called")

    with pytest.raises(IncompleteRegistry, match=r"^node\.info is bound twice$"):
        Registry([*bindings, bind(NODE_INFO, other_node_info)])


def test_a_method_the_protocol_does_not_declare_is_refused(
    bindings: list[Binding[Any, Any]],
) -> None:
    impostor = replace(NODE_INFO, summary="same name, not the protocol's object")
    rest = [b for b in bindings if b.method is not NODE_INFO]
    with pytest.raises(IncompleteRegistry, match=r"^node\.info is not a method of the protocol$"):
        Registry([*rest, Binding(impostor, bindings[0].handler)])
    unknown = replace(NODE_INFO, name="node.nope")
    with pytest.raises(IncompleteRegistry, match=r"^node\.nope is not a method of the protocol$"):
        Registry([*bindings, Binding(unknown, bindings[0].handler)])
