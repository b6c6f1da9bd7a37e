"""Logs and audit that a client with a valid key cannot flood (issue 25 §2).

Real daemons, real CURVE keys, real sockets: an operator key asking `run.stop` for a run
that does not exist as fast as it can for 20 s; a revoked key still asking on its open
connection; key changes through `gpuctl keys`. The audit log keeps every accepted action
and says how many refusals there were in a few summary records; the daemon's log says
it once per interval, with a count; key changes are in the audit log with who made them.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from gpud.security.audit import local_user
from gpud.security.roles import Role
from gpud.wire.client import RequestFailed
from tests.support.adversary import (
    MB,
    audit_records,
    authorized_keys,
    curve_socket,
    log_lines_with,
    rss,
)
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.probe import Prober

pytestmark = pytest.mark.faults

FLOOD_S = 20.0


def _audit_bytes(state_dir: Path) -> int:
    return sum(p.stat().st_size for p in state_dir.glob("audit*.log*"))


def _audit(state_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in audit_records(state_dir)]


def _request(request_id: str, type_: str, body: dict[str, object]) -> bytes:
    return json.dumps({"v": 1, "id": request_id, "type": type_, "body": body}).encode()


@pytest.mark.alone  # the control plane's latency, measured against the machine's load
def test_a_refusal_flood_adds_little_to_the_audit_log_and_keeps_every_accepted_action(
    daemon: RunningDaemon,
) -> None:
    keys = authorized_keys(daemon, Role.OPERATOR, "flooder")
    before = _audit_bytes(daemon.state_dir)
    baseline = rss(daemon)
    refused = accepted = 0
    ids = itertools.count()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = curve_socket(ctx, zmq.DEALER, daemon, keys)
        in_flight = 0
        next_ack = time.monotonic()
        with Prober(daemon) as prober:
            end = time.monotonic() + FLOOD_S
            while time.monotonic() < end or in_flight:
                now = time.monotonic()
                while now < end and in_flight < 64:
                    if now >= next_ack:  # an accepted operator action, 4 a second
                        next_ack += 0.25
                        sock.send(_request(f"ack-{next(ids)}", "node.events.ack", {}))
                    else:
                        body: dict[str, object] = {"run": "no-such-run"}
                        sock.send(_request(str(next(ids)), "run.stop", body))
                    in_flight += 1
                if not sock.poll(2000):
                    break
                while sock.poll(0):
                    reply = json.loads(sock.recv())
                    in_flight -= 1
                    if str(reply["id"]).startswith("ack-"):
                        assert reply["ok"], reply
                        accepted += 1
                    else:
                        assert reply["error"]["code"] == "not_found", reply
                        refused += 1
        peak = rss(daemon)
    finally:
        ctx.destroy(linger=0)
    grown = _audit_bytes(daemon.state_dir) - before
    assert daemon.stop() == 0  # a clean stop writes the last summary
    records = [r for r in _audit(daemon.state_dir) if r["caller"] == "flooder"]
    acks = [r for r in records if r["action"] == "node.events.ack"]
    stops = [r for r in records if r["action"] == "run.stop"]
    summaries = [r for r in stops if r.get("count", 1) > 1]
    print(
        f"{refused} refused run.stop and {accepted} accepted acks in {FLOOD_S:.0f} s: the "
        f"audit log grew {grown / 1024:.1f} kB ({len(stops)} run.stop records, "
        f"{len(summaries)} of them summaries); {prober.summary()}; RSS "
        f"{baseline / MB:.1f} → {peak / MB:.1f} MB"
    )
    assert refused > 20_000, "the flood was too slow to mean anything"
    assert grown < 1 * MB
    # Every accepted action, each its own record; every refusal counted once.
    assert len(acks) == accepted and all(r["ok"] for r in acks)
    assert sum(r["count"] for r in stops) == refused
    assert all(not r["ok"] and r["code"] == "not_found" for r in stops)
    assert summaries and "more refused run.stop from flooder in the last" in summaries[0]["detail"]
    assert prober.failed == []
    assert prober.worst_s < 1.0, prober.summary()  # the flood is served, not the prober starved


def test_a_revoked_key_still_asking_is_logged_once_per_interval(daemon: RunningDaemon) -> None:
    keys = authorized_keys(daemon, Role.OPERATOR, "mallory")
    client = daemon.client(keys=keys)
    assert client.node_info().role is Role.OPERATOR
    revoke = gpuctl("keys", "revoke", keys.public_text, "--state-dir", str(daemon.state_dir))
    assert revoke.returncode == 0, revoke.stderr
    asked = 0
    end = time.monotonic() + 12.0  # past one interval of the throttled log (10 s)
    while time.monotonic() < end:
        try:
            client.ack_events() if asked % 2 else client.node_info()
        except RequestFailed as exc:
            assert exc.code == "forbidden"
            asked += 1
        time.sleep(0.02)
    lines = log_lines_with(daemon, "no longer authorized")
    print(f"{asked} refused requests from a revoked key: {len(lines)} log lines")
    for line in lines:
        print("  ", line[line.index("WARNING") :][:160])
    assert asked > 200
    assert 1 <= len(lines) <= 3
    assert any("more like it in the last" in line for line in lines)
    daemon.stop()
    refusals = [r for r in _audit(daemon.state_dir) if r["caller"].startswith("revoked key")]
    assert {r["action"] for r in refusals} == {"node.events.ack"}  # reads are not audited
    assert sum(r["count"] for r in refusals) == asked // 2


def test_key_changes_are_audited_by_gpuctl_and_by_the_daemon(daemon: RunningDaemon) -> None:
    viewer = authorized_keys(daemon, Role.VIEWER, "walter")  # a change, through the library
    state = str(daemon.state_dir)
    time.sleep(0.3)  # the daemon re-reads the file on a request at most every 0.25 s
    daemon.client().node_info()
    grant = gpuctl(
        "keys", "authorize", viewer.public_text, "--role", "operator", "--name", "walter",
        "--state-dir", state,
    )  # fmt: skip
    assert grant.returncode == 0, grant.stderr
    time.sleep(0.3)
    daemon.client().node_info()
    revoke = gpuctl("keys", "revoke", viewer.public_text, "--state-dir", state)
    assert revoke.returncode == 0, revoke.stderr
    time.sleep(0.3)
    daemon.client().node_info()
    records = _audit(daemon.state_dir)
    mine = [r for r in records if r["action"].startswith("keys.") and "walter" in json.dumps(r)]
    by_gpuctl = [r for r in mine if r["role"] == "local"]
    applied = [r for r in mine if r["action"] == "keys.applied"]
    assert [r["action"] for r in by_gpuctl] == ["keys.authorize", "keys.authorize", "keys.revoke"]
    assert all(r["caller"] == local_user() for r in by_gpuctl)
    assert by_gpuctl[1]["body"] == {
        "key": viewer.public_text, "name": "walter", "role": "operator",
        "was": {"name": "walter", "role": "viewer"},
    }  # fmt: skip
    assert by_gpuctl[1]["time"] < applied[-1]["time"]
    # The daemon's own record of what it applied: the key, its new role, its removal.
    changes = [(len(r["body"]["added"]), len(r["body"]["changed"]), len(r["body"]["removed"]))
               for r in applied]  # fmt: skip
    assert changes == [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
    assert "removed walter (operator)" in applied[-1]["detail"]


def test_a_viewers_huge_refused_launches_cannot_wipe_the_accepted_records(
    daemons: Callable[..., RunningDaemon],
) -> None:
    """Issue 33 §1's attack: a viewer key sends refused `run.launch`es with 3.5 MB specs.
    Each was written whole, with its body, and rotation pushed the operator's records
    out of a bounded log. Now a refusal is a small record in a file of its own, and the
    bound holds to the byte."""
    bound = 2**20
    daemon = daemons(extra=("--audit-max-mb", "1"))
    daemon.client().ack_events()  # an accepted operator action
    viewer = authorized_keys(daemon, Role.VIEWER, "mallory")  # a key change
    spec = {"name": "x", "script": "a.py", "args": ["y" * 1000] * 3500}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = curve_socket(ctx, zmq.DEALER, daemon, viewer)
        for n in range(6):  # 21 MB of refused bodies against a 1 MiB bound
            body: dict[str, object] = {"spec": spec, "nodes": [{"control": daemon.address}]}
            sock.send(_request(f"huge-{n}", "run.launch", body))
            assert sock.poll(30_000), "no answer to a refused launch"
            reply = json.loads(sock.recv())
            assert reply["error"]["code"] == "forbidden", reply
    finally:
        ctx.destroy(linger=0)
    daemon.client().ack_events()
    assert daemon.stop() == 0
    records = _audit(daemon.state_dir)
    accepted = [r["action"] for r in records if r["ok"]]
    assert accepted.count("node.events.ack") == 2 and "keys.authorize" in accepted, accepted
    refused = [r for r in records if not r["ok"] and r["caller"] == "mallory"]
    assert sum(r["count"] for r in refused) == 6
    assert all(r["body"] == {} and r["body_bytes"] > 3_500_000 for r in refused[:1])
    assert max(len(json.dumps(r)) for r in refused) < 2048
    assert _audit_bytes(daemon.state_dir) <= bound
