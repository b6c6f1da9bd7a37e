"""A viewer that spreads subscriptions over many connections, in a process of its own:
`python -m tests.support.sub_spread ENDPOINT SERVER_KEY PUBLIC SECRET CONNECTIONS SUBS HOLD_S`.

Each of CONNECTIONS real SUB sockets (one context, one process) subscribes SUBS distinct
topics of about 60 bytes, each connection under every per-connection cap, and holds them
for HOLD_S seconds, as libzmq does: a connection the daemon cuts reconnects by itself and
sends its subscriptions again. Then it closes them all at once. It prints one JSON line:
how many handshakes succeeded (the first ones and every reconnect) and how many failed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

TOPIC_BYTES = 60


def topics(connection: int, count: int) -> list[bytes]:
    """Distinct topics: no two share more than a short prefix, the costliest kind for a trie."""
    return [
        (b"run.%05d-%04d." % (connection, i)).ljust(TOPIC_BYTES - 4, b"x") + b".log"
        for i in range(count)
    ]


def main() -> None:
    endpoint, server_key, public, secret = sys.argv[1:5]
    connections, subs, hold_s = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    ctx = zmq.Context(io_threads=2)
    ctx.setsockopt(zmq.MAX_SOCKETS, 4 * connections + 64)
    socks: list[zmq.Socket[bytes]] = []
    monitors: list[zmq.Socket[bytes]] = []
    poller = zmq.Poller()
    for n in range(connections):
        sock = ctx.socket(zmq.SUB)
        sock.linger = 0
        sock.rcvhwm = 16
        sock.curve_serverkey = server_key.encode()
        sock.curve_publickey = public.encode()
        sock.curve_secretkey = secret.encode()
        monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_DISCONNECTED
        )
        for topic in topics(n, subs):
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.connect(endpoint)
        poller.register(monitor, zmq.POLLIN)
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
        monitors.append(monitor)
    counts = {"handshakes": 0, "refused": 0, "disconnects": 0, "messages": 0}
    end = time.monotonic() + hold_s
    while (left := end - time.monotonic()) > 0:
        for sock, _ in poller.poll(int(left * 1000) + 1):
            if sock.type == zmq.SUB:
                while sock.poll(0):
                    sock.recv_multipart()
                    counts["messages"] += 1
                continue
            event = parse_monitor_message(sock.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                counts["handshakes"] += 1
            elif event == zmq.EVENT_DISCONNECTED:
                counts["disconnects"] += 1
            else:
                counts["refused"] += 1
    for sock in socks:
        sock.disable_monitor()
        sock.close(linger=0)
    print(json.dumps(counts), flush=True)
    time.sleep(0.5)  # the closes reach the daemon before the process is gone
    os._exit(0)  # no context teardown: a closed socket's pipes may still drain


if __name__ == "__main__":
    main()
