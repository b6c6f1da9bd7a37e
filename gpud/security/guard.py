"""What one client can make the daemon hold, and cutting off a client that holds too much.

libzmq has two places where a peer can make the daemon keep memory that no option bounds:

- a multipart message is buffered whole before the application sees any of it
  (`ZMQ_MAXMSGSIZE` limits each frame, not the message): 400 parts of 2 MB are 800 MB;
- every subscription of a SUB peer is stored in a trie of about one node per byte, and a
  peer may send as many as it likes.

The guard watches each TCP connection of a socket (by file descriptor, from the socket
monitor) and compares how many bytes libzmq has read from it (`TCP_INFO` bytes received,
minus what still waits in the kernel) with what the application was handed; it also counts
each connection's subscriptions (XPUB hands every one over, with the connection's fd in
its metadata). A connection over its allowance, or any connection while the total is over
the socket's budget, is shut down: libzmq then drops what it buffered for it (a partial
message is rolled back, a subscriber's trie nodes are removed), and the freed memory is
handed back to the OS. A connection whose key was revoked is cut the same way, so a
revoked viewer stops receiving events within one check.

Subscriptions are also counted per key and in total: libzmq removes a closed connection by
walking every subscription the socket holds (`bench/xpub_trie.py`), so what all clients
hold together is what each disconnect costs. A cut for what a client did (not a revoke)
also tells the socket's `KeyGate`, which then refuses the key's next handshakes for a
while, so a client that reconnects by itself is not cut again and again. Cuts are logged
once per key and reason per interval, with a count (`gpud.security.bursts`).

Non-TCP connections (ipc://, reachable only by the daemon's own user) are not measured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import socket
import struct
import termios
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from gpud.node.ledger import next_beat
from gpud.security.bursts import ThrottledLog
from gpud.security.keygate import KeyGate

log = logging.getLogger("gpud.guard")

#: How often the connections are measured while any of them moves bytes, or is new.
CHECK_S = 0.05
#: How often when every connection is still (an idle daemon, a viewer between requests):
#: a new connection wakes the check at once (the monitor's event), and a still connection
#: that starts to send is measured within this, then every CHECK_S. Checking at CHECK_S
#: always cost an idle daemon 0.55 % of a core (two guards, 40 wake-ups a second).
IDLE_CHECK_S = 0.5
#: What libzmq adds to each frame on the wire (ZMTP header, CURVE box and nonce), rounded
#: up: the guard may under-count what is in flight by this, never over-count.
FRAME_OVERHEAD = 64
_TCP_INFO_SIZE = 256
_BYTES_RECEIVED_AT = 128  # offset of tcpi_bytes_received in struct tcp_info (Linux >= 4.1)
_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


@dataclass(frozen=True)
class Limits:
    """One socket's allowances. In flight: read by libzmq, not yet handed to gpud."""

    in_flight_bytes: int
    total_in_flight_bytes: int
    subscriptions: int = 0
    subscription_bytes: int = 0
    subscription_bytes_per_key: int = 0
    total_subscription_bytes: int = 0
    longest_subscription: int = 0


@dataclass
class _Connection:
    fd: int
    accounted: int = 0  # bytes the application was handed (plus framing), or re-based
    in_flight: int = 0
    key: str | None = None
    topics: dict[bytes, int] = field(default_factory=dict)  # topic → times subscribed
    topic_bytes: int = 0
    subscriptions: int = 0
    read: int | None = None  # what the last check measured


def _bytes_read_by_zmq(fd: int) -> int | None:
    """Bytes the kernel received on a TCP socket minus those still unread; None if not TCP."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        waiting = array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, waiting)
    except OSError:
        return None
    finally:
        sock.detach()  # the fd stays libzmq's
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return None
    (received,) = struct.unpack_from("Q", info, _BYTES_RECEIVED_AT)
    return int(received) - waiting[0]


def _shut_down(fd: int) -> str:
    """End a TCP connection under libzmq's feet; returns the peer for the log."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return "?"
    try:
        try:
            host, port = sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()
    return peer


class _Libc:
    """glibc's heap controls, when this is glibc: give freed memory back to the OS."""

    def __init__(self) -> None:
        self._libc: Any = None
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
            if libc is not None and hasattr(libc, "malloc_trim"):
                self._libc = libc
        except OSError:
            pass

    def prefer_mmap_for_large_blocks(self, threshold: int = 256 * 1024) -> None:
        """Blocks this large are mapped and unmapped on free, never kept in the heap
        (a fixed threshold also stops glibc from raising it after a burst of big frames)."""
        if self._libc is not None:
            m_mmap_threshold = -3
            self._libc.mallopt(m_mmap_threshold, threshold)

    def trim(self) -> None:
        if self._libc is not None:
            self._libc.malloc_trim(0)


LIBC = _Libc()


class ConnectionGuard:
    """Watches one socket's connections against its `Limits`."""

    def __init__(
        self,
        sock: zmq.Socket[Any],
        context: zmq.Context[Any],
        name: str,
        limits: Limits,
        authorized: Callable[[str], bool] | None = None,
        gate: KeyGate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limits = limits
        self._authorized = authorized
        self.gate = gate
        self._clock = clock
        self._log = ThrottledLog(log, clock=clock)
        self._key_bytes: dict[str, int] = {}  # subscribed bytes per key
        self.subscription_bytes = 0  # across every connection
        address = f"inproc://gpud-guard-{name}-{id(self)}"
        sock.monitor(address, _MONITOR_EVENTS)
        # inproc addresses live in one context: read the monitor through a plain shadow of
        # the socket's own context (it may be an asyncio one).
        self._monitor: zmq.Socket[bytes] = zmq.Context.shadow(context.underlying).socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        # libzmq sends monitor events blocking: a full pipe would stall the context's I/O
        # thread (every socket of the daemon). Unbounded here; `check()` empties it.
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(address)
        self._sock = sock
        self.connections: dict[int, _Connection] = {}
        # Connections cut, by fd, until a new connection is accepted on the fd: libzmq still
        # hands over what a cut connection had queued, which is neither counted nor applied.
        self._cut_fds: set[int] = set()
        self.cut = 0
        self._trim_at: float | None = None
        self.busy = True  # whether the next check comes in CHECK_S (else IDLE_CHECK_S)

    # ------------------------------------------------------------------ what arrives

    def _conn(self, fd: int) -> _Connection:
        conn = self.connections.get(fd)
        if conn is None:
            # A new connection's ACCEPTED event was posted before its first message: read
            # it now, or it would later replace what this message is about to record.
            self._read_monitor()
            conn = self.connections.setdefault(fd, _Connection(fd))
        return conn

    def _was_cut(self, fd: int) -> bool:
        """Whether a message on `fd` is a leftover of a connection the guard cut."""
        if fd not in self._cut_fds:
            return False
        self._read_monitor()  # a new connection on the fd may have been accepted since
        return fd in self._cut_fds

    def received(self, frames: list[zmq.Frame]) -> None:
        """The application was handed these frames (one message)."""
        if not frames:
            return
        fd = _source_fd(frames[-1])
        if fd is None or self._was_cut(fd):
            return
        conn = self._conn(fd)
        conn.accounted += sum(len(f) + FRAME_OVERHEAD for f in frames)
        if conn.key is None:
            conn.key = user_id(frames[-1])

    def subscription(self, frame: zmq.Frame) -> bool:
        """An XPUB notification: `\\x01topic` subscribed, `\\x00topic` cancelled.

        Returns whether to apply it: False once its connection is over its allowance, its
        key's or the socket's (and cut). Connections the guard does not measure (ipc://)
        are always allowed.
        """
        fd = _source_fd(frame)
        if fd is None:
            return True
        if self._was_cut(fd):
            return False
        conn = self._conn(fd)
        data = frame.bytes
        conn.accounted += len(data) + FRAME_OVERHEAD
        if conn.key is None:
            conn.key = user_id(frame)
        if not data:
            return False
        if conn.key is not None and self.gate is not None and self.gate.penalized(conn.key):
            # Connected before its key was refused; its subscriptions are not wanted either.
            self._cut(conn, "refused", "its key was cut for abuse a moment ago", abuse=False)
            return False
        topic = data[1:]
        limits = self.limits
        if len(topic) > limits.longest_subscription:
            self._cut(conn, "long", f"a subscription of {len(topic)} bytes (topics are short)")
            return False
        if data[0] == 1:
            self._count(conn, topic, 1)
        elif data[0] == 0 and topic in conn.topics:
            self._count(conn, topic, -1)
        key_bytes = self._key_bytes.get(conn.key, 0) if conn.key is not None else 0
        if (
            conn.subscriptions > limits.subscriptions
            or conn.topic_bytes > limits.subscription_bytes
        ):
            self._cut(
                conn,
                "connection",
                f"{conn.subscriptions} subscriptions ({conn.topic_bytes} bytes) over the "
                f"allowance of {limits.subscriptions} ({limits.subscription_bytes} bytes)",
            )
            return False
        if limits.subscription_bytes_per_key and key_bytes > limits.subscription_bytes_per_key:
            self._cut(
                conn,
                "key",
                f"its key's connections subscribe {key_bytes} bytes, over the allowance of "
                f"{limits.subscription_bytes_per_key} bytes per key",
            )
            return False
        total = limits.total_subscription_bytes
        if total and self.subscription_bytes > total:
            self._cut(
                conn,
                "total",
                f"the {self.name} socket's subscriptions are full ({total} bytes across clients)",
            )
            return False
        return True

    def _count(self, conn: _Connection, topic: bytes, sign: int) -> None:
        if sign > 0:
            conn.topics[topic] = conn.topics.get(topic, 0) + 1
        else:
            conn.topics[topic] -= 1
            if not conn.topics[topic]:
                del conn.topics[topic]
        size = sign * len(topic)
        conn.subscriptions += sign
        conn.topic_bytes += size
        self.subscription_bytes += size
        if conn.key is not None:
            self._key_bytes[conn.key] = self._key_bytes.get(conn.key, 0) + size

    def _forget(self, fd: int) -> None:
        """A connection is gone (closed or cut): what it subscribed no longer counts."""
        conn = self.connections.pop(fd, None)
        if conn is None or not conn.topic_bytes:
            return
        self.subscription_bytes -= conn.topic_bytes
        if conn.key is not None:
            left = self._key_bytes.get(conn.key, 0) - conn.topic_bytes
            if left > 0:
                self._key_bytes[conn.key] = left
            else:
                self._key_bytes.pop(conn.key, None)

    # ------------------------------------------------------------------ checking

    @property
    def monitor(self) -> zmq.Socket[bytes]:
        """The socket monitor's end: readable when a connection comes or goes."""
        return self._monitor

    def next_check_at(self, now: float) -> float:
        """When the next check is due (monotonic): CHECK_S from now while busy; idle, on
        IDLE_CHECK_S's beat (`gpud.node.ledger`), so an idle daemon's checks share the wake-ups
        of its other periodic parts."""
        if self.busy:
            return now + CHECK_S
        return next_beat(now, IDLE_CHECK_S)

    async def watch(self) -> None:
        """Check on the loop: at once when the monitor has news, else at the cadence."""
        import asyncio

        loop = asyncio.get_running_loop()
        news = asyncio.Event()
        fd = int(self._monitor.getsockopt(zmq.FD))
        loop.add_reader(fd, news.set)
        try:
            while True:
                self.check()
                news.clear()
                if int(self._monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    continue  # the FD is edge-triggered: what came meanwhile is read now
                # Not asyncio.wait_for: before Python 3.12 it can swallow the task's cancel
                # when the wait ends in the same moment, and the daemon never stops.
                timer = loop.call_at(self.next_check_at(loop.time()), news.set)
                try:
                    await news.wait()
                finally:
                    timer.cancel()
        finally:
            loop.remove_reader(fd)

    def check(self) -> None:
        self.busy = self._read_monitor()
        limits = self.limits
        for conn in list(self.connections.values()):
            read = _bytes_read_by_zmq(conn.fd)
            if read is None:
                continue
            if read != conn.read:
                self.busy = True  # it moved (or is new): watch it closely
            conn.read = read
            conn.in_flight = read - conn.accounted
            if conn.in_flight < 0:  # framing over-counted: re-base, never drift
                conn.accounted, conn.in_flight = read, 0
            if conn.in_flight > limits.in_flight_bytes:
                why = f"{conn.in_flight / 2**20:.1f} MiB in flight in one message"
                self._cut(conn, "in flight", why)
            elif conn.key is not None and self._authorized and not self._authorized(conn.key):
                self._cut(conn, "revoked", "its key is no longer authorized", abuse=False)
        self._hold_totals()
        if self._trim_at is not None and self._clock() >= self._trim_at:
            self._trim_at = None
            LIBC.trim()

    def _hold_totals(self) -> None:
        limits = self.limits
        live = list(self.connections.values())
        while sum(c.in_flight for c in live) > limits.total_in_flight_bytes:
            worst = max(live, key=lambda c: c.in_flight)
            why = f"the {self.name} socket holds too much in flight across clients"
            self._cut(worst, "in flight", why)
            live.remove(worst)

    def _read_monitor(self) -> bool:
        """Apply the monitor's events; whether there were any."""
        news = False
        while self._monitor.poll(0):
            news = True
            frames = self._monitor.recv_multipart()
            if len(frames[0]) < 6:
                continue
            event, value = struct.unpack("=HI", frames[0][:6])
            if event == zmq.EVENT_ACCEPTED:
                self._forget(value)  # a closed connection's fd, reused before we heard
                self._cut_fds.discard(value)
                self.connections[value] = _Connection(value)
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._forget(value)
                self._trim_soon()
        return news

    def _cut(self, conn: _Connection, kind: str, why: str, abuse: bool = True) -> None:
        """Shut `conn` down. `kind` groups the log's lines; `abuse`: for what the client did
        (not for a revoke), so its key waits at the gate before it may connect again."""
        peer = _shut_down(conn.fd)
        self._forget(conn.fd)
        self._cut_fds.add(conn.fd)
        self.cut += 1
        who = f" (key {conn.key[:8]}…)" if conn.key else ""
        then = ""
        if abuse and conn.key is not None and self.gate is not None:
            self.gate.penalize(conn.key)
            then = f"; the key is refused here for {self.gate.penalty_s:.0f} s"
        line = f"{self.name} socket: cut the connection from {peer}{who}: {why}{then}"
        self._log.warning((kind, conn.key), line)
        self._trim_soon()

    def _trim_soon(self) -> None:
        """Give freed heap back to the OS shortly, once libzmq has freed what a closed
        connection held (its pipe, its subscriptions): at most every 0.2 s."""
        if self._trim_at is None:
            self._trim_at = self._clock() + 0.2

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)


def user_id(frame: zmq.Frame) -> str | None:
    """The CURVE key a message came with (its connection's ZAP User-Id), if any."""
    try:
        value = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return value if isinstance(value, str) and value else None


def _source_fd(frame: zmq.Frame) -> int | None:
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None
