"""A reconnecting slowloris, in a process of its own:
`python -m tests.support.slowloris HOST PORT CONNECTIONS SECONDS`.

CONNECTIONS plain TCP connections to an HTTP endpoint, each sending the start of a
request head and then one more byte a second, never finishing it; a connection the server
closes is opened again 0.2 s later. One process, one selector. It prints one JSON line: how
many connections it opened and how many the server closed.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time

HEAD_START = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Slow: "
DRIP_S = 1.0
RECONNECT_S = 0.2


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    count, seconds = int(sys.argv[3]), float(sys.argv[4])
    selector = selectors.DefaultSelector()
    reopen_at: list[float] = [0.0] * count  # per slot: when to (re)connect
    socks: list[socket.socket | None] = [None] * count
    next_drip = time.monotonic() + DRIP_S
    opened = closed = 0
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        for slot in range(count):
            if socks[slot] is None and now >= reopen_at[slot]:
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex((host, port))
                socks[slot] = sock
                selector.register(sock, selectors.EVENT_READ, slot)
                try:
                    sock.send(HEAD_START)
                except OSError:
                    pass  # not connected yet: the first drip sends it
                opened += 1
        drip = now >= next_drip
        if drip:
            next_drip = now + DRIP_S
        for dripping in socks:
            if dripping is None or not drip:
                continue
            try:
                dripping.send(b"x")
            except OSError:
                pass  # closed: the selector tells
        for key, _ in selector.select(timeout=0.05):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                data = ready.recv(4096)
            except OSError:
                data = b""
            if not data:  # the server closed it (or answered, which a slowloris never lets it)
                selector.unregister(ready)
                ready.close()
                socks[key.data] = None
                reopen_at[key.data] = time.monotonic() + RECONNECT_S
                closed += 1
    print(json.dumps({"opened": opened, "closed": closed}), flush=True)


if __name__ == "__main__":
    main()
