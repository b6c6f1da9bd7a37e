"""The feed: what moves every node's events and replies into the `FleetModel`.

Two kinds of threads, so that 64 nodes do not mean 64 threads fighting for the GIL:

- one **event thread** holds a `Subscription` per node and waits on all of them at once
  (a zmq poller); whatever a node has queued is decoded and applied as one batch (one
  lock, one model version);
- a few **request threads** (nodes shared between them) each own a `Client` per node (a
  Client is not thread-safe) and ask, every `refresh_s`, for what events do not carry:
  node info, the run list, and once the node's recent hardware events. A node that does
  not answer is asked again later, backing off up to `MAX_BACKOFF_S`, and does not hold
  up the others of its thread for more than one timeout.

What the UI wants in detail (a run's metric history, log tail, health) is fetched by a
short-lived thread with its own client, so a long history never delays anything else.
zmq reconnects on its own: a node that comes back is simply heard from again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import zmq
from pydantic import ValidationError

from gpud.model.endpoints import events_endpoint_for
from gpud.security.keys import KeyFileError, KeyPair, load_client_keypair
from gpud.wire.client import (
    Client,
    ClientError,
    ConfigError,
    NodeTarget,
    RequestFailed,
    Subscription,
    Unreachable,
)
from gpud.wire.envelope import Event
from gpud.wire.protocol import RUN_METRICS, RUN_STATUS, UnknownKind
from gpud.wire.run_messages import LogsRequest, MetricsReply, MetricsRequest, RunRef, RunStatus
from tui.model.decode import decode
from tui.model.fleet import FleetModel, Want
from tui.model.targets import Target

log = logging.getLogger("gputop.feed")

#: How long one request may take before the node counts as not answering.
REQUEST_TIMEOUT_S = 3.0
#: The longest wait before asking a silent node again.
MAX_BACKOFF_S = 15.0
#: Events taken from one node in one turn at most (the rest wait for the next turn).
BATCH = 512
#: After a turn, the event thread lets events gather this long before it polls again:
#: a poll costs about 1.3 µs per socket (a third of a millisecond at 256 nodes), so a
#: turn per event would cost a tenth of a core at 500 events/s. 20 ms bounds the turns
#: to 50 a second, and adds at most 20 ms to any value's way into the model; above 64
#: nodes the wait grows with the fleet, to `GATHER_MAX_S` (a poll stays under 1% of a
#: core, and a value is still in the model within the frame after it arrived).
GATHER_S = 0.02
GATHER_MAX_S = 0.05
GATHER_NODES = 64
#: Lines of each node's log fetched when a run is opened.
TAIL_LINES = 300
#: Metric rows asked for at once (the protocol's maximum).
HISTORY_LIMIT = 1_000_000
#: Threads that send requests; nodes are shared between them.
REQUEST_THREADS = 4
#: How often the event thread checks its subscriptions when no screen changed them (a
#: daemon that sends no briefs is found this way).
TOPICS_EVERY_S = 1.0
#: A node's run list is asked for when its brief names a run that moved, and at least
#: this often.
RUNS_EVERY_S = 30.0

#: Sockets one node may hold open at once in the feed's context.
SOCKETS_PER_NODE = 8

ClientFactory = Callable[[NodeTarget], Client]


class EventThread:
    """Every node's subscription, polled together by one thread."""

    def __init__(
        self,
        model: FleetModel,
        targets: list[NodeTarget],
        keys: KeyPair | None,
        stop: threading.Event,
        poll_s: float,
        context: zmq.Context[zmq.Socket[bytes]],
    ) -> None:
        self.model = model
        self.targets = targets
        self.keys = keys
        self._stop = stop
        self._poll_s = poll_s
        self._ctx = context
        self._subs: dict[str, Subscription] = {}
        self._failed: dict[str, float] = {}  # key → when subscribing last failed
        self.thread = threading.Thread(target=self._run, name="gputop-events", daemon=True)

    def _endpoint(self, target: NodeTarget) -> str | None:
        if target.events is not None:
            return target.events
        with self.model.lock:
            info = self.model.nodes[target.control].info
        return events_endpoint_for(target.control, info.events) if info is not None else None

    def _subscribe_missing(self) -> bool:
        changed = False
        now = time.monotonic()
        for target in self.targets:
            key = target.control
            if key in self._subs or now - self._failed.get(key, -10.0) < 5.0:
                continue
            endpoint = self._endpoint(target)
            if endpoint is None:
                continue  # a request thread asks node.info for it
            try:
                topics = self.model.topics(key)
                self._subs[key] = Subscription(self._ctx, target, endpoint, self.keys, topics)
                changed = True
            except (ConfigError, zmq.ZMQError) as exc:
                self._failed[key] = now
                self.model.note_error(key, str(exc))
        return changed

    def _run(self) -> None:
        poller = zmq.Poller()
        by_socket: dict[zmq.Socket[bytes], str] = {}
        next_check = 0.0
        topics_seen, next_topics = -1, 0.0
        gather = min(GATHER_MAX_S, GATHER_S * max(1.0, len(self.targets) / GATHER_NODES))
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                version = self.model.topics_version
                if version != topics_seen or now >= next_topics:
                    topics_seen, next_topics = version, now + TOPICS_EVERY_S
                    self._retopic()
                if now >= next_check and len(self._subs) < len(self.targets):
                    next_check = now + 0.5
                    if self._subscribe_missing():
                        poller = zmq.Poller()
                        by_socket = {}
                        for key, sub in self._subs.items():
                            poller.register(sub.socket, zmq.POLLIN)
                            by_socket[sub.socket] = key
                if not by_socket:
                    self._stop.wait(self._poll_s)
                    continue
                ready = poller.poll(int(self._poll_s * 1000))
                for sock, _ in ready:
                    key = by_socket[sock]
                    batch = self._drain(self._subs[key])
                    if batch:
                        self.model.apply_events(key, batch)
                if ready:
                    self._stop.wait(gather)
        except Exception:  # a bug here must not take the UI down; it shows as silence
            log.exception("the event thread failed")
        finally:
            for sub in self._subs.values():
                sub.close()

    def _retopic(self) -> None:
        """Subscribe each node to what the screens want of it now (`FleetModel.topics`)."""
        with self.model.lock:
            wanted = {key: self.model.topics(key) for key in self._subs}
        for key, topics in wanted.items():
            sub = self._subs[key]
            if frozenset(topics) != sub.prefixes:
                sub.set_prefixes(topics)

    @staticmethod
    def _drain(sub: Subscription) -> list[Event]:
        """What the socket has queued, decoded (as `Subscription.recv` does, without a
        poll per message); garbage is counted in `sub.dropped` and skipped, an event of a kind
        this gputop does not know in `sub.skipped`."""
        batch: list[Event] = []
        while len(batch) < BATCH:
            try:
                frames = sub.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                batch.append(decode(frames))
            except UnknownKind:
                sub.skipped += 1  # a newer daemon's kind of event: skipped, counted
            except (ValidationError, ValueError, UnicodeDecodeError):
                sub.dropped += 1
        return batch


class RequestThread:
    """Requests to some of the nodes, each through its own `Client`."""

    def __init__(
        self,
        model: FleetModel,
        targets: list[NodeTarget],
        client_factory: ClientFactory,
        stop: threading.Event,
        refresh_s: float,
        index: int,
    ) -> None:
        self.model = model
        self.targets = targets
        self._factory = client_factory
        self._stop = stop
        self._refresh_s = refresh_s
        self._clients: dict[str, Client] = {}
        self._due: dict[str, float] = {t.control: 0.0 for t in targets}
        self._failures: dict[str, int] = {}
        self._needs_info: set[str] = {t.control for t in targets}
        self._runs_due: dict[str, float] = {}  # node → when its run list is asked for next
        self.thread = threading.Thread(
            target=self._run, name=f"gputop-requests-{index}", daemon=True
        )

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for target in self.targets:
                    if self._stop.is_set():
                        break
                    self._serve(target)
                self._stop.wait(0.1)
        finally:
            for client in self._clients.values():
                client.close()

    def _serve(self, target: NodeTarget) -> None:
        key = target.control
        now = time.monotonic()
        if now >= self._due[key]:
            try:
                self._refresh(target)
                self._failures.pop(key, None)
                self._due[key] = time.monotonic() + self._refresh_s
            except ClientError as exc:
                self._failed(target, exc)
            except Exception:  # a bug must not end the feed of every node of this thread
                log.exception("requests to %s failed", key)
                self._failed(target, None)
        wants = self.model.wants(key)
        if wants:
            # A long history takes a while to arrive: its own thread and client.
            threading.Thread(
                target=self._fetch_all, args=(target, wants), name="gputop-fetch", daemon=True
            ).start()

    def _failed(self, target: NodeTarget, exc: ClientError | None) -> None:
        key = target.control
        fails = self._failures[key] = self._failures.get(key, 0) + 1
        self._due[key] = time.monotonic() + min(MAX_BACKOFF_S, self._refresh_s * 2 ** (fails - 1))
        self._needs_info.add(key)
        if exc is not None:
            self.model.note_error(key, str(exc))
        # A fresh client next time: the old one would keep retrying the connection (and
        # queueing monitor events) all the while the node is away.
        client = self._clients.pop(key, None)
        if client is not None:
            client.close()

    def _client(self, target: NodeTarget) -> Client:
        client = self._clients.get(target.control)
        if client is None:
            client = self._clients[target.control] = self._factory(target)
        return client

    def _refresh(self, target: NodeTarget) -> None:
        key = target.control
        client = self._client(target)
        now = time.monotonic()
        if key in self._needs_info:
            self.model.apply_info(key, client.node_info())
            self.model.apply_node_events(key, client.node_events(limit=100))
            self._needs_info.discard(key)
            self._runs_due[key] = 0.0
        if self.model.take_needs_runs(key) or now >= self._runs_due.get(key, 0.0):
            self.model.apply_runs(key, client.runs(limit=200))
            self._runs_due[key] = now + RUNS_EVERY_S

    def _fetch_all(self, target: NodeTarget, wants: list[Want]) -> None:
        try:
            client = self._factory(target)
        except ClientError:
            for want in wants:
                self.model.retry_want(want, target.control)
            return
        try:
            for want in wants:
                try:
                    fetch(self.model, client, want, target.control)
                except Unreachable:
                    self.model.retry_want(want, target.control)
        finally:
            client.close()


def fetch(model: FleetModel, client: Client, want: Want, key: str = "") -> None:
    """Fetch one thing the UI wants and put it in the model."""
    try:
        if want.kind == "hw":
            model.apply_snapshot(key, client.node_hw())
        elif want.kind == "metrics":
            request = MetricsRequest(run=want.run_id, limit=HISTORY_LIMIT)
            reply = client.call(RUN_METRICS, request, 30.0)
            if isinstance(reply, MetricsReply):
                model.apply_metrics_history(want.run_id, reply)
            # Each attempt's world size, for the curve's resume marks (elastic runs).
            status = client.call(RUN_STATUS, RunRef(run=want.run_id))
            if isinstance(status, RunStatus):
                model.apply_attempts(want.run_id, status.attempts, status.goodput)
        elif want.kind == "logs":
            chunk = client.run_logs(
                LogsRequest(run=want.run_id, attempt=want.attempt, tail_lines=TAIL_LINES)
            )
            model.apply_log_chunk(chunk)
        elif want.kind == "health":
            model.apply_health(client.run_health(want.run_id))
    except RequestFailed as exc:
        # An older daemon (no run.metrics / run.health) or a run it no longer has: live
        # events still fill the views.
        if want.kind == "metrics":
            model.metrics_unavailable(want.run_id, exc.message)


class Feed:
    """The event thread and the request threads; `start()` once, `stop()` at the end."""

    def __init__(
        self,
        model: FleetModel,
        targets: Iterable[Target],
        keys: KeyPair | None = None,
        refresh_s: float = 2.0,
        poll_s: float = 0.25,
        request_threads: int = REQUEST_THREADS,
    ) -> None:
        self.model = model
        nodes = [t.node for t in targets]
        self._stop = threading.Event()
        if keys is None and any(n.server_key is not None for n in nodes):
            try:
                keys = load_client_keypair()
            except KeyFileError as exc:
                for node in nodes:
                    model.note_error(node.control, str(exc))
        self._keys = keys
        # Its own context: a dead node's sockets retry with a backoff up to 1 s instead
        # of zmq's default 10 connects a second (64 dead nodes would cost a core's tenth),
        # and a node that comes back is still reconnected within a second.
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._ctx.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        # Per node a subscription, a client and its monitor (two sockets), and a fetch's
        # client now and then: zmq's default of 1023 sockets ends at about 250 nodes.
        self._ctx.set(zmq.MAX_SOCKETS, max(1023, SOCKETS_PER_NODE * len(nodes) + 64))
        self.events = EventThread(model, nodes, keys, self._stop, poll_s, self._ctx)
        count = max(1, min(request_threads, len(nodes)))
        self.requests = [
            RequestThread(model, nodes[i::count], self._client, self._stop, refresh_s, i)
            for i in range(count)
            if nodes[i::count]
        ]

    def _client(self, target: NodeTarget) -> Client:
        return Client(target, keys=self._keys, timeout_s=REQUEST_TIMEOUT_S, context=self._ctx)

    @property
    def threads(self) -> list[threading.Thread]:
        return [self.events.thread, *(r.thread for r in self.requests)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
