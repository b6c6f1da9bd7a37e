"""Who gets in: no key, unknown keys, wrong pinned keys, viewers and operators."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import zmq

from gpud.security.keys import KeyPair
from gpud.wire.client import Client, NodeTarget, RequestFailed, Unreachable
from gpud.wire.node_messages import Empty
from gpud.wire.protocol import NODE_INFO, encode_request
from tests.support.adversary import audit_records
from tests.support.daemons import RunningDaemon, gpuctl

REQUEST = encode_request("raw-1", NODE_INFO, Empty())


def _raw_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]],
    daemon: RunningDaemon,
    keys: KeyPair | None,
    server_key: bytes | None,
) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if server_key is not None and keys is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret
    sock.connect(f"tcp://{daemon.address}")
    return sock


def _random_keys() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public=public, secret=secret)


@pytest.mark.parametrize("who", ["no key", "unknown key", "wrong server key"])
def test_untrusted_raw_clients_get_no_reply_and_no_telemetry(
    daemon: RunningDaemon, who: str
) -> None:
    server_key = daemon.target().server_key
    assert server_key is not None
    keys, pinned = {
        "no key": (None, None),
        "unknown key": (_random_keys(), server_key),
        "wrong server key": (_random_keys(), zmq.curve_keypair()[0]),
    }[who]
    ctx = zmq.Context()
    try:
        dealer = _raw_dealer(ctx, daemon, keys, pinned)
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        if pinned is not None and keys is not None:
            sub.curve_serverkey, sub.curve_publickey, sub.curve_secretkey = (
                pinned,
                keys.public,
                keys.secret,
            )
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(daemon.events)
        for _ in range(3):
            dealer.send(REQUEST)
        # 1.5 s is 7 snapshot intervals of this daemon: a trusted peer would have plenty.
        assert dealer.poll(1500) == 0
        assert sub.poll(100) == 0
    finally:
        ctx.destroy(linger=0)
    assert daemon.client().node_info().node == "node0"  # still serving the trusted


def test_client_says_why_it_was_refused(daemon: RunningDaemon) -> None:
    start = time.monotonic()
    with pytest.raises(Unreachable, match="refused our key"):
        daemon.client(keys=_random_keys(), timeout_s=10).node_info()
    assert time.monotonic() - start < 5  # told at the handshake, not after the timeout
    wrong = NodeTarget(control=daemon.target().control, server_key=zmq.curve_keypair()[0])
    with (
        pytest.raises(Unreachable, match="does not match the pinned server key"),
        Client(wrong, timeout_s=10) as c,
    ):
        c.node_info()


def test_viewer_reads_but_operator_actions_are_forbidden(daemon: RunningDaemon) -> None:
    viewer = _random_keys()
    result = gpuctl(
        "keys",
        "authorize",
        viewer.public_text,
        "--role",
        "viewer",
        "--name",
        "vic",
        "--state-dir",
        str(daemon.state_dir),
    )
    assert result.returncode == 0, result.stderr
    assert "authorized: vic as viewer" in result.stdout
    client = daemon.client(keys=viewer)
    info = client.node_info()  # no restart needed: the ring re-reads the file
    assert info.role.value == "viewer"
    assert len(client.node_hw().gpus) == 8
    with pytest.raises(RequestFailed) as err:
        client.ack_events()
    assert err.value.code == "forbidden"
    assert (
        "needs the operator role" in err.value.message and "(vic) is a viewer" in err.value.message
    )
    audit = [json.loads(line) for line in audit_records(daemon.state_dir)]
    by_vic = [r for r in audit if r["caller"] == "vic"]
    # A refused action is audited as a refusal, never as an accepted action.
    assert [(r["action"], r["ok"], r["code"]) for r in by_vic] == [
        ("node.events.ack", False, "forbidden")
    ]
    daemon.client().ack_events()
    last = (daemon.state_dir / "audit.log").read_text().splitlines()[-1]
    assert json.loads(last)["role"] == "operator"


def test_revoked_key_is_refused_on_its_next_connection(daemon: RunningDaemon) -> None:
    keys = _random_keys()
    assert (
        gpuctl(
            "keys",
            "authorize",
            keys.public_text,
            "--role",
            "operator",
            "--name",
            "ops",
            "--state-dir",
            str(daemon.state_dir),
        ).returncode
        == 0
    )
    assert daemon.client(keys=keys).node_info().role.value == "operator"
    assert (
        gpuctl("keys", "revoke", keys.public_text, "--state-dir", str(daemon.state_dir)).returncode
        == 0
    )
    with pytest.raises(Unreachable, match="refused our key"):
        daemon.client(keys=keys).node_info()


def test_insecure_daemon_on_loopback_needs_no_keys(daemons: Callable[..., RunningDaemon]) -> None:
    d = daemons(extra=("--insecure",))
    target = d.target()
    assert target.server_key is None  # the daemon recorded itself as insecure
    info = d.client().node_info()
    assert info.secure is False and info.role.value == "operator"
    assert "INSECURE" in d.log()
    result = gpuctl("--node", d.address, "nodes")
    assert result.returncode == 0 and "insecure" in result.stdout
