"""The events socket: its own thread, and a sequence number per topic so gaps are visible.

The XPUB socket lives on a thread of its own (`EventsThread`), never on the daemon's loop.
libzmq does a socket's bookkeeping on whichever thread next uses it, and for an XPUB that
bookkeeping can be long: each closed connection is removed by walking every subscription
of every connection (`bench/xpub_trie.py`: 0.17 s per disconnect at 1.2 MB of
subscriptions, 26 s for 340 closes). On its own thread, inside libzmq calls that release
the GIL, that time delays telemetry at worst, never a control reply. The loop encodes each
event and hands it over through an inproc pipe that never blocks: while the thread is
busy, events past the pipe's high-water mark are dropped and counted, as a slow
subscriber's are.

The XPUB is in manual mode, so the thread sees every subscription a viewer sends (with the
connection it came on) and applies only those the guard allows: a subscription longer
than MAX_FRAME is refused by the socket itself, and a connection with a subscription
longer than MAX_SUBSCRIPTION_BYTES, more subscriptions than its allowance, or more than
its key's or the socket's share, is cut (`gpud.security.guard`); its key then waits at the gate
(`gpud.security.keygate`), so a client that reconnects by itself is not cut over and over.
Publishing never blocks: a subscriber over its high-water mark misses telemetry, the
daemon does not grow.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from typing import Any

import zmq
from pydantic import BaseModel

from gpud.security.guard import CHECK_S, ConnectionGuard, Limits
from gpud.wire.protocol import encode_event

log = logging.getLogger("gpud.events")

#: Messages queued per subscriber before the oldest telemetry is dropped for it.
SUBSCRIBER_HWM = 1000
#: Messages from one subscriber that libzmq reads ahead of the daemon (see configure_pub).
SUBSCRIPTIONS_QUEUED = 16
#: The longest topic prefix anyone needs: "run." + a 128-character run id + ".metrics".
MAX_SUBSCRIPTION_BYTES = 256
#: Largest frame the socket reads at all: room for the CURVE handshake (its INITIATE
#: command carries the client's metadata), far below anything that costs memory.
MAX_FRAME = 2048
#: Events the loop may queue for the events thread while it is busy; more are dropped.
HANDOVER_HWM = 10_000
#: Messages the thread handles from each side before it looks at the other.
BATCH = 512
#: How long past its due time an idle guard check may wait for the events the loop
#: publishes on the same beat (`gpud.node.ledger`), to run with them in one wake-up.
IDLE_LATE_S = 0.05
#: What the subscriptions of all clients may add up to. libzmq's trie costs about 100
#: bytes of memory per subscribed byte (two tries in manual mode), and every disconnect
#: walks all of it (about 10 ms at this size): gputop subscribes a few hundred bytes.
TOTAL_SUBSCRIPTION_BYTES = 64 * 1024
EVENTS_LIMITS = Limits(
    in_flight_bytes=64 * 1024,
    total_in_flight_bytes=4 * 2**20,
    subscriptions=64,
    subscription_bytes=4096,
    subscription_bytes_per_key=8192,
    total_subscription_bytes=TOTAL_SUBSCRIPTION_BYTES,
    longest_subscription=MAX_SUBSCRIPTION_BYTES,
)


def configure_pub(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.SNDHWM, SUBSCRIBER_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, duplicates included
    sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # and every cancellation
    # A subscription takes effect only once the daemon has checked it and applies it
    # (`_subscription`). (libzmq does keep its own copy of what each peer sent, to cancel
    # it when the peer goes; the guard's byte budgets bound that copy too.)
    sock.setsockopt(zmq.XPUB_MANUAL, 1)
    # What a subscriber sends waits in a pipe of this many messages before the daemon reads
    # it; libzmq stops reading the connection while the pipe is full, so a flood of
    # subscriptions is held to a few dozen messages until the guard has seen it.
    sock.setsockopt(zmq.RCVHWM, SUBSCRIPTIONS_QUEUED)
    sock.setsockopt(zmq.LINGER, 0)


class EventsThread:
    """Owns the XPUB socket (and its guard) from `start()` to `stop()`.

    Created on the loop's thread, where the socket was bound; from `start()` on only the
    thread touches the XPUB and the guard's monitor. `send()` is the loop's side.
    """

    def __init__(self, sock: zmq.Socket[bytes], guard: ConnectionGuard | None = None) -> None:
        self._sock = sock
        self._guard = guard
        address = f"inproc://gpud-events-{id(self)}"
        shadow: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(sock.context.underlying)
        self._inbox = shadow.socket(zmq.PAIR)  # the thread's end
        self._outbox = shadow.socket(zmq.PAIR)  # the loop's end
        for end in (self._inbox, self._outbox):
            end.linger = 0
            end.sndhwm = end.rcvhwm = HANDOVER_HWM // 2  # inproc: the two add up
        self._inbox.bind(address)
        self._outbox.connect(address)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpud-events", daemon=True)
        self.dropped = 0  # events the busy thread could not take

    def send(self, frames: list[bytes]) -> bool:
        """Hand one event to the thread (the loop's side; never blocks)."""
        try:
            self._outbox.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        return True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (within IDLE_CHECK_S) and close the handover pipe. Idempotent."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        for end in (self._inbox, self._outbox):
            if not end.closed:
                end.close(linger=0)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._inbox, zmq.POLLIN)
        if self._guard is not None:  # a new connection wakes the guard's check at once
            poller.register(self._guard.monitor, zmq.POLLIN)
        next_check = time.monotonic()
        late = 0.0  # how long past next_check the poll may wait for an event to forward
        while not self._stopping.is_set():
            try:
                # At most IDLE_CHECK_S + IDLE_LATE_S: the stop is seen within that.
                wait_ms = max(0.0, next_check + late - time.monotonic()) * 1000
                ready = dict(poller.poll(int(wait_ms) + 1))
                if self._inbox in ready:
                    self._forward()
                if self._sock in ready:
                    self._read_subscriptions()
                news = self._guard is not None and self._guard.monitor in ready
                now = time.monotonic()
                if news or now >= next_check:
                    if self._guard is None:
                        next_check, late = now + CHECK_S, 0.0
                    else:
                        self._guard.check()
                        next_check = self._guard.next_check_at(now)
                        late = 0.0 if self._guard.busy else IDLE_LATE_S
            except Exception:  # the events must go on; a bug shows in the log
                log.exception("the events thread failed on one turn; going on")
                time.sleep(CHECK_S)

    def _forward(self) -> None:
        for _ in range(BATCH):
            try:
                frames = self._inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                # XPUB never blocks: a subscriber over its high-water mark misses this one.
                self._sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:
                log.debug("event not sent: %s", exc)

    def _read_subscriptions(self) -> None:
        for _ in range(BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._subscription(frames)

    def _subscription(self, frames: list[zmq.Frame]) -> None:
        """Check one message up the XPUB and apply it if it is a subscription within the
        allowances. In manual mode libzmq applies (un)subscribe options to the connection
        of the message read last: this runs before the next one is read."""
        for frame in frames:
            if self._guard is not None and not self._guard.subscription(frame):
                continue
            data = frame.bytes
            if not data or data[0] not in (0, 1):
                continue  # not a subscription: data sent up an XSUB, ignored
            option = zmq.SUBSCRIBE if data[0] == 1 else zmq.UNSUBSCRIBE
            try:
                self._sock.setsockopt(option, data[1:])
            except zmq.ZMQError as exc:
                log.debug("subscription not applied: %s", exc)


class EventPublisher:
    """The loop's side of the events socket: numbers each topic's events and hands them to
    the events thread."""

    def __init__(self, sock: zmq.Socket[bytes], guard: ConnectionGuard | None = None) -> None:
        self.thread = EventsThread(sock, guard)
        self._seq: defaultdict[str, int] = defaultdict(int)
        self.published = 0

    def publish(self, topic: str, body: BaseModel) -> None:
        self.send(self.encode(topic, body))

    def encode(self, topic: str, body: BaseModel) -> list[bytes]:
        """The next event of `topic`, numbered and encoded, for `send`."""
        self._seq[topic] += 1
        return encode_event(topic, self._seq[topic], body)

    def send(self, frames: list[bytes]) -> None:
        """Hand an encoded event to the events thread (dropped if it is behind)."""
        if not self.thread.send(frames):
            topic = frames[0][:80].decode("utf-8", "replace")
            log.debug("event on %s dropped: the events thread is behind", topic)
        self.published += 1

    def forget(self, prefix: str) -> None:
        """Let go of the sequence numbers of every topic under `prefix` (a run retention
        removed: `run.<id>.`); each held ~150 bytes, for every run the daemon ever ran."""
        for topic in [t for t in self._seq if t.startswith(prefix)]:
            del self._seq[topic]

    async def serve(self) -> None:
        """Run the events thread until cancelled."""
        self.thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.thread.stop()

    def close(self) -> None:
        self.thread.stop()
