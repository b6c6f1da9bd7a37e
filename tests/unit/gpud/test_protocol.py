"""The wire protocol: envelopes round-trip, and bad input becomes the right error code."""

from __future__ import annotations

import json

import pytest

from gpud import __version__
from gpud.model.snapshot import NodeEvent, NodeSnapshot
from gpud.notify.targets import Webhook
from gpud.security.roles import Role
from gpud.wire.envelope import MIN_PROTOCOL, PROTOCOL_VERSION, ErrorCode, ProtocolError
from gpud.wire.node_messages import AckEventsRequest, Empty, NodeEventsRequest, NotifyTestRequest
from gpud.wire.protocol import (
    METHODS,
    NODE_EVENTS,
    decode_event,
    decode_reply,
    decode_request,
    encode_error,
    encode_event,
    encode_reply,
    encode_request,
    hw_topic,
    node_event_topic,
)
from gpud.wire.run_messages import LaunchRequest, NodeRefIn
from tests.support.samples import host_sample

HOST = host_sample()


def test_request_round_trip_gives_typed_body() -> None:
    frame = encode_request("r1", NODE_EVENTS, NodeEventsRequest(limit=7, since=1.5))
    request, method, body = decode_request(frame)
    assert (request.v, request.id, request.type) == (PROTOCOL_VERSION, "r1", "node.events")
    assert method is METHODS["node.events"]
    assert body == NodeEventsRequest(limit=7, since=1.5)


def test_reply_round_trip_keeps_body_and_none_fields() -> None:
    snapshot = NodeSnapshot(
        node="n", seq=3, time=1.0, interval_s=1.0, backend="simulated", simulated=True, host=HOST
    )
    reply = decode_reply(encode_reply("r9", snapshot))
    assert reply.ok and reply.id == "r9" and reply.error is None
    again = NodeSnapshot.model_validate(reply.body)
    assert again == snapshot
    assert again.host.load_1m is None  # not available stays not available, never 0


def test_error_reply_has_code_and_message_and_no_body() -> None:
    raw = json.loads(encode_error("r2", ErrorCode.FORBIDDEN, "nope"))
    assert raw == {
        "v": PROTOCOL_VERSION,
        "id": "r2",
        "ok": False,
        "error": {"code": "forbidden", "message": "nope"},
    }


@pytest.mark.parametrize(
    ("frame", "code", "request_id"),
    [
        (b"\x00\xff garbage", ErrorCode.BAD_FRAME, None),
        (b"[1, 2, 3]", ErrorCode.BAD_FRAME, None),
        (b'{"v": 1, "id": "a"}', ErrorCode.BAD_FRAME, None),
        (b'{"v": 3, "id": "a", "type": "node.info"}', ErrorCode.UNSUPPORTED_VERSION, "a"),
        (b'{"v": 0, "id": "a", "type": "node.info"}', ErrorCode.UNSUPPORTED_VERSION, "a"),
        (b'{"v": 1, "id": "a", "type": "rm.rf"}', ErrorCode.UNKNOWN_TYPE, "a"),
        (
            b'{"v": 1, "id": "a", "type": "node.events", "body": {"limit": 0}}',
            ErrorCode.INVALID_BODY,
            "a",
        ),
        (
            b'{"v": 1, "id": "a", "type": "node.events", "body": {"limit": "many"}}',
            ErrorCode.INVALID_BODY,
            "a",
        ),
        (b'{"v": 1, "id": "", "type": "node.info"}', ErrorCode.BAD_FRAME, None),
    ],
)
def test_bad_requests_raise_the_right_code(
    frame: bytes, code: ErrorCode, request_id: str | None
) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_request(frame)
    assert err.value.code is code
    assert err.value.request_id == request_id
    assert "\n" not in err.value.message and err.value.message


def test_a_request_of_another_protocol_is_refused_in_one_line_naming_both_versions() -> None:
    with pytest.raises(ProtocolError) as err:
        decode_request(b'{"v": 7, "id": "a", "type": "node.info"}')
    assert err.value.message == (
        f"protocol version 7 is not supported: this daemon (gpud {__version__})"
        f" speaks {MIN_PROTOCOL}–{PROTOCOL_VERSION}"
    )


@pytest.mark.parametrize("version", range(MIN_PROTOCOL, PROTOCOL_VERSION + 1))
def test_every_protocol_in_the_range_is_served(version: int) -> None:
    frame = encode_request("r1", NODE_EVENTS, NodeEventsRequest(limit=7), version)
    request, _, body = decode_request(frame)
    assert request.v == version and body == NodeEventsRequest(limit=7)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"v": 1, "id": "a", "type": "node.events", "body": {"limit": 5, "later": 1}}',
        b'{"v": 1, "id": "a", "type": "node.events", "body": {"limit": 5}, "trace": "x"}',
    ],
    ids=["body", "envelope"],
)
def test_a_field_a_later_version_added_is_ignored(frame: bytes) -> None:
    _, _, body = decode_request(frame)
    assert body == NodeEventsRequest(limit=5)


def test_a_request_leaves_out_fields_at_their_default() -> None:
    """What an older daemon (strict, gpud 0.1.0) needs: a field it does not know is sent
    only when it is used."""
    launch = LaunchRequest(spec={}, nodes=[NodeRefIn(control="tcp://127.0.0.1:7711")])
    sent = json.loads(encode_request("r1", METHODS["run.launch"], launch))["body"]
    assert sent == {"spec": {}, "nodes": [{"control": "tcp://127.0.0.1:7711"}]}
    by_call = launch.model_copy(update={"start_by_call": True})
    assert json.loads(encode_request("r2", METHODS["run.launch"], by_call))["body"]["start_by_call"]


def test_invalid_body_message_names_the_field() -> None:
    with pytest.raises(ProtocolError) as err:
        decode_request(b'{"v": 1, "id": "a", "type": "node.events", "body": {"limit": 5000}}')
    assert err.value.message.startswith("body.limit:")


def test_every_method_has_a_role_and_operator_methods_are_few() -> None:
    operators = {name for name, m in METHODS.items() if m.role is Role.OPERATOR}
    assert operators == {
        "node.events.ack",
        "node.drain",
        "node.undrain",
        "node.notify.test",
        "node.gc",
        "run.launch",
        "run.join",
        "run.stop",
        "run.resume",
        "run.start",
    }
    peers = {name for name, m in METHODS.items() if m.role is Role.PEER}
    assert peers == {
        "run.part.start",
        "run.part.stop",
        "run.part.status",
        "run.part.health",
        "run.part.reserve",
        "run.part.release",
        "run.part.preflight",
        "run.gang.status",  # node N asks node 0 (issue 26 §1)
    }
    assert METHODS["node.info"].request is Empty
    assert METHODS["node.events.ack"].request is AckEventsRequest


def test_roles_allow_downwards_only() -> None:
    assert Role.OPERATOR.allows(Role.VIEWER)
    assert Role.OPERATOR.allows(Role.OPERATOR)
    assert Role.OPERATOR.allows(Role.PEER)
    assert Role.VIEWER.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR)
    assert not Role.VIEWER.allows(Role.PEER)
    # A coordinating daemon may touch run parts only: not read telemetry, not launch.
    assert Role.PEER.allows(Role.PEER)
    assert not Role.PEER.allows(Role.VIEWER)
    assert not Role.PEER.allows(Role.OPERATOR)


def test_events_decode_to_their_models_by_topic() -> None:
    event = NodeEvent(node="n", time=2.0, kind="xid", severity="critical", gpu_index=1, message="m")
    frames = encode_event(node_event_topic("n"), 5, event, now=3.0)
    decoded = decode_event(frames)
    assert decoded.topic == "node.n.event" and decoded.seq == 5 and decoded.time == 3.0
    assert decoded.body == event
    snap = NodeSnapshot(
        node="n", seq=1, time=1.0, interval_s=1.0, backend="none", simulated=False, host=HOST
    )
    assert decode_event(encode_event(hw_topic("n"), 1, snap)).body == snap


def test_event_frames_must_agree() -> None:
    frames = encode_event("hw.a", 1, Empty())
    with pytest.raises(ValueError, match="disagree"):
        decode_event([b"hw.b", frames[1]])
    with pytest.raises(ValueError, match="2 frames"):
        decode_event(frames[:1])


def test_the_audit_log_sees_webhook_urls_redacted() -> None:
    secret = "https://hooks.slack.com/services/T0/B0/s3cr3t"
    spec = {"name": "t", "script": "t.py", "notify": [{"url": secret, "format": "slack"}]}
    launch = LaunchRequest(spec=spec, nodes=[NodeRefIn(control="tcp://127.0.0.1:7711")])
    audited = launch.audited()
    assert audited["spec"]["notify"] == [{"url": "https://hooks.slack.com/…", "format": "slack"}]
    assert audited["spec"]["script"] == "t.py" and launch.spec["notify"][0]["url"] == secret
    test = NotifyTestRequest(webhook=Webhook(url=secret))
    assert test.audited()["webhook"]["url"] == "https://hooks.slack.com/…"
    assert "s3cr3t" not in json.dumps([launch.audited(), test.audited()])
    assert NotifyTestRequest().audited() == {"webhook": None}
    # A spec the daemon will refuse is audited too, whatever shape its notify: has.
    for wrong, shown in (
        ([secret], ["https://hooks.slack.com/…"]),
        (secret, "https://hooks.slack.com/…"),
        ({"url": secret, "formt": "x"}, {"url": "https://hooks.slack.com/…", "formt": "x"}),
        ([{"format": "slack"}, 42], [{"format": "slack"}, "…"]),
    ):
        bad = LaunchRequest(spec={**spec, "notify": wrong}, nodes=launch.nodes)
        assert bad.audited()["spec"]["notify"] == shown
