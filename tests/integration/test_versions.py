"""One version everywhere, and one line when two ends share no protocol (issue 22 §3).

A real daemon: the three commands' `--version` and its `node.info` name the same release;
a request in a protocol it does not speak, sent on a real socket, is refused in one line
naming both versions, and a store a newer gpud wrote stops `gpud serve` in one line.
gpuctl facing a daemon that speaks no protocol gpuctl does (a gpud far older than any
release the range covers: played by a bare ROUTER socket that answers as such a daemon
would, since every real release is in range) says so in one line too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from gpud import __version__
from gpud.node.store import SCHEMA_VERSION
from gpud.security.known_nodes import KnownNode, remember_node
from gpud.wire.envelope import MIN_PROTOCOL, PROTOCOL_VERSION
from tests.support.daemons import RunningDaemon, free_port, gpuctl, run_cli, spawn_daemon


def test_the_commands_and_node_info_report_one_version(daemon: RunningDaemon) -> None:
    shown = {
        "gpud": run_cli("gpud", "--version").stdout.strip(),
        "gpuctl": gpuctl("--version").stdout.strip(),
        "gputop": run_cli("tui", "--version").stdout.strip(),
    }
    assert shown == {
        "gpud": f"gpud, version {__version__}",
        "gpuctl": f"gpuctl (gpud) {__version__}",
        "gputop": f"gputop (gpud) {__version__}",
    }
    info = daemon.client().node_info()
    assert (info.version, info.protocol, info.min_protocol) == (
        __version__,
        PROTOCOL_VERSION,
        MIN_PROTOCOL,
    )
    assert info.store_schema is not None and info.store_schema >= 5
    nodes = json.loads(gpuctl("--node", daemon.address, "--json", "nodes").stdout)
    assert [n["info"]["version"] for n in nodes["nodes"]] == [__version__]


def test_a_request_in_a_protocol_the_daemon_does_not_speak_is_refused_in_one_line(
    daemon: RunningDaemon,
) -> None:
    client = daemon.client()
    sock = client._sock  # the client's own CURVE-authenticated DEALER
    for version in (0, PROTOCOL_VERSION + 5):
        sock.send(json.dumps({"v": version, "id": f"r{version}", "type": "node.info"}).encode())
        assert sock.poll(5000)
        reply = json.loads(sock.recv())
        assert reply["ok"] is False and reply["v"] == PROTOCOL_VERSION
        assert reply["error"] == {
            "code": "unsupported_version",
            "message": f"protocol version {version} is not supported: this daemon"
            f" (gpud {__version__}) speaks {MIN_PROTOCOL}–{PROTOCOL_VERSION}",
        }
    # In range, it is served: gpud 0.1.0's protocol too.
    sock.send(json.dumps({"v": MIN_PROTOCOL, "id": "old", "type": "node.info"}).encode())
    assert sock.poll(5000) and json.loads(sock.recv())["ok"] is True


@pytest.fixture
def ancient_gpud() -> Iterator[str]:
    """A daemon that speaks protocol 0 only, as a real one refuses (insecure, loopback)."""
    address = f"127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(f"tcp://{address}")
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            if not router.poll(100):
                continue
            identity, frame = router.recv_multipart()
            request = json.loads(frame)
            message = f"protocol version {request['v']} is not supported; this daemon speaks 0"
            reply = {"v": 0, "id": request.get("id"), "ok": False,
                     "error": {"code": "unsupported_version", "message": message}}  # fmt: skip
            router.send_multipart([identity, json.dumps(reply).encode()])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    remember_node(KnownNode(control=f"tcp://{address}", insecure=True, name="ancient"))
    yield address
    done.set()
    thread.join(timeout=5)
    router.close()
    ctx.term()


def test_gpuctl_says_in_one_line_that_it_cannot_talk_to_a_daemon_out_of_its_range(
    ancient_gpud: str,
) -> None:
    result = gpuctl("--node", ancient_gpud, "ps")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [
        f"gpuctl: error: {ancient_gpud}: it runs a gpud that speaks protocol 0; this client"
        f" (gpud {__version__}) speaks {MIN_PROTOCOL}–{PROTOCOL_VERSION}"
    ]


def test_a_store_a_newer_gpud_wrote_is_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / "gpud.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    proc, log, *_ = spawn_daemon(tmp_path, simulate_gpus=None, state_dir=state)
    assert proc.wait(timeout=30) == 2
    said = [line for line in log.read_text().splitlines() if "store schema" in line]
    assert len(said) == 1 and "Traceback" not in log.read_text(), log.read_text()
    assert said[0].endswith(
        f"{state / 'gpud.db'} has store schema {SCHEMA_VERSION + 1}, written by a newer gpud;"
        f" this gpud ({__version__}) reads schema {SCHEMA_VERSION} and older: run the newer"
        " gpud on this state dir, or this one on another"
    )
