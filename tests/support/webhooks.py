"""A real local HTTP server that records what webhooks receive: it answers as told (200,
500, ...), after a delay if told (one that never answers in time is a receiver that times
out). Each POST is kept with when it came and its JSON body.

    with Receiver(status=500) as hook:
        ... hook.url ...              # http://127.0.0.1:PORT/hooks/<a secret>
        hook.wait_for(4)              # the first 4 POSTs, or AssertionError
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() when it came
    path: str
    headers: dict[str, str]
    body: Any  # the JSON body (None if it was not JSON)


class Receiver:
    def __init__(self, status: int = 200, delay_s: float = 0.0, answer: bytes = b"ok") -> None:
        self.status = status
        self.delay_s = delay_s
        self.answer = answer
        #: The part of the URL that is a secret, as Slack's and Discord's tokens are.
        self.secret = f"T{secrets.token_hex(6)}/B{secrets.token_hex(6)}/{secrets.token_hex(12)}"
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with receiver._lock:
                    receiver.received.append(
                        Received(time.monotonic(), self.path, dict(self.headers), body)
                    )
                if receiver.delay_s:
                    receiver._release.wait(receiver.delay_s)
                try:
                    self.send_response(receiver.status)
                    self.send_header("Content-Length", str(len(receiver.answer)))
                    self.end_headers()
                    self.wfile.write(receiver.answer)
                except OSError:
                    pass  # the client gave up waiting: that was the point

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/{self.secret}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._release.set()  # handlers still waiting answer at once
        self._server.shutdown()
        self._server.server_close()

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.05)
        with self._lock:
            got = [r.body for r in self.received]
        raise AssertionError(f"wanted {count} POST(s) within {timeout:g}s, got {len(got)}: {got}")
