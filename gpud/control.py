"""The control socket: decode, authorize, dispatch and answer requests.

One ROUTER socket; every frame that arrives gets exactly one outcome: a reply, an error
reply, or (when it cannot be answered at all) a logged drop. Nothing a client sends can
raise out of here, block the loop, or make the daemon keep memory: frames over
MAX_FRAME_BYTES are refused by the socket itself, replies to vanished or slow peers are
dropped by ROUTER at its high-water mark, and no per-client state is kept.

Sync handlers run inline (the common, fast case); a handler that returns an awaitable
runs as a task and replies when it finishes, so a slow request never holds up others.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq
import zmq.asyncio
from pydantic import BaseModel

from gpud.audit import AuditLog
from gpud.auth import parse_user_id
from gpud.protocol import (
    MAX_FRAME_BYTES,
    ErrorCode,
    Message,
    Method,
    ProtocolError,
    Role,
    decode_request,
    encode_error,
    encode_reply,
)

log = logging.getLogger("gpud.control")

#: Requests handled per wake-up before yielding to the rest of the loop.
BATCH = 256


@dataclass(frozen=True)
class Caller:
    role: Role
    name: str


@dataclass(frozen=True)
class _Accepted:
    """A request that passed decoding and authorization, on its way to a reply."""

    identity: bytes
    id: str
    method: Method
    body: Message
    caller: Caller


HandlerResult = BaseModel | Awaitable[BaseModel]
Handler = Callable[[Message, Caller], HandlerResult]

INSECURE_CALLER = Caller(Role.OPERATOR, "insecure-loopback")

M = TypeVar("M", bound=Message)


def typed(model: type[M], handler: Callable[[M, Caller], HandlerResult]) -> Handler:
    """Adapt a handler of one request model to the generic signature (checked at runtime)."""

    def call(body: Message, caller: Caller) -> HandlerResult:
        if not isinstance(body, model):
            raise ProtocolError(ErrorCode.INVALID_BODY, f"expected a {model.__name__} body")
        return handler(body, caller)

    return call


def configure_router(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sock.setsockopt(zmq.RCVHWM, 1000)
    sock.linger = 0


class ControlServer:
    """Owns the ROUTER socket. `handlers` maps request type → handler."""

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        handlers: Mapping[str, Handler],
        audit: AuditLog,
        secure: bool,
    ) -> None:
        self._async = sock
        # The loop waits on the asyncio socket; the work is done with non-blocking calls on a
        # plain shadow of it, which costs far less per message than awaiting each one.
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._handlers = handlers
        self._audit = audit
        self._secure = secure
        self._tasks: set[asyncio.Task[None]] = set()
        self.served = 0

    async def serve(self) -> None:
        while True:
            await self._async.poll()
            for _ in range(BATCH):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self.handle(frames)

    # ------------------------------------------------------------------ one request

    def handle(self, frames: list[zmq.Frame]) -> None:
        if len(frames) < 2:
            log.debug("dropped a message without a routing id")
            return
        identity = frames[0].bytes
        payload_frames = [f for f in frames[1:] if len(f)]  # REQ clients add an empty frame
        if len(payload_frames) != 1:
            self._send(identity, encode_error(None, ErrorCode.BAD_FRAME, "send exactly 1 frame"))
            return
        frame = payload_frames[0]
        caller = self._caller(frame)
        if caller is None:
            log.warning("dropped a message without a known User-Id")
            return
        try:
            request, method, body = decode_request(frame.bytes)
        except ProtocolError as exc:
            self._send(identity, encode_error(exc.request_id, exc.code, exc.message))
            return
        if not caller.role.allows(method.role):
            self._send(
                identity,
                encode_error(
                    request.id,
                    ErrorCode.FORBIDDEN,
                    f"{method.name} needs the {method.role.value} role; your key "
                    f"({caller.name}) is a {caller.role.value}",
                ),
            )
            return
        self._dispatch(_Accepted(identity, request.id, method, body, caller))

    def _caller(self, frame: zmq.Frame) -> Caller | None:
        if not self._secure:
            return INSECURE_CALLER
        try:
            user_id = frame.get("User-Id")
        except zmq.ZMQError:
            return None
        parsed = parse_user_id(user_id if isinstance(user_id, str) else None)
        return Caller(*parsed) if parsed else None

    def _dispatch(self, req: _Accepted) -> None:
        handler = self._handlers.get(req.method.name)
        if handler is None:
            message = f"{req.method.name} is not served"
            self._send(req.identity, encode_error(req.id, ErrorCode.UNAVAILABLE, message))
            return
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

    def _finish(self, req: _Accepted, outcome: BaseModel | Exception) -> None:
        name = req.method.name
        if isinstance(outcome, ProtocolError):
            reply = encode_error(req.id, outcome.code, outcome.message)
            ok, detail = False, outcome.message
        elif isinstance(outcome, Exception):
            log.exception("%s failed", name, exc_info=outcome)
            message = f"internal error in {name}: {type(outcome).__name__}: {outcome}"
            reply = encode_error(req.id, ErrorCode.INTERNAL, message + " (see the gpud log)")
            ok, detail = False, message
        else:
            reply = encode_reply(req.id, outcome)
            ok, detail = True, None
        if req.method.role is Role.OPERATOR:
            self._audit.record(
                req.caller.name,
                req.caller.role.value,
                name,
                req.body.model_dump(mode="json"),
                ok,
                detail,
            )
        self._send(req.identity, reply)

    def _send(self, identity: bytes, payload: bytes) -> None:
        try:
            self._sock.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # peer gone or over its high-water mark: its loss
            log.debug("reply dropped: %s", exc)
        self.served += 1
