"""The one client of a gpud daemon: DEALER for requests, SUB for events, with timeouts.

gpuctl and gputop both use it. A `NodeTarget` says where a daemon is and which server key
is pinned for it; `known_targets()` is the one list of nodes both use when not told which
(every node of the known-nodes file). `Client` turns requests into typed replies and
failures into two exception types a front end can map to exit codes: `Unreachable` (no
answer, key refused, wrong pinned key) and `RequestFailed` (the daemon answered with an
error).

Versions: every request carries the protocol version it is written in, every reply the
daemon's newest. A client starts at its own newest; a daemon that refuses it as too new
(`unsupported_version`, an older gpud) has said which it speaks in that refusal, before
doing anything, so the client asks again in that version and keeps it for the
connection — if it still speaks it (`MIN_PROTOCOL`); otherwise, or when the daemon is
too new for the client, `IncompatibleVersion` names both. `protocol()` tells a caller
which the daemon speaks, for a feature an older daemon lacks.

The socket monitor is what makes the failures precise: a CURVE handshake that the daemon
rejects, or one that fails because the pinned key is wrong, is reported at once instead of
ending in an anonymous timeout.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import zmq
from pydantic import ValidationError

from gpud import __version__
from gpud.model.endpoints import AddressError, events_endpoint_for, parse_endpoint
from gpud.model.run import HealthSummary
from gpud.model.snapshot import NodeSnapshot
from gpud.security.keys import KeyFileError, KeyPair, load_client_keypair
from gpud.security.known_nodes import KnownNodes, load_known_nodes
from gpud.wire.envelope import (
    MAX_FRAME_BYTES,
    MIN_PROTOCOL,
    PROTOCOL_VERSION,
    ErrorCode,
    Event,
    Message,
    Reply,
    speaks,
    too_large,
)
from gpud.wire.node_messages import (
    AckEventsReply,
    AckEventsRequest,
    Empty,
    NodeEventsReply,
    NodeEventsRequest,
    NodeInfo,
)
from gpud.wire.protocol import (
    NODE_EVENTS,
    NODE_EVENTS_ACK,
    NODE_HW,
    NODE_INFO,
    RUN_HEALTH,
    RUN_LIST,
    RUN_LOGS,
    RUN_METRICS,
    RUN_RESUME,
    RUN_STATUS,
    RUN_STOP,
    Method,
    ReplyT,
    RequestT,
    UnknownKind,
    decode_event,
    decode_reply,
    encode_request,
)
from gpud.wire.run_messages import (
    ListRequest,
    LogChunk,
    LogsRequest,
    MetricsReply,
    MetricsRequest,
    ResumeRequest,
    RunList,
    RunRef,
    RunStatus,
    RunSummary,
    StopRequest,
)

DEFAULT_TIMEOUT_S = 5.0


class ClientError(Exception):
    """Base of what a client call can raise; `str()` is one line for a person."""


class ConfigError(ClientError):
    """The client's own set-up is wrong (no key known for a node, bad address)."""


class UnknownNode(ConfigError):
    """No server key is known for the address: this client has never seen that node."""


class Unreachable(ClientError):
    """The node did not answer, or refused our key, or its key is not the pinned one."""


class RequestFailed(ClientError):
    """The daemon answered with an error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


class IncompatibleVersion(ClientError):
    """The daemon and this client share no protocol version: one line naming both."""


@dataclass(frozen=True)
class NodeTarget:
    """Where a daemon is and how to authenticate to it."""

    control: str
    server_key: bytes | None  # None: the daemon runs --insecure
    events: str | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.control.removeprefix("tcp://")


def resolve_target(address: str, known: KnownNodes | None = None) -> NodeTarget:
    """Turn `HOST:PORT` (or an endpoint) into a target with its pinned server key."""
    try:
        control = parse_endpoint(address)
        known = known if known is not None else load_known_nodes()
    except AddressError as exc:
        raise ConfigError(str(exc)) from None
    entry = known.find(control)
    if entry is None:
        raise UnknownNode(
            f"no server key is known for {address}: a local daemon records itself when it "
            f"starts; for a remote one run `gpuctl keys trust {address} SERVER_KEY`"
        )
    if not entry.insecure and not entry.server_key:
        raise ConfigError(f"the known-nodes entry for {address} has no server key")
    return NodeTarget(
        control=control,
        server_key=None if entry.insecure else (entry.server_key or "").encode("ascii"),
        events=entry.events,
        name=entry.name,
    )


def known_targets(known: KnownNodes | None = None) -> list[NodeTarget]:
    """Every node of the known-nodes file a client can talk to (its server key pinned, or
    insecure), in the file's order: the nodes gpuctl and gputop talk to when not told which.

    ConfigError, saying how to get one, when there is none.
    """
    try:
        known = known if known is not None else load_known_nodes()
    except AddressError as exc:
        raise ConfigError(str(exc)) from None
    targets = [
        NodeTarget(
            control=entry.control,
            server_key=None if entry.insecure else (entry.server_key or "").encode("ascii"),
            events=entry.events,
            name=entry.name,
        )
        for entry in known.nodes
        if entry.insecure or entry.server_key
    ]
    if not targets:
        raise ConfigError(
            "no nodes known yet: start a local daemon (`gpud serve` or `gpud demo`), "
            "or pin a remote one with `gpuctl keys trust HOST:PORT SERVER_KEY`"
        )
    return targets


def _configure_curve(sock: zmq.Socket[bytes], target: NodeTarget, keys: KeyPair | None) -> None:
    if target.server_key is None:
        return
    if keys is None or keys.secret is None:
        raise ConfigError("no client key yet: create one with `gpuctl keys create`")
    sock.curve_serverkey = target.server_key
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


_monitor_ids = itertools.count()


class _HandshakeWatch:
    """Reads a socket's monitor and turns connection trouble into one sentence."""

    def __init__(self, sock: zmq.Socket[bytes], target: NodeTarget) -> None:
        self._target = target
        address = f"inproc://gpud-monitor-{os.getpid()}-{next(_monitor_ids)}-{uuid.uuid4().hex}"
        self.socket = sock.get_monitor_socket(addr=address)
        self.connected = False
        self.refused = False
        self.fatal: str | None = None

    def drain(self) -> None:
        while self.socket.poll(0):
            frames = self.socket.recv_multipart()
            # libzmq's monitor frame: a 16-bit event id, then a 32-bit value. Decoded here
            # rather than with zmq.utils.monitor, which imports asyncio (and ssl): 25 ms of
            # every gpuctl start.
            event = int.from_bytes(frames[0][:2], "little")
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.fatal = (
                    f"{self._target.label} refused our key: it is not authorized there "
                    "(run `gpuctl keys show` and ask its operator to `gpuctl keys authorize` it)"
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self._target.server_key:
                self.fatal = (
                    f"handshake with {self._target.label} failed: its key does not match the "
                    "pinned server key (re-pin with `gpuctl keys trust`)"
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                mode = "without" if self._target.server_key is None else "with"
                self.fatal = (
                    f"{self._target.label} does not speak the protocol we tried ({mode} CURVE "
                    "encryption): is it a gpud of this version, started the way nodes.json says?"
                )
            elif event == zmq.EVENT_CONNECT_RETRIED and not self.connected:
                self.refused = True

    def reason(self, timeout_s: float) -> str:
        self.drain()
        if self.fatal:
            return self.fatal
        if self.refused:
            return f"nothing is listening at {self._target.label} (is gpud running there?)"
        return f"{self._target.label} did not answer within {timeout_s:g}s"

    def close(self) -> None:
        self.socket.close(linger=0)


class Client:
    """Requests to one daemon. Not thread-safe: one Client per thread."""

    def __init__(
        self,
        target: NodeTarget,
        keys: KeyPair | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._ctx = context or zmq.Context.instance()
        if keys is None and target.server_key is not None:
            try:
                keys = load_client_keypair()
            except KeyFileError as exc:
                raise ConfigError(str(exc)) from None
        self._keys = keys
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        _configure_curve(self._sock, target, keys)
        self._watch = _HandshakeWatch(self._sock, target)
        self._sock.connect(target.control)
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._watch.socket, zmq.POLLIN)
        #: The daemon's newest protocol, from its latest reply (None: not heard yet).
        self.daemon_protocol: int | None = None

    # ----------------------------------------------------------------- requests

    @property
    def version(self) -> int:
        """The protocol this client writes its requests in: its own newest, or the
        daemon's when that is older."""
        return min(PROTOCOL_VERSION, self.daemon_protocol or PROTOCOL_VERSION)

    def protocol(self) -> int:
        """The newest protocol the daemon speaks (asks `node.info` if nothing said it yet)."""
        if self.daemon_protocol is None:
            self.node_info()
        assert self.daemon_protocol is not None
        return self.daemon_protocol

    def call(
        self,
        method: Method[RequestT, ReplyT],
        body: RequestT | None = None,
        timeout_s: float | None = None,
    ) -> ReplyT:
        """Send one request and wait for its reply; returns the method's reply model."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        message = body if body is not None else Empty()
        sent = self.version
        reply = self._exchange(method, message, sent, deadline, timeout)
        if self._refused_version(reply) and MIN_PROTOCOL <= reply.v < sent:
            # An older daemon refused the version before doing anything: ask in its own.
            reply = self._exchange(method, message, reply.v, deadline, timeout)
        if self._refused_version(reply):
            said = reply.error.message if reply.error else "unsupported protocol version"
            if reply.v < sent:
                said = f"it runs a gpud that speaks protocol {reply.v}"
            raise IncompatibleVersion(f"{said}; this client (gpud {__version__}) speaks {speaks()}")
        if not reply.ok:
            error = reply.error
            code = error.code if error else ErrorCode.INTERNAL.value
            said = error.message if error else "the daemon reported an error"
            if code == ErrorCode.UNKNOWN_TYPE.value:  # a request newer than the daemon
                said += f": that gpud is older than this client (gpud {__version__}); upgrade it"
                said += f" for {method.name}"
            raise RequestFailed(code, said)
        try:
            return method.reply.model_validate(reply.body)
        except ValidationError as exc:
            raise RequestFailed(
                ErrorCode.INTERNAL.value,
                f"unexpected reply to {method.name}: {exc.errors()[0]['msg']}",
            ) from None

    @staticmethod
    def _refused_version(reply: Reply) -> bool:
        return (
            not reply.ok
            and reply.error is not None
            and reply.error.code == ErrorCode.UNSUPPORTED_VERSION.value
        )

    def _exchange(
        self, method: Method[Any, Any], body: Message, version: int, deadline: float, timeout: float
    ) -> Reply:
        """Send one request in protocol `version` and wait for the reply with its id."""
        request_id = f"{self._prefix}-{next(self._ids)}"
        frame = encode_request(request_id, method, body, version)
        if len(frame) > MAX_FRAME_BYTES:  # refused at once, not sent to be dropped
            raise RequestFailed(ErrorCode.INVALID_BODY.value, too_large(len(frame), method.name))
        self._sock.send(frame)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Unreachable(self._watch.reason(timeout))
            ready = dict(self._poller.poll(max(1, int(remaining * 1000))))
            if self._watch.socket in ready:
                self._watch.drain()
                if self._watch.fatal:
                    raise Unreachable(self._watch.fatal)
                if self._watch.refused and not self._watch.connected:
                    raise Unreachable(self._watch.reason(timeout))
            if self._sock in ready:
                frame = self._sock.recv()
                try:
                    reply = decode_reply(frame)
                except ValidationError:
                    continue  # not a gpud reply; keep waiting for ours
                if reply.id != request_id:
                    continue  # a late reply to an earlier, timed-out request
                self.daemon_protocol = reply.v
                return reply

    def node_info(self) -> NodeInfo:
        return self.call(NODE_INFO)

    def node_hw(self) -> NodeSnapshot:
        return self.call(NODE_HW)

    def node_events(self, limit: int = 100, since: float | None = None) -> NodeEventsReply:
        return self.call(NODE_EVENTS, NodeEventsRequest(limit=limit, since=since))

    def ack_events(self, gpu_index: int | None = None) -> AckEventsReply:
        return self.call(NODE_EVENTS_ACK, AckEventsRequest(gpu_index=gpu_index))

    # ----------------------------------------------------------------- runs

    def runs(self, active_only: bool = False, limit: int = 200) -> RunList:
        return self.call(RUN_LIST, ListRequest(active_only=active_only, limit=limit))

    def run_status(self, run: str) -> RunStatus:
        return self.call(RUN_STATUS, RunRef(run=run))

    def run_metrics(
        self, run: str, name: str | None = None, attempt: int | None = None
    ) -> MetricsReply:
        return self.call(RUN_METRICS, MetricsRequest(run=run, name=name, attempt=attempt))

    def run_health(self, run: str) -> HealthSummary:
        return self.call(RUN_HEALTH, RunRef(run=run))

    def run_logs(self, request: LogsRequest) -> LogChunk:
        return self.call(RUN_LOGS, request)

    def stop_run(self, run: str, force: bool = False) -> RunSummary:
        return self.call(RUN_STOP, StopRequest(run=run, force=force))

    def resume_run(self, run: str) -> RunSummary:
        return self.call(RUN_RESUME, ResumeRequest(run=run))

    # ----------------------------------------------------------------- events

    def subscribe(self, *prefixes: str) -> Subscription:
        """A SUB socket on the daemon's events, filtered by topic prefixes (all if none)."""
        events = self.target.events
        if events is None:
            events = events_endpoint_for(self.target.control, self.node_info().events)
        return Subscription(self._ctx, self.target, events, self._keys, prefixes)

    def close(self) -> None:
        # Detach the monitor before closing anything: a monitor whose reader is gone keeps
        # queueing events (reconnect attempts to a stopped daemon) until its pipe is full,
        # and then blocks the context's I/O thread, which freezes every socket of it.
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._sock.close(linger=0)
        self._watch.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscription:
    """Events from one daemon. `recv()` returns None on timeout; garbage is skipped."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        target: NodeTarget,
        endpoint: str,
        keys: KeyPair | None,
        prefixes: tuple[str, ...],
        hwm: int = 10_000,
    ) -> None:
        self.endpoint = endpoint
        self.socket = context.socket(zmq.SUB)
        self.socket.linger = 0
        self.socket.rcvhwm = hwm
        _configure_curve(self.socket, target, keys)
        self.prefixes: frozenset[str] = frozenset()
        self.set_prefixes(prefixes or ("",))
        self.socket.connect(endpoint)
        self.dropped = 0
        self.skipped = 0  # events of a kind this client does not know

    def set_prefixes(self, prefixes: tuple[str, ...]) -> None:
        """Subscribe to exactly these topic prefixes from now on (the socket's thread)."""
        wanted = frozenset(prefixes)
        for prefix in self.prefixes - wanted:
            self.socket.setsockopt(zmq.UNSUBSCRIBE, prefix.encode())
        for prefix in wanted - self.prefixes:
            self.socket.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        self.prefixes = wanted

    def recv(self, timeout_s: float) -> Event | None:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining < 0 or not self.socket.poll(max(0, int(remaining * 1000))):
                return None
            frames = self.socket.recv_multipart()
            try:
                return decode_event(frames)
            except UnknownKind:
                self.skipped += 1  # a newer daemon's kind of event: the others still come
            except (ValidationError, ValueError, UnicodeDecodeError):
                self.dropped += 1

    def close(self) -> None:
        self.socket.close(linger=0)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
