"""The daemon's attach socket: a unix socket any local user may connect to, where the
kernel tells who connected (SO_PEERCRED). One connection per attached part, for its life.

The lines are `gpud.attach.wire`'s; what is allowed is `gpud.runs.lifecycle.attached`'s. A client
that sends nothing for `FIRST_LINE_S`, an over-long or invalid line, or too many
connections (per user, in all) is cut off; the daemon never waits on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections import Counter
from pathlib import Path

from pydantic import ValidationError

from gpud.attach.wire import (
    MAX_LINE,
    UPDATE,
    AttachReply,
    AttachRequest,
    EndReport,
    refusal,
)
from gpud.runs.lifecycle.attached import AttachedRuns, Peer

log = logging.getLogger("gpud.attach")

SOCKET_NAME = "attach.sock"
INGEST_NAME = "ingest.sock"
#: Seconds a new connection has to say what it attaches.
FIRST_LINE_S = 10.0
#: Open connections at most: one per attached part, with room to spare.
MAX_CONNECTIONS = 1024
MAX_PER_USER = 64
_CREDS = struct.Struct("3i")


def peer_of(sock: socket.socket) -> Peer:
    """Who is at the other end of a unix socket, as the kernel says."""
    pid, uid, gid = _CREDS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    )
    return Peer(pid=pid, uid=uid, gid=gid)


def prepare_dir(path: Path) -> None:
    """The attach dir: ours, world-traversable (its sockets are for every local user)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    for name in (SOCKET_NAME, INGEST_NAME):
        with contextlib.suppress(FileNotFoundError):
            (path / name).unlink()  # a daemon that died left it; the state dir lock is ours


class AttachServer:
    def __init__(self, directory: Path, runs: AttachedRuns) -> None:
        self.path = directory / SOCKET_NAME
        self.runs = runs
        self._server: asyncio.Server | None = None
        self._open: Counter[int] = Counter()
        self._closing = False

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_LINE
        )
        os.chmod(self.path, 0o666)  # any user's job may attach; the kernel says who it is

    async def close(self) -> None:
        self._closing = True  # a daemon that stops ends no run: the part runners reattach
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = peer_of(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        if sum(self._open.values()) >= MAX_CONNECTIONS or self._open[peer.uid] >= MAX_PER_USER:
            log.warning("attach: too many connections (uid %d); refused one", peer.uid)
            writer.close()
            return
        self._open[peer.uid] += 1
        try:
            await self._converse(peer, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._open[peer.uid] -= 1
            writer.close()

    async def _converse(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), FIRST_LINE_S)
        except (TimeoutError, ValueError):  # ValueError: over the limit
            return
        try:
            request = AttachRequest.model_validate_json(line)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            await _send(writer, refusal("invalid_body", f"{where}: {error['msg']}"))
            return
        try:
            reply = self.runs.attach(request, peer)
        except Exception:  # a bug of ours: one refusal, and the daemon goes on
            log.exception("attach of %s failed", request.run_id)
            reply = refusal("internal", "gpud could not attach it (see the daemon's log)")
        await _send(writer, reply)
        if not reply.ok:
            return
        attempt = reply.attempt or request.attempt
        report: EndReport | None = None
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    update = UPDATE.validate_json(line)
                except ValidationError:
                    log.warning("attach: an invalid line from pid %d ignored", peer.pid)
                    continue
                if isinstance(update, EndReport):
                    report = update
                    break
                try:
                    self.runs.update(request.run_id, attempt, update)
                except Exception:
                    log.exception("an update of %s failed", request.run_id)
        except ValueError:  # a line over the limit
            log.warning("attach: an over-long line from pid %d; connection closed", peer.pid)
        finally:
            if not self._closing:
                try:
                    self.runs.ended(request.run_id, attempt, report)
                except Exception:
                    log.exception("the end of %s failed", request.run_id)


async def _send(writer: asyncio.StreamWriter, reply: AttachReply) -> None:
    writer.write(reply.model_dump_json(exclude_none=True).encode() + b"\n")
    with contextlib.suppress(ConnectionError):
        await writer.drain()
