"""The trainer-facing sockets: ingest (PULL) and trainer control (PUB), both ipc.

Ranks PUSH two-frame messages `[kind, json]` (`gpud.model.trainer_messages`); each is
validated (leniently: unknown fields are ignored) and handed to the supervisor, or
dropped and counted. A kind this daemon does not know (a newer trainers library's) is
skipped and counted apart (`skipped`, node.info's `skipped_messages`): the rank's other
messages still count. Stop requests
go out on the control PUB with the run id as topic. Both sockets live in the state dir
(mode 0700), so only the daemon's own user reaches them.

With `--attach`, a third socket takes the ranks of runs gpud did not start (Slurm jobs,
pods: `gpud.runs.lifecycle.attached`): a PULL that any local user can reach, so every message on it
has a third frame, the token its run's part runner registered, and is dropped unless
`authorize(token, message)` says the token belongs to that run and attempt.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable

import zmq
import zmq.asyncio
from pydantic import ValidationError

from gpud.model.trainer_messages import TRAINER_MESSAGES, TrainerMessage
from gpud.wire.envelope import MAX_FRAME_BYTES

log = logging.getLogger("gpud.ingest")

Handler = Callable[[str, TrainerMessage], None]
Authorize = Callable[[str, TrainerMessage], bool]
BATCH = 512
#: The shared socket is open to every local user: small messages (a heartbeat is ~0.5 kB,
#: a metrics message of 100 values ~4 kB) and a short queue bound what one connection can
#: make the daemon hold (a bigger message cuts the connection).
SHARED_MAX_BYTES = 64 * 1024
SHARED_HWM = 1000


class Ingest:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        ingest: str,
        control: str,
        handler: Handler,
        shared: str | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self.ingest_endpoint = ingest
        self.control_endpoint = control
        self.shared_endpoint = shared
        self._handler = handler
        self._authorize = authorize
        self._pull = _pull(ctx, ingest)
        self._sync_pull: zmq.Socket[bytes] = zmq.Socket.shadow(self._pull.underlying)
        self._shared: zmq.asyncio.Socket | None = None
        self._sync_shared: zmq.Socket[bytes] | None = None
        if shared is not None:
            self._shared = _pull(ctx, shared, SHARED_MAX_BYTES, SHARED_HWM)
            self._sync_shared = zmq.Socket.shadow(self._shared.underlying)
        self._control = ctx.socket(zmq.PUB)
        self._control.linger = 0
        self._control.bind(control)
        self._sync_control: zmq.Socket[bytes] = zmq.Socket.shadow(self._control.underlying)
        self.received = 0
        self.rejected = 0
        #: Messages of a kind this daemon does not know, by kind (a newer library's).
        self.skipped: Counter[str] = Counter()

    async def serve(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._pull, zmq.POLLIN)
        if self._shared is not None:
            poller.register(self._shared, zmq.POLLIN)
        while True:
            await poller.poll()
            self._drain(self._sync_pull, shared=False)
            if self._sync_shared is not None:
                self._drain(self._sync_shared, shared=True)

    def _drain(self, sock: zmq.Socket[bytes], shared: bool) -> None:
        for _ in range(BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._accept(frames, shared)

    def _accept(self, frames: list[bytes], shared: bool = False) -> None:
        expected = 3 if shared else 2
        kind = frames[0].decode(errors="replace") if frames else ""
        model = TRAINER_MESSAGES.get(kind)
        if len(frames) != expected:
            self._reject("wrong frame count")
            return
        if model is None:
            self._skip(kind)
            return
        try:
            message = model.model_validate_json(frames[1])
        except ValidationError as exc:
            self._reject(exc.errors()[0]["msg"])
            return
        if shared:
            token = frames[2].decode(errors="replace")
            if self._authorize is None or not self._authorize(token, message):
                self._reject(f"no valid token for run {message.run!r}")
                return
        self.received += 1
        try:
            self._handler(frames[0].decode(), message)
        except Exception:
            log.exception("handling a %s message failed", frames[0].decode())

    def _skip(self, kind: str) -> None:
        # Bounded: a kind is named in the count only while there are few of them.
        key = kind[:32] if len(self.skipped) < 16 or kind[:32] in self.skipped else "other"
        self.skipped[key] += 1
        if self.skipped[key] == 1:
            log.warning(
                "skipped a trainer message of kind %r, which this gpud does not know (a newer"
                " trainers library?): counted in node.info's skipped_messages",
                key,
            )

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
        if self._shared is not None:
            self._shared.close(linger=0)


def _pull(
    ctx: zmq.asyncio.Context, endpoint: str, max_bytes: int = MAX_FRAME_BYTES, hwm: int = 100_000
) -> zmq.asyncio.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.linger = 0
    sock.bind(endpoint)
    return sock
