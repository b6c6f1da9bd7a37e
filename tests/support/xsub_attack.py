"""A misbehaving events client, in a process of its own: `python -m tests.support.xsub_attack
CASE ENDPOINT SERVER_KEY PUBLIC SECRET` (z85 keys).

Its own process because libzmq 4.3.5 itself can crash the *client* when a context holding
an XSUB with an oversized subscription is terminated; the daemon is what is under test.
"""

from __future__ import annotations

import os
import sys
import time

import zmq

MB = 2**20


def _attack(case: str, sock: zmq.Socket[bytes]) -> None:
    if case == "sub-1mb":
        sock.send(b"\x01" + b"n" * MB)
    elif case == "sub-64mb":
        sock.send(b"\x01" + b"n" * (64 * MB))
    elif case == "subs-100k":
        for i in range(100_000):
            sock.send(b"\x01node.%06d." % i + b"x" * 200)
    elif case == "garbage":
        for _ in range(2_000):
            sock.send(os.urandom(1500))
    elif case == "xsub-data":
        for _ in range(200):
            sock.send_multipart([b"\x07not a subscription", b"y" * MB])
    else:
        raise SystemExit(f"unknown case {case!r}")


def main() -> None:
    case, endpoint, server_key, public, secret = sys.argv[1:6]
    sock = zmq.Context().socket(zmq.XSUB)
    sock.linger = 0
    sock.sndhwm = 0  # the attacker never blocks itself
    sock.curve_serverkey = server_key.encode()
    sock.curve_publickey = public.encode()
    sock.curve_secretkey = secret.encode()
    sock.connect(endpoint)
    _attack(case, sock)
    time.sleep(2.0)  # long enough for libzmq to send it all
    print("sent", flush=True)
    os._exit(0)  # no context teardown (see above)


if __name__ == "__main__":
    main()
