"""Reading a zmq socket from the asyncio loop without ever missing a wake-up.

A zmq socket's file descriptor is edge-triggered: it signals once when the socket's state
changes, and *any* operation on the socket — a send included — may consume that signal.
A loop that waits on the descriptor while another task sends a reply on the same socket
can therefore sleep with requests queued, until some unrelated event arrives. The drain
waits on an event that the descriptor's reader *and* every outside send set (`poke()`),
and always reads until the socket says it is empty before it waits again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import zmq

Frames = list[zmq.Frame]


class SocketDrain:
    """Hands every message of `sock` to `handle`, up to `batch` per turn of the loop."""

    def __init__(
        self, sock: zmq.Socket[Any], handle: Callable[[Frames], None], batch: int = 256
    ) -> None:
        self.sock = sock
        self._handle = handle
        self._batch = batch
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Call after using the socket outside `handle`: the send may have eaten a wake-up."""
        self._wake.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        fd = int(self.sock.getsockopt(zmq.FD))
        loop.add_reader(fd, self._wake.set)
        try:
            while True:
                self._wake.clear()
                if self._drain() == self._batch:
                    await asyncio.sleep(0)  # let the rest of the loop run, then go on
                    continue
                await self._wake.wait()
        finally:
            loop.remove_reader(fd)

    def _drain(self) -> int:
        for count in range(self._batch):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return count
            self._handle(frames)
        return self._batch
