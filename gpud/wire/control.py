"""The control socket: decode, authorize, dispatch and answer requests.

One ROUTER socket; every frame that arrives gets exactly one outcome: a reply, an error
reply, or (when it cannot be answered at all) a logged drop. Nothing a client sends can
raise out of here, block the loop, or make the daemon keep memory: a frame over
MAX_FRAME_BYTES is refused in a reply and a log line that name the limit (the socket reads
none over READ_FRAME_BYTES: it drops the connection), a connection with more than its
allowance in flight (one huge multipart message) is cut by the guard, replies to vanished
or slow peers are dropped by ROUTER at its high-water mark, and no per-client state is
kept.

Every method is bound to its handler exactly once (`Registry`); a method without one is
an error when the daemon starts, never a runtime "not served". The caller's role is looked
up for every request, so a revoked key loses its rights on open connections too.

Operator methods are audited: each accepted one individually, refusals (including a key
without the role for the method) in bursts (`gpud.security.audit`); warnings about a revoked key
still asking come once per interval with a count (`gpud.security.bursts`).

Sync handlers run inline (the common, fast case); a handler that returns an awaitable
runs as a task and replies when it finishes, so a slow request never holds up others.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic

import zmq
from pydantic import BaseModel

from gpud.security.audit import AuditLog
from gpud.security.auth import Authorizer, Caller
from gpud.security.bursts import ThrottledLog
from gpud.security.guard import ConnectionGuard, Limits, user_id
from gpud.security.roles import Role
from gpud.wire.drain import Frames, SocketDrain
from gpud.wire.envelope import (
    MAX_FRAME_BYTES,
    READ_FRAME_BYTES,
    ErrorCode,
    Message,
    ProtocolError,
    too_large,
)
from gpud.wire.protocol import (
    METHODS,
    Method,
    ReplyT,
    RequestT,
    decode_request,
    encode_error,
    encode_reply,
)

log = logging.getLogger("gpud.control")
#: A revoked key on an open connection asks as fast as it likes: one line per interval.
_revoked = ThrottledLog(log)
_oversize = ThrottledLog(log)

#: Requests handled per wake-up before yielding to the rest of the loop.
BATCH = 256
#: What one connection, and all of them, may have in flight (read by libzmq, not yet
#: handed over): two largest frames and some slack; a multipart message past this is cut.
CONTROL_LIMITS = Limits(
    in_flight_bytes=2 * MAX_FRAME_BYTES + 2**20,
    total_in_flight_bytes=64 * 2**20,
)

INSECURE_CALLER = Caller(Role.OPERATOR, "insecure-loopback")

HandlerResult = BaseModel | Awaitable[BaseModel]


@dataclass(frozen=True)
class Binding(Generic[RequestT, ReplyT]):
    """A method and the one handler that serves it."""

    method: Method[RequestT, ReplyT]
    handler: Callable[[RequestT, Caller], ReplyT | Awaitable[ReplyT]]


def bind(
    method: Method[RequestT, ReplyT],
    handler: Callable[[RequestT, Caller], ReplyT | Awaitable[ReplyT]],
) -> Binding[RequestT, ReplyT]:
    """Bind `handler` to `method` (type-checked: the handler takes the method's request
    model and returns its reply model)."""
    return Binding(method, handler)


class IncompleteRegistry(Exception):
    """A method has no handler, or two."""


class Registry:
    """Every method of the protocol, each with exactly one handler."""

    def __init__(self, bindings: Iterable[Binding[Any, Any]]) -> None:
        self._by_name: dict[str, Binding[Any, Any]] = {}
        for binding in bindings:
            name = binding.method.name
            if name in self._by_name:
                raise IncompleteRegistry(f"{name} is bound twice")
            if METHODS.get(name) is not binding.method:
                raise IncompleteRegistry(f"{name} is not a method of the protocol")
            self._by_name[name] = binding
        missing = sorted(set(METHODS) - set(self._by_name))
        if missing:
            raise IncompleteRegistry(f"no handler for {', '.join(missing)}")

    def handler(self, method: Method[Any, Any]) -> Callable[[Any, Caller], HandlerResult]:
        return self._by_name[method.name].handler


def configure_router(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.MAXMSGSIZE, READ_FRAME_BYTES)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sock.setsockopt(zmq.RCVHWM, 1000)
    sock.setsockopt(zmq.LINGER, 0)


@dataclass(frozen=True)
class _Accepted:
    """A request that passed decoding and authorization, on its way to a reply."""

    identity: bytes
    id: str
    method: Method[Any, Any]
    body: Message
    caller: Caller


class ControlServer:
    """Owns the ROUTER socket (a plain, non-asyncio one, read through a `SocketDrain`)."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        registry: Registry,
        audit: AuditLog,
        authorizer: Authorizer | None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self._sock = sock
        self._registry = registry
        self._audit = audit
        self._authorizer = authorizer  # None: --insecure, everyone is the local operator
        self._guard = guard
        self._drain = SocketDrain(sock, self.handle, BATCH)
        self._tasks: set[asyncio.Task[None]] = set()
        self.served = 0
        self.served_by: Counter[str] = Counter()  # replies, by method (for /metrics)

    async def serve(self) -> None:
        await self._drain.serve()

    # ------------------------------------------------------------------ one request

    def handle(self, frames: Frames) -> None:
        if self._guard is not None:
            self._guard.received(frames)
        if len(frames) < 2:
            log.debug("dropped a message without a routing id")
            return
        identity = frames[0].bytes
        payload_frames = [f for f in frames[1:] if len(f)]  # REQ clients add an empty frame
        if len(payload_frames) != 1:
            self._send(identity, encode_error(None, ErrorCode.BAD_FRAME, "send exactly 1 frame"))
            return
        frame = payload_frames[0]
        if len(frame) > MAX_FRAME_BYTES:
            sender = self._caller(frame)
            name = sender.name if sender is not None else "a revoked key"
            message = too_large(len(frame))
            _oversize.warning(name, f"refused a request from {name}: {message}")
            self._send(identity, encode_error(None, ErrorCode.INVALID_BODY, message))
            return
        try:
            request, method, body = decode_request(frame.bytes)
        except ProtocolError as exc:
            self._send(identity, encode_error(exc.request_id, exc.code, exc.message))
            return
        caller = self._caller(frame)
        if caller is None:
            # Authorized at the handshake, revoked since: refused, like any unknown key.
            key = user_id(frame) or "?"
            _revoked.warning(
                key, f"refused {method.name} from a key that is no longer authorized ({key[:8]}…)"
            )
            message = (
                "your key is not authorized on this node (any more): ask its operator "
                "to `gpuctl keys authorize` it"
            )
            if method.role is Role.OPERATOR:
                who = Caller(Role.VIEWER, f"revoked key {key[:8]}…")
                self._audit_refusal(method, who, body, ErrorCode.FORBIDDEN, message, "none")
            self._send(identity, encode_error(request.id, ErrorCode.FORBIDDEN, message))
            return
        if not caller.role.allows(method.role):
            message = (
                f"{method.name} needs the {method.role.value} role; your key "
                f"({caller.name}) is a {caller.role.value}"
            )
            if method.role is Role.OPERATOR:
                self._audit_refusal(method, caller, body, ErrorCode.FORBIDDEN, message)
            self._send(identity, encode_error(request.id, ErrorCode.FORBIDDEN, message))
            return
        req = _Accepted(identity, request.id, method, body, caller)
        self._dispatch(req)

    def _caller(self, frame: zmq.Frame) -> Caller | None:
        if self._authorizer is None:
            return INSECURE_CALLER
        return self._authorizer.caller(user_id(frame))

    def _audit_refusal(
        self,
        method: Method[Any, Any],
        caller: Caller,
        body: Message,
        code: ErrorCode,
        detail: str,
        role: str | None = None,
    ) -> None:
        self._audit.record(
            caller.name,
            role or caller.role.value,
            method.name,
            body.audited(),
            False,
            detail,
            code.value,
        )

    def _dispatch(self, req: _Accepted) -> None:
        handler = self._registry.handler(req.method)
        try:
            result = handler(req.body, req.caller)
        except Exception as exc:
            self._finish(req, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._finish_later(req, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._finish(req, result)

    async def _finish_later(self, req: _Accepted, pending: Awaitable[BaseModel]) -> None:
        try:
            outcome: BaseModel | Exception = await pending
        except Exception as exc:
            outcome = exc
        self._finish(req, outcome)
        self._drain.poke()  # this send may have taken the wake-up the drain waits for

    def _finish(self, req: _Accepted, outcome: BaseModel | Exception) -> None:
        name = req.method.name
        self.served_by[name] += 1
        code: ErrorCode | None = None
        if isinstance(outcome, ProtocolError):
            reply = encode_error(req.id, outcome.code, outcome.message)
            code, detail = outcome.code, outcome.message
        elif isinstance(outcome, Exception):
            log.exception("%s failed", name, exc_info=outcome)
            message = f"internal error in {name}: {type(outcome).__name__}: {outcome}"
            reply = encode_error(req.id, ErrorCode.INTERNAL, message + " (see the gpud log)")
            code, detail = ErrorCode.INTERNAL, message
        else:
            reply = encode_reply(req.id, outcome)
            detail = None
        if req.method.role is Role.OPERATOR:
            self._audit.record(
                req.caller.name,
                req.caller.role.value,
                name,
                req.body.audited(),
                code is None,
                detail,
                code.value if code is not None else None,
            )
        self._send(req.identity, reply)

    def _send(self, identity: bytes, payload: bytes) -> None:
        try:
            self._sock.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # peer gone or over its high-water mark: its loss
            log.debug("reply dropped: %s", exc)
        self.served += 1
