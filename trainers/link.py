"""The link between one rank and its gpud: one background thread owns every socket.

Out (PUSH → the daemon's ingest): metrics, heartbeats, checkpoint reports; in a run gpud did
not start (a Slurm job attached to its node's daemon), each with the run's token as a third
frame. In (SUB ← the
daemon's trainer-control PUB): stop requests for this run. The training thread only ever
appends to a bounded deque, so it never blocks and never touches zmq; when the queue is
full, or gpud is down (the PUSH socket has no live peer), messages are dropped and counted.
Rank 0's metrics also go to `<run-dir>/metrics.jsonl`, from which gpud backfills whatever
it missed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from trainers.wandb_mirror import WandbMirror

#: Items the training thread may queue before the oldest are dropped.
QUEUE_CAPACITY = 10_000
#: The longest the thread sleeps: bounds metric latency when nothing wakes it.
IDLE_WAIT_S = 0.02
#: How long the thread waits for gpud's ingest at start before sending anyway (dropping).
CONNECT_WAIT_MS = 2000

Item = tuple[str, dict[str, Any]]


class GpudLink:
    """Started by `trainers.init()` in a launched rank; never used outside one."""

    def __init__(
        self,
        run_id: str,
        ingest: str | None,
        control: str | None,
        jsonl_path: str | None,
        on_stop: Callable[[str], None],
        on_dump: Callable[[], None] | None = None,
        ticker: Callable[[], list[Item]] | None = None,
        mirror: WandbMirror | None = None,
        token: str | None = None,
    ) -> None:
        self.run_id = run_id
        self._token = [token.encode()] if token else []
        self.queue: deque[Item] = deque(maxlen=QUEUE_CAPACITY)
        self.dropped_queue = 0
        self.dropped_send = 0
        self.sent = 0
        self.wake = threading.Event()
        self._ingest = ingest
        self._control = control
        self._jsonl_path = jsonl_path
        self._on_stop = on_stop
        self._on_dump = on_dump
        self._ticker = ticker
        self._mirror = mirror
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpud-link", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.dropped_queue + self.dropped_send

    def put(self, kind: str, body: dict[str, Any]) -> None:
        """Queue one message; O(1), never blocks.

        It does not wake the thread (an Event.set() would cost more than the rest of
        run.log() together): the thread looks every IDLE_WAIT_S, which bounds latency.
        """
        if len(self.queue) == QUEUE_CAPACITY:
            self.dropped_queue += 1
        self.queue.append((kind, body))

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (within `timeout_s`), then stop the thread."""
        self._closing.set()
        self.wake.set()
        # wandb.finish() flushes its own files: allow it more than the sockets need.
        self._thread.join(timeout_s + (15.0 if self._mirror is not None else 0.0))

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        ctx = zmq.Context()
        push = sub = None
        jsonl = None
        try:
            if self._ingest:
                push = ctx.socket(zmq.PUSH)
                push.setsockopt(zmq.IMMEDIATE, 1)  # no live gpud: drop (counted), don't queue
                push.setsockopt(zmq.SNDHWM, 1000)
                push.setsockopt(zmq.LINGER, 500)
                push.connect(self._ingest)
                # With IMMEDIATE, a send before the connection is up is dropped: the hello
                # (which tells gpud to stop by handshake) must not be. POLLOUT means "up".
                push.poll(CONNECT_WAIT_MS, zmq.POLLOUT)
            if self._control:
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.SUBSCRIBE, self.run_id.encode())
                sub.connect(self._control)
            if self._jsonl_path:
                jsonl = self._open_jsonl(self._jsonl_path)
            while True:
                closing = self._closing.is_set()
                if sub is not None:
                    self._read_control(sub)
                if self._ticker is not None:
                    for kind, body in self._ticker():
                        self.queue.append((kind, body))
                self._flush(push, jsonl)
                if closing:
                    return
                if sub is not None:
                    sub.poll(int(IDLE_WAIT_S * 1000))
                    self.wake.wait(0)
                else:
                    self.wake.wait(IDLE_WAIT_S)
                self.wake.clear()
        finally:
            if jsonl is not None:
                jsonl.close()
            if self._mirror is not None:
                self._mirror.close()
            ctx.destroy(linger=500)

    @staticmethod
    def _open_jsonl(path: str) -> Any:
        """The backfill file; without it metrics still flow to gpud, so carry on."""
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            return open(path, "a", buffering=1 << 16)
        except OSError as exc:
            print(
                f"[gpud] cannot write {path} ({exc}); metrics are not backfillable", file=sys.stderr
            )
            return None

    def _read_control(self, sub: zmq.Socket[bytes]) -> None:
        while sub.poll(0):
            frames = sub.recv_multipart()
            try:
                message = json.loads(frames[-1])
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("kind") == "stop":
                self._on_stop(str(message.get("reason") or "stop requested by gpud"))
            elif message.get("kind") == "dump" and self._on_dump is not None:
                self._on_dump()

    def _flush(self, push: zmq.Socket[bytes] | None, jsonl: Any) -> None:
        lines = []
        metrics = []
        while self.queue:
            kind, body = self.queue.popleft()
            data = json.dumps(body, separators=(",", ":"))
            if kind == "metrics":
                metrics.append(body)
                if jsonl is not None:
                    lines.append(data)
            if push is None:
                continue
            try:
                push.send_multipart([kind.encode(), data.encode(), *self._token], zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:
                self.dropped_send += 1
        if lines:
            jsonl.write("\n".join(lines) + "\n")
            jsonl.flush()
        if self._mirror is not None:
            self._mirror.log(metrics)
