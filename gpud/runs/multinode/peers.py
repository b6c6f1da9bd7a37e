"""Node 0's links to the other daemons of a run.

Node 0 calls the other nodes with its own server key pair as a client key; each of those
nodes accepts that key as a `peer`, for exactly the runs it joined with node 0 as their
coordinator (the operator's join request vouched for it). Calls are synchronous, so the
supervisor runs them in a thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from gpud.model.run import NodeRef, RunRecord
from gpud.security.keys import KeyPair
from gpud.wire.client import Client, ClientError, NodeTarget, Unreachable
from gpud.wire.protocol import Method, ReplyT, RequestT

PEER_TIMEOUT_S = 3.0
#: After a call the peer did not answer, calls fail at once for this long: a frozen peer
#: must not make every poll, stop and restart queue up behind one another for 3 s each
#: (they hold threads of the loop's default executor while they wait).
DOWN_S = 1.0


class PeerLink:
    def __init__(self, ref: NodeRef, keys: KeyPair | None) -> None:
        self.ref = ref
        self._keys = keys
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._down_until = 0.0

    def call(
        self, method: Method[RequestT, ReplyT], body: RequestT, timeout_s: float | None = None
    ) -> ReplyT:
        """One request; raises ClientError. Thread-safe (one call at a time per peer): a
        call waits at most PEER_TIMEOUT_S for the one before it, and one made within DOWN_S
        of an unanswered call fails at once, as `Unreachable`. `timeout_s`: for a call
        that waits on purpose (the preflight's check), on a link of its own."""
        label = self.ref.name or self.ref.control
        if time.monotonic() < self._down_until:
            raise Unreachable(f"{label} did not answer {DOWN_S:g}s ago; not asked again yet")
        if not self._lock.acquire(timeout=PEER_TIMEOUT_S):
            raise Unreachable(f"{label} is still busy with a call it has not answered")
        try:
            if self._client is None:
                target = NodeTarget(
                    control=self.ref.control,
                    server_key=self.ref.server_key.encode() if self.ref.server_key else None,
                    name=self.ref.name,
                )
                self._client = Client(target, keys=self._keys, timeout_s=PEER_TIMEOUT_S)
            try:
                return self._client.call(method, body, timeout_s)
            except ClientError as exc:
                # A fresh connection next time: the peer may have restarted.
                self._client.close()
                self._client = None
                if isinstance(exc, Unreachable):
                    self._down_until = time.monotonic() + DOWN_S
                raise
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class PeerLinks:
    """Node 0's links to the other nodes, one per daemon, kept; `call` asks many at once."""

    def __init__(self, keys: KeyPair | None) -> None:
        self.keys = keys
        self._links: dict[str, PeerLink] = {}

    def link(self, ref: NodeRef) -> PeerLink:
        link = self._links.get(ref.control)
        if link is None:
            link = self._links[ref.control] = PeerLink(ref, self.keys)
        return link

    async def call(
        self, run: RunRecord, ranks: list[int], method: Method[Any, Any], body: Callable[[int], Any]
    ) -> dict[int, Any]:
        """Call those nodes concurrently; each result is a reply or a ClientError."""

        async def one(rank: int) -> tuple[int, Any]:
            try:
                link = self.link(run.nodes[rank])
                return rank, await asyncio.to_thread(link.call, method, body(rank))
            except ClientError as exc:
                return rank, exc

        return dict(await asyncio.gather(*(one(rank) for rank in ranks)))

    def close(self) -> None:
        for link in self._links.values():
            link.close()


def each(body: Any) -> Callable[[int], Any]:
    """The same request body for every node."""
    return lambda rank: body
