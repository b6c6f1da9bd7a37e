"""The events socket: every topic gets its own sequence number, so gaps are visible."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import zmq
from pydantic import BaseModel

from gpud.protocol import encode_event

log = logging.getLogger("gpud.events")

#: Messages queued per subscriber before the oldest telemetry is dropped for it.
SUBSCRIBER_HWM = 1000


def configure_pub(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.SNDHWM, SUBSCRIBER_HWM)
    sock.linger = 0


class EventPublisher:
    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self._sock = sock
        self._seq: defaultdict[str, int] = defaultdict(int)
        self.published = 0

    def publish(self, topic: str, body: BaseModel) -> None:
        self._seq[topic] += 1
        try:
            # PUB never blocks: a subscriber over its high-water mark just misses this one.
            self._sock.send_multipart(encode_event(topic, self._seq[topic], body), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("event on %s not sent: %s", topic, exc)
        self.published += 1
