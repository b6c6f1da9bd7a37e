"""The trainer-facing sockets: ingest (PULL) and trainer control (PUB), both ipc.

Ranks PUSH two-frame messages `[kind, json]` (see `gpud.runmodel.TRAINER_MESSAGES`); each
is validated strictly and handed to the supervisor, or dropped and counted. Stop requests
go out on the control PUB with the run id as topic. Both sockets live in the state dir
(mode 0700), so only the daemon's own user reaches them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio
from pydantic import ValidationError

from gpud.protocol import MAX_FRAME_BYTES
from gpud.runmodel import TRAINER_MESSAGES, TrainerMessage

log = logging.getLogger("gpud.ingest")

Handler = Callable[[str, TrainerMessage], None]
BATCH = 512


class Ingest:
    def __init__(
        self, ctx: zmq.asyncio.Context, ingest: str, control: str, handler: Handler
    ) -> None:
        self.ingest_endpoint = ingest
        self.control_endpoint = control
        self._handler = handler
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._pull.setsockopt(zmq.RCVHWM, 100_000)
        self._pull.linger = 0
        self._pull.bind(ingest)
        self._sync_pull: zmq.Socket[bytes] = zmq.Socket.shadow(self._pull.underlying)
        self._control = ctx.socket(zmq.PUB)
        self._control.linger = 0
        self._control.bind(control)
        self._sync_control: zmq.Socket[bytes] = zmq.Socket.shadow(self._control.underlying)
        self.received = 0
        self.rejected = 0

    async def serve(self) -> None:
        while True:
            await self._pull.poll()
            for _ in range(BATCH):
                try:
                    frames = self._sync_pull.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._accept(frames)

    def _accept(self, frames: list[bytes]) -> None:
        model = TRAINER_MESSAGES.get(frames[0].decode(errors="replace")) if frames else None
        if len(frames) != 2 or model is None:
            self._reject("unknown message kind")
            return
        try:
            message = model.model_validate_json(frames[1])
        except ValidationError as exc:
            self._reject(exc.errors()[0]["msg"])
            return
        self.received += 1
        try:
            self._handler(frames[0].decode(), message)
        except Exception:
            log.exception("handling a %s message failed", frames[0].decode())

    def _reject(self, why: str) -> None:
        self.rejected += 1
        if self.rejected <= 10 or self.rejected % 1000 == 0:
            log.warning("dropped a trainer message (%s); %d so far", why, self.rejected)

    def request_stop(self, run_id: str, attempt: int, reason: str) -> None:
        payload = json.dumps({"kind": "stop", "attempt": attempt, "reason": reason})
        try:
            self._sync_control.send_multipart([run_id.encode(), payload.encode()], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("stop request for %s not sent: %s", run_id, exc)

    def request_dump(self, run_id: str, attempt: int) -> None:
        """Ask the run's trainers for a flight-recorder dump (the trainers library)."""
        payload = json.dumps({"kind": "dump", "attempt": attempt})
        try:
            self._sync_control.send_multipart([run_id.encode(), payload.encode()], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("dump request for %s not sent: %s", run_id, exc)

    def close(self) -> None:
        self._pull.close(linger=0)
        self._control.close(linger=0)
