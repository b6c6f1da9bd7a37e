"""The link between one rank and its gpud: one background thread owns every socket.

Out (PUSH → the daemon's ingest): metrics, heartbeats, checkpoint reports; in a run gpud did
not start (a Slurm job attached to its node's daemon), each with the run's token as a third
frame. In (SUB ← the
daemon's trainer-control PUB): stop requests for this run. The training thread only ever
appends to a bounded deque, so it never blocks and never touches zmq; when the queue is
full, or gpud is down (the PUSH socket has no live peer), messages are dropped and counted.
Rank 0's metrics also go to `<run-dir>/metrics.jsonl`, from which gpud backfills whatever
it missed; a full disk only delays them (`Backfill`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from trainers.output import DISK_FULL
from trainers.wandb_mirror import WandbMirror

#: Items the training thread may queue before the oldest are dropped.
QUEUE_CAPACITY = 10_000
#: The longest the thread sleeps: bounds metric latency when nothing wakes it.
IDLE_WAIT_S = 0.02
#: How long the thread waits for gpud's ingest at start before sending anyway (dropping).
CONNECT_WAIT_MS = 2000

#: How much of metrics.jsonl may wait in memory while its disk is full (the oldest whole
#: lines go first past that).
BACKFILL_PENDING_BYTES = 32 << 20
#: While the disk is full, how often a write is tried again.
BACKFILL_RETRY_S = 1.0

Item = tuple[str, dict[str, Any]]


class Backfill:
    """Rank 0's `metrics.jsonl`: whole lines appended through one descriptor.

    A disk with no room (ENOSPC, EDQUOT) stops nothing: the lines wait in memory (up to
    BACKFILL_PENDING_BYTES, the oldest whole lines dropped and counted past that) and are
    written, from the exact byte where the disk stopped, once it has room. So the file
    never holds a torn line and gpud, which reads it again, loses only what was dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pending = bytearray()
        self._started = False  # the first pending line is partly written already
        self._full_at: float | None = None
        self.dropped_lines = 0

    def append(self, lines: list[str]) -> None:
        self._pending += ("\n".join(lines) + "\n").encode()
        over = len(self._pending) - BACKFILL_PENDING_BYTES
        if over > 0:
            self._drop(over)
        self.write()

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._full_at is not None and not force and now - self._full_at < BACKFILL_RETRY_S:
            return
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except OSError as exc:
                if exc.errno not in DISK_FULL:
                    raise
                if self._full_at is None:
                    print(f"[gpud] {self.path}: {exc.strerror}; metrics wait in memory",
                          file=sys.stderr)  # fmt: skip
                self._full_at = now
                return
            if written:
                self._started = self._pending[written - 1] != ord("\n")
            del self._pending[:written]
        self._full_at = None

    def _drop(self, at_least: int) -> None:
        """Drop the oldest whole lines (never the one partly written already)."""
        keep_from = self._pending.find(b"\n") + 1 if self._started else 0
        cut = self._pending.find(b"\n", keep_from + at_least - 1)
        cut = len(self._pending) if cut == -1 else cut + 1
        self.dropped_lines += self._pending.count(b"\n", keep_from, cut)
        del self._pending[keep_from:cut]

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        self.write(force=True)
        os.close(self._fd)
        lost = self._pending.count(b"\n") + self.dropped_lines
        if lost:
            print(f"[gpud] {self.path}: {lost} metric line(s) never fit on its disk",
                  file=sys.stderr)  # fmt: skip


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
    def _open_jsonl(path: str) -> Backfill | None:
        """The backfill file; without it metrics still flow to gpud, so carry on."""
        try:
            return Backfill(path)
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

    def _flush(self, push: zmq.Socket[bytes] | None, jsonl: Backfill | None) -> None:
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
        if jsonl is not None:
            if lines:
                jsonl.append(lines)
            else:
                jsonl.write()  # lines a full disk held back
        if self._mirror is not None:
            self._mirror.log(metrics)
