"""The events socket: every topic gets its own sequence number, so gaps are visible.

An XPUB socket in manual mode, so the daemon sees every subscription a viewer sends (with
the connection it came on) before libzmq stores any of it, and applies only those the
guard allows: a subscription longer than MAX_FRAME is refused by the socket itself, and a
connection with a subscription longer than MAX_SUBSCRIPTION_BYTES, or more subscriptions
than its allowance, is cut (`gpud.guard`). Publishing never blocks: a
subscriber over its high-water mark misses telemetry, the daemon does not grow.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import zmq
from pydantic import BaseModel

from gpud.drain import Frames, SocketDrain
from gpud.guard import ConnectionGuard, Limits
from gpud.protocol import encode_event

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
EVENTS_LIMITS = Limits(
    in_flight_bytes=64 * 1024,
    total_in_flight_bytes=4 * 2**20,
    subscriptions=64,
    subscription_bytes=4096,
    total_subscription_bytes=1 * 2**20,
    longest_subscription=MAX_SUBSCRIPTION_BYTES,
)


def configure_pub(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.SNDHWM, SUBSCRIBER_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, duplicates included
    sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # and every cancellation
    # libzmq files nothing itself: a subscription takes effect only once the daemon has
    # checked it and applies it (`_subscription`), so no trie node is ever allocated for
    # one the guard refuses.
    sock.setsockopt(zmq.XPUB_MANUAL, 1)
    # What a subscriber sends waits in a pipe of this many messages before the daemon reads
    # it; libzmq stops reading the connection while the pipe is full, so a flood of
    # subscriptions is held to a few dozen messages until the guard has seen it.
    sock.setsockopt(zmq.RCVHWM, SUBSCRIPTIONS_QUEUED)
    sock.setsockopt(zmq.LINGER, 0)


class EventPublisher:
    def __init__(self, sock: zmq.Socket[bytes], guard: ConnectionGuard | None = None) -> None:
        self._sock = sock
        self._guard = guard
        self._seq: defaultdict[str, int] = defaultdict(int)
        self._drain = SocketDrain(sock, self._subscription, batch=512)
        self.published = 0

    def publish(self, topic: str, body: BaseModel) -> None:
        self._seq[topic] += 1
        try:
            # PUB never blocks: a subscriber over its high-water mark just misses this one.
            self._sock.send_multipart(encode_event(topic, self._seq[topic], body), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("event on %s not sent: %s", topic, exc)
        self.published += 1
        self._drain.poke()

    async def serve(self) -> None:
        """Read subscriptions as they come (libzmq queues them until they are read)."""
        await self._drain.serve()

    def _subscription(self, frames: Frames) -> None:
        """Check one message up the XPUB and apply it if it is a subscription within the
        connection's allowance. In manual mode libzmq applies (un)subscribe options to the
        connection of the message read last: this runs before the next one is read."""
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
