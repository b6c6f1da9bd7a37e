"""`/metrics` over HTTP(S), served on the daemon's own event loop.

On the loop, so every scrape reads one consistent state without locks: the latest
snapshot, the runs, their health. The HTTP side is deliberately small — one request per
connection, GET /metrics only — with a cap on concurrent connections, a deadline for the
request head and a size limit, so a bad client costs nothing. TLS, and client
certificates, come from the standard `ssl` module, as prometheus-client's own server does.

A scraper comes before a slow client: when every slot is taken, a new connection takes
the slot of the connection that has waited longest for its request head (a complete
request is read and answered in milliseconds; only a client that never finishes its head
waits long), and once half the slots are taken a new connection has a shorter deadline
for its head. Under 200 reconnecting slow clients a scraper gets every scrape
(`tests/faults/test_metrics_slowloris.py`); with a fixed cap and a 5 s deadline alone it
got almost none, as the slow clients took each slot the moment it was free.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import utils as prometheus_utils
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from gpud.prometheus.series import DcgmCounterFamily

log = logging.getLogger("gpud.prometheus")

#: Requests may not take longer than this to send their head, nor be larger.
HEAD_TIMEOUT_S = 5.0
HEAD_LIMIT = 8 * 1024
#: The deadline for the head of a connection that comes while half the slots are taken.
BUSY_HEAD_TIMEOUT_S = 1.0
#: Connections at once (Prometheus scrapes one at a time). Past this, a new connection
#: takes the slot of the one that has waited longest for its head, or is turned away when
#: every connection is being answered.
MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # when set, a client must present a certificate it signed

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def bind(address: str) -> socket.socket:
    """A listening socket for HOST:PORT (raises OSError: in use, not ours to bind...)."""
    parts = urlsplit(f"tcp://{address}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 9400
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=64)
    sock.setblocking(False)
    return sock


def _float(value: float) -> str:
    """Go's float formatting, as Prometheus writes values (prometheus-client's helper). Below
    a million it is Python's own repr, without the helper's checks (NaN falls through)."""
    if -1e6 < value < 1e6:
        return repr(float(value))
    return str(prometheus_utils.floatToGoString(value))  # type: ignore[no-untyped-call]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(families: Iterable[Metric]) -> bytes:
    """The classic text format (0.0.4), as prometheus-client's `generate_latest` writes it,
    but escaping each label set once: 8 GPUs share theirs across 44 families, and escaping
    every sample's labels anew was most of a scrape's cost (4.6 ms of 5). A
    DcgmCounterFamily is written as dcgm-exporter writes its counters, which
    `generate_latest` cannot: under its name as it is, without `_total`."""
    out: list[str] = []
    labels_of: dict[tuple[tuple[str, str], ...], str] = {}
    for metric in families:
        name, kind = metric.name, metric.type
        if kind == "counter" and not isinstance(metric, DcgmCounterFamily):
            name += "_total"
        elif kind == "unknown":
            kind = "untyped"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            key = tuple(sorted(sample.labels.items()))
            text = labels_of.get(key)
            if text is None:
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                text = labels_of[key] = f"{{{inner}}}" if inner else ""
            out.append(f"{sample.name}{text} {_float(sample.value)}\n")
    return "".join(out).encode()


class MetricsEndpoint:
    """Serves what `source` yields, freshly built for every scrape."""

    def __init__(
        self,
        sock: socket.socket,
        source: Callable[[], Iterable[Metric]],
        tls: TlsFiles | None,
    ) -> None:
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self._source = source
        self._ssl = tls.context() if tls is not None else None
        self._open = 0
        self._heads: dict[int, asyncio.StreamWriter] = {}  # still reading, oldest first
        self._server: asyncio.Server | None = None
        self.scrapes = 0
        self.evicted = 0

    def render(self) -> bytes:
        return render(self._source())

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            sock=self._sock,
            ssl=self._ssl,
            limit=HEAD_LIMIT,
            ssl_handshake_timeout=HEAD_TIMEOUT_S if self._ssl else None,
        )
        log.info("metrics on %s://%s:%d/metrics", "https" if self._ssl else "http",
                 self.host, self.port)  # fmt: skip

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _make_room(self) -> bool:
        """A slot for a new connection: the one of the connection waiting longest for its
        request head, when every slot is taken. False when there is none to take."""
        if self._open < MAX_CONNECTIONS:
            return True
        for oldest in self._heads.values():
            oldest.transport.abort()  # its read fails at once and its handler ends
            self.evicted += 1
            return True
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            writer.close()
            return
        head_s = BUSY_HEAD_TIMEOUT_S if self._open >= MAX_CONNECTIONS // 2 else HEAD_TIMEOUT_S
        self._open += 1
        self._heads[id(writer)] = writer
        try:
            try:
                status, body, kind = await self._answer(reader, head_s)
            finally:
                self._heads.pop(id(writer), None)
            if writer.transport.is_closing():
                return  # evicted for a newer connection, or gone: nobody to answer
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ssl.SSLError):
            pass  # the client went away or stalled: its loss
        finally:
            self._open -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, head_s: float) -> tuple[str, bytes, str]:
        text = "text/plain; charset=utf-8"
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), head_s)
        except asyncio.LimitOverrunError:
            return "431 Request Header Fields Too Large", b"request head too large\n", text
        except asyncio.IncompleteReadError:
            return "400 Bad Request", b"incomplete request\n", text
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", b"not an HTTP request\n", text
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if target != b"/metrics":
            return "404 Not Found", b"gpud serves /metrics only\n", text
        if method != b"GET":
            return "405 Method Not Allowed", b"GET /metrics\n", text
        self.scrapes += 1
        # The classic text format (every Prometheus reads it; our names need nothing newer).
        return "200 OK", self.render(), CONTENT_TYPE_PLAIN_0_0_4
