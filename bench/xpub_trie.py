"""What one disconnect costs the thread that owns an XPUB, against the subscriptions it holds.

Issue 25 §1: 340 connections × 60 subscriptions of 60 bytes from one viewer key left
`node.info` unanswered for 26 s. libzmq (4.3.5) keeps an XPUB's subscriptions in a trie of
one node per byte — twice in manual mode (what peers sent, and what the application
applied) — and removes a terminated pipe by walking *both tries whole*, with a heap-allocated
stack entry per node, on the thread that next uses the socket. Every disconnect therefore
costs time proportional to every subscription of every connection, and closing N
connections costs N times that: quadratic in the number of connections.

This benchmark measures it without gpud: an XPUB in manual mode (gpud's settings) applies
every subscription of K subscribers (60 distinct 60-byte topics each); then one subscriber
with no subscriptions at all disconnects, and the longest single call the XPUB's thread
makes while libzmq processes that disconnect is timed. Printed side by side with the RSS
the subscriptions cost, for growing K:

    .venv/bin/python bench/xpub_trie.py [--connections 10,40,170,340]

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import time

import psutil
import zmq

TOPIC_BYTES = 60
SUBSCRIPTIONS = 60


def _topic(connection: int, i: int) -> bytes:
    return (b"run.%05d-%04d." % (connection, i)).ljust(TOPIC_BYTES - 4, b"x") + b".log"


def _apply(xpub: zmq.Socket[bytes], expected: int) -> None:
    """Read every subscription and apply it, as gpud's publisher does in manual mode."""
    applied = 0
    while applied < expected:
        if not xpub.poll(5000):
            raise SystemExit(f"only {applied} of {expected} subscriptions arrived")
        data = xpub.recv()
        if data[:1] == b"\x01":
            xpub.setsockopt(zmq.SUBSCRIBE, data[1:])
            applied += 1


def _disconnect_cost(
    ctx: zmq.Context[zmq.Socket[bytes]], xpub: zmq.Socket[bytes], at: str
) -> float:
    """Longest single call of the XPUB's thread while it handles one idle subscriber's
    connect and disconnect."""
    idle = ctx.socket(zmq.SUB)
    idle.linger = 0
    idle.connect(at)
    time.sleep(0.3)
    xpub.poll(0)  # the attach
    idle.close()
    longest = 0.0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        began = time.perf_counter()
        xpub.poll(0)  # processes libzmq's pending commands: the pipe's termination
        longest = max(longest, time.perf_counter() - began)
        time.sleep(0.001)
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="10,40,170,340")
    args = parser.parse_args()
    counts = [int(c) for c in args.connections.split(",")]
    me = psutil.Process()
    print(f"{'connections':>11} {'subscribed':>11} {'RSS added':>10} {'one disconnect':>15}"
          f" {'all of them':>12}")  # fmt: skip
    for count in counts:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        xpub = ctx.socket(zmq.XPUB)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        xpub.setsockopt(zmq.XPUB_MANUAL, 1)
        xpub.setsockopt(zmq.RCVHWM, 16)
        xpub.linger = 0
        port = xpub.bind_to_random_port("tcp://127.0.0.1")
        at = f"tcp://127.0.0.1:{port}"
        before = me.memory_info().rss
        subs = []
        for n in range(count):
            sub = ctx.socket(zmq.SUB)
            sub.linger = 0
            for i in range(SUBSCRIPTIONS):
                sub.setsockopt(zmq.SUBSCRIBE, _topic(n, i))
            sub.connect(at)
            subs.append(sub)
        _apply(xpub, count * SUBSCRIPTIONS)
        added = me.memory_info().rss - before
        one = _disconnect_cost(ctx, xpub, at)
        began = time.perf_counter()
        for sub in subs:
            sub.close()
        end = time.monotonic() + 120
        total = 0.0
        while time.monotonic() < end:  # until every termination was handled
            call = time.perf_counter()
            xpub.poll(0)
            total += time.perf_counter() - call
            if time.perf_counter() - began > 1.0 and time.perf_counter() - call < 0.001:
                break
            time.sleep(0.01)
        kb = count * SUBSCRIPTIONS * TOPIC_BYTES / 1024
        print(f"{count:>11} {kb:>8.0f} kB {added / 2**20:>7.1f} MB {one * 1000:>12.1f} ms"
              f" {total:>10.2f} s")  # fmt: skip
        xpub.close()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
