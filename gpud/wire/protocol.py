"""The wire protocol: every message between gpud, gpuctl, gputop and trainers.

Control (ROUTER/DEALER) carries one request envelope and one reply envelope:

    request  {"v": 1, "id": "…", "type": "node.hw", "body": {…}}
    reply    {"v": 1, "id": "…", "ok": true,  "body": {…}}
             {"v": 1, "id": "…", "ok": false, "error": {"code": "forbidden", "message": "…"}}

Events (PUB/SUB) are two frames: the topic, then `{"v", "topic", "seq", "time", "body"}`.

Compatibility (docs/DESIGN.md, "Compatibility"): every message is read leniently: a field
the reader does not know is ignored, a field it knows that is missing takes its default,
and a kind it does not know (a node event's, a trainer message's) is skipped and counted.
Types, sizes and patterns stay checked, and so does what a person wrote (a run spec). A
sender leaves out every field at its default, so an older peer sees a field added since
only when it is used; a feature an older peer lacks is used only once its protocol
version says it has it. `PROTOCOL_VERSION` moves on its own, apart from the package
version; a daemon serves requests of `MIN_PROTOCOL` to `PROTOCOL_VERSION`.

This module declares every method once (`METHODS`: name, request, reply, role) and
encodes and decodes requests, replies and events. The envelopes and versions are
`gpud.wire.envelope`; the bodies are `gpud.wire.node_messages` and `gpud.wire.run_messages`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from gpud.model.run import AttemptRecord, HealthSummary, RunEvent
from gpud.model.snapshot import NodeEvent, NodeSnapshot, Reading, known_node_events
from gpud.security.roles import Role
from gpud.wire.envelope import (
    MIN_PROTOCOL,
    PROTOCOL_VERSION,
    ErrorCode,
    ErrorInfo,
    Event,
    Message,
    ProtocolError,
    Reply,
    Request,
    unsupported_version,
)
from gpud.wire.node_messages import (
    AckEventsReply,
    AckEventsRequest,
    DrainReply,
    DrainRequest,
    Empty,
    GcReply,
    GcRequest,
    NodeEventsReply,
    NodeEventsRequest,
    NodeInfo,
    NotifyTestReply,
    NotifyTestRequest,
    UndrainRequest,
    UsageReply,
    UsageRequest,
)
from gpud.wire.run_messages import (
    GangStatus,
    JoinReply,
    JoinRequest,
    LaunchReply,
    LaunchRequest,
    ListRequest,
    LogChunk,
    LogsRequest,
    MetricsReply,
    MetricsRequest,
    PartHealth,
    PartPreflight,
    PartPreflightRequest,
    PartReleaseRequest,
    PartReservation,
    PartReserveRequest,
    PartStartRequest,
    PartStatusRequest,
    PartStopRequest,
    ResumeRequest,
    RunList,
    RunRef,
    RunStartRequest,
    RunStatus,
    RunSummary,
    StopRequest,
)

RequestT = TypeVar("RequestT", bound=Message)
ReplyT = TypeVar("ReplyT", bound=BaseModel)


@dataclass(frozen=True)
class Method(Generic[RequestT, ReplyT]):
    """One request type: its body, its reply and the role it needs.

    Declared once here (clients and the daemon share it); the daemon binds one handler to
    each (`gpud.wire.control.Registry` refuses to start with one unbound), and
    `Client.call(method, body)` returns the reply model.
    """

    name: str
    request: type[RequestT]
    reply: type[ReplyT]
    role: Role
    summary: str


NODE_INFO = Method("node.info", Empty, NodeInfo, Role.VIEWER, "who the daemon is")
NODE_HW = Method("node.hw", Empty, NodeSnapshot, Role.VIEWER, "the latest hardware snapshot")
NODE_EVENTS = Method(
    "node.events", NodeEventsRequest, NodeEventsReply, Role.VIEWER, "recent hw events"
)
NODE_EVENTS_ACK = Method(
    "node.events.ack",
    AckEventsRequest,
    AckEventsReply,
    Role.OPERATOR,
    "acknowledge XID events after they were handled",
)
NODE_DRAIN = Method(
    "node.drain", DrainRequest, DrainReply, Role.OPERATOR, "no new work on the node or GPUs"
)
NODE_UNDRAIN = Method("node.undrain", UndrainRequest, DrainReply, Role.OPERATOR, "new work again")
NOTIFY_TEST = Method(
    "node.notify.test",
    NotifyTestRequest,
    NotifyTestReply,
    Role.OPERATOR,
    "send a test alert to the webhooks and say what each answered",
)
NODE_GC = Method(
    "node.gc", GcRequest, GcReply, Role.OPERATOR, "apply retention now (or say what it would)"
)
NODE_USAGE = Method(
    "node.usage", UsageRequest, UsageReply, Role.VIEWER, "GPU-seconds of each run here"
)
RUN_LAUNCH = Method("run.launch", LaunchRequest, LaunchReply, Role.OPERATOR, "create, start a run")
RUN_JOIN = Method("run.join", JoinRequest, JoinReply, Role.OPERATOR, "start this node's part")
RUN_STOP = Method("run.stop", StopRequest, RunSummary, Role.OPERATOR, "stop a run")
RUN_RESUME = Method("run.resume", ResumeRequest, RunSummary, Role.OPERATOR, "new attempt")
RUN_START = Method(
    "run.start", RunStartRequest, LaunchReply, Role.OPERATOR, "first attempt, once all joined"
)
RUN_LIST = Method("run.list", ListRequest, RunList, Role.VIEWER, "runs with a part here")
RUN_STATUS = Method("run.status", RunRef, RunStatus, Role.VIEWER, "one run in detail")
RUN_LOGS = Method("run.logs", LogsRequest, LogChunk, Role.VIEWER, "captured output of a part")
RUN_METRICS = Method("run.metrics", MetricsRequest, MetricsReply, Role.VIEWER, "metric history")
RUN_HEALTH = Method("run.health", RunRef, HealthSummary, Role.VIEWER, "latest health summary")
PART_START = Method(
    "run.part.start", PartStartRequest, AttemptRecord, Role.PEER, "coordinator: new attempt"
)
PART_HEALTH = Method(
    "run.part.health", PartStatusRequest, PartHealth, Role.PEER, "coordinator: this part's ranks"
)
PART_RESERVE = Method(
    "run.part.reserve", PartReserveRequest, PartReservation, Role.PEER, "coordinator: GPUs"
)
PART_RELEASE = Method(
    "run.part.release", PartReleaseRequest, PartReservation, Role.PEER, "coordinator: GPUs"
)
PART_STOP = Method("run.part.stop", PartStopRequest, AttemptRecord, Role.PEER, "coordinator")
PART_STATUS = Method("run.part.status", PartStatusRequest, AttemptRecord, Role.PEER, "coordinator")
PART_PREFLIGHT = Method(
    "run.part.preflight", PartPreflightRequest, PartPreflight, Role.PEER, "coordinator: check"
)
GANG_STATUS = Method(
    "run.gang.status", PartStatusRequest, GangStatus, Role.PEER, "node N: the run as node 0 has it"
)

METHODS: dict[str, Method[Any, Any]] = {
    m.name: m
    for m in (
        NODE_INFO,
        NODE_HW,
        NODE_EVENTS,
        NODE_EVENTS_ACK,
        NODE_DRAIN,
        NODE_UNDRAIN,
        NOTIFY_TEST,
        NODE_GC,
        NODE_USAGE,
        RUN_LAUNCH,
        RUN_JOIN,
        RUN_STOP,
        RUN_RESUME,
        RUN_START,
        RUN_LIST,
        RUN_STATUS,
        RUN_LOGS,
        RUN_METRICS,
        RUN_HEALTH,
        PART_START,
        PART_HEALTH,
        PART_RESERVE,
        PART_RELEASE,
        PART_STOP,
        PART_STATUS,
        PART_PREFLIGHT,
        GANG_STATUS,
    )
}


# --------------------------------------------------------------------------- codec


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line naming the first offending field and what was expected."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    where = f"{prefix}.{where}" if prefix and where else (prefix or where)
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where or 'message'}: {first['msg']}{extra}"


def unexpected_error_line(exc: BaseException) -> str:
    """One line for an exception a validator raised that is not a validation error
    (a regex nested too deep, a number too large to convert): no traceback, no internals."""
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}"


def decode_request(frame: bytes) -> tuple[Request, Method[Any, Any], Message]:
    """Parse and validate one request frame, or raise ProtocolError.

    Whatever the validation raises becomes an error reply with one line: a ValidationError
    names the field; anything else (RecursionError, OverflowError, ...) names itself.
    """
    try:
        req = Request.model_validate_json(frame)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, describe_validation_error(exc)) from None
    except Exception as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, unexpected_error_line(exc)) from None
    if not MIN_PROTOCOL <= req.v <= PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, unsupported_version(req.v), req.id)
    method = METHODS.get(req.type)
    if method is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown request type {req.type!r}", req.id)
    try:
        body = method.request.model_validate(req.body)
    except ValidationError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_BODY, describe_validation_error(exc, "body"), req.id
        ) from None
    except Exception as exc:
        raise ProtocolError(
            ErrorCode.INVALID_BODY, f"body: {unexpected_error_line(exc)}", req.id
        ) from None
    return req, method, body


def encode_request(
    request_id: str, method: Method[Any, Any], body: Message, version: int = PROTOCOL_VERSION
) -> bytes:
    """A request frame at protocol `version`. Fields at their default are left out: the
    receiver fills them in, and an older one never sees a field it does not know unless it
    is used."""
    return (
        Request(
            v=version,
            id=request_id,
            type=method.name,
            body=body.model_dump(mode="json", exclude_defaults=True),
        )
        .model_dump_json()
        .encode()
    )


def encode_reply(request_id: str | None, body: BaseModel) -> bytes:
    return Reply(v=PROTOCOL_VERSION, id=request_id, ok=True, body=body).model_dump_json().encode()


def encode_error(request_id: str | None, code: ErrorCode, message: str) -> bytes:
    return (
        Reply(
            v=PROTOCOL_VERSION,
            id=request_id,
            ok=False,
            error=ErrorInfo(code=code.value, message=message),
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )


def decode_reply(frame: bytes) -> Reply:
    """Parse a reply envelope (tolerantly). Raises ValidationError on garbage."""
    return Reply.model_validate_json(frame)


# --------------------------------------------------------------------------- events


def hw_topic(node: str) -> str:
    return f"hw.{node}"


def node_event_topic(node: str) -> str:
    return f"node.{node}.event"


def run_topic(run_id: str, kind: str) -> str:
    """`run.<id>.state|metrics|health|log|event`."""
    return f"run.{run_id}.{kind}"


class RunLogEvent(Reading):
    """Body of `run.<id>.log`: new lines of one node's part."""

    node: str
    node_rank: int
    attempt: int
    offset: int
    lines: list[str]


class RunMetricsEvent(Reading):
    """Body of `run.<id>.metrics`: new metric points of a run."""

    run_id: str
    attempt: int
    points: list[dict[str, Any]]


def _event_body_model(topic: str) -> type[BaseModel] | None:
    if topic.startswith("hw."):
        return NodeSnapshot
    if topic.startswith("sum."):
        # Only views of many nodes read briefs: gpuctl's start-up does not pay for them.
        from gpud.wire.brief import NodeBrief

        return NodeBrief
    if topic.startswith("node.") and topic.endswith(".event"):
        return NodeEvent
    if topic.startswith("run."):
        kind = topic.rsplit(".", 1)[-1]
        run_bodies: dict[str, type[BaseModel]] = {
            "state": RunSummary,
            "log": RunLogEvent,
            "metrics": RunMetricsEvent,
            "event": RunEvent,
            "health": HealthSummary,
        }
        return run_bodies.get(kind)
    return None


def encode_event(topic: str, seq: int, body: BaseModel, now: float | None = None) -> list[bytes]:
    event = Event(
        v=PROTOCOL_VERSION,
        topic=topic,
        seq=seq,
        time=time.time() if now is None else now,
        body=body,
    )
    return [topic.encode(), event.model_dump_json().encode()]


class UnknownKind(ValueError):
    """An event of a kind this reader does not know (a newer daemon's): skip it, count it."""


def decode_event(frames: list[bytes]) -> Event:
    """Parse a two-frame event; the body becomes its model when the topic is known. A node
    event of a kind this code does not know raises `UnknownKind`."""
    if len(frames) != 2:
        raise ValueError(f"an event has 2 frames, got {len(frames)}")
    event = Event.model_validate_json(frames[1])
    if event.topic != frames[0].decode(errors="replace"):
        raise ValueError("event topic frame and envelope disagree")
    model = _event_body_model(event.topic)
    if model is NodeEvent and not known_node_events([event.body]):
        raise UnknownKind(f"node event of unknown kind {event.body.get('kind')!r}")
    if model is not None:
        event = event.model_copy(update={"body": model.model_validate(event.body)})
    return event
