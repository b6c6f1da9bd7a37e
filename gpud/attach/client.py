"""A part runner's link to its node's daemon, over the attach socket (`gpud.attach.wire`).

`Attachment.open()` finds the socket, attaches, and returns the link, or None with the one
line that says why there is none (no daemon here is normal: the run works without one).
A background thread then keeps the link for the part's life: it attaches again when the
daemon restarts, and tells it where the run's other daemons are, as each node's part
runner writes its daemon down in the shared attempt dir (`node-K/daemon.json`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from gpud.attach.wire import (
    AttachReply,
    AttachRequest,
    CoordinatorUpdate,
    EndReport,
    NodesUpdate,
)
from gpud.model.run import ExitInfo, RunState
from gpud.runs.diagnosis.causes import find_cause
from gpud.runs.diagnosis.hints import NO_FACTS, HintFacts, with_hint
from gpud.wire.run_messages import NodeRefIn

#: Where a system daemon's attach socket is (the systemd unit's RuntimeDirectory).
SYSTEM_SOCKET = Path("/run/gpud/attach.sock")
#: The variable that points a job at its daemon's attach dir or socket; `{node}` in it is
#: replaced by the node's name (several daemons on one host, one per Slurm node).
ENV = "GPUD_ATTACH"
CONNECT_TIMEOUT_S = 5.0
#: How often the thread looks for the other nodes' daemons, and retries a lost daemon.
EVERY_S = 2.0
DAEMON_FILE = "daemon.json"


def socket_path(env: Mapping[str, str], node: str) -> Path | None:
    """The attach socket to use: `$GPUD_ATTACH` (a dir or the socket), else the system one."""
    given = env.get(ENV, "").strip()
    if given:
        path = Path(given.replace("{node}", node))
        return path / "attach.sock" if path.is_dir() else path
    return SYSTEM_SOCKET if SYSTEM_SOCKET.exists() else None


def failed_end(
    attempt_dir: Path,
    tail: str,
    exit: ExitInfo,
    *,
    node_rank: int,
    nproc: int,
    facts: HintFacts = NO_FACTS,
) -> EndReport:
    """A part that failed, as the daemon is told: its cause found in the part's files and
    output, as gpud finds the cause of a part it started, with its hint."""
    found = find_cause(attempt_dir, tail, exit, node_rank=node_rank, nproc=nproc)
    cause = with_hint(found, facts)
    rank = f"rank {cause.rank}: " if cause.rank is not None else ""
    return EndReport(
        state=RunState.FAILED,
        reason=f"{rank}{cause.summary} ({cause.kind.label})",
        exit_code=exit.exit_code,
        signal=exit.signal,
        cause=cause,
    )


class AttachLink:
    def __init__(self, path: Path, request: AttachRequest, sock: socket.socket) -> None:
        self.path = path
        self.request = request
        self.reply: AttachReply | None = None
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._sent: list[NodesUpdate | CoordinatorUpdate] = []
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, path: Path | None, request: AttachRequest) -> tuple[AttachLink | None, str]:
        """Attach; (link, "") or (None, why not)."""
        if path is None:
            return None, "no gpud attach socket on this node ($GPUD_ATTACH, /run/gpud)"
        try:
            sock, reply = _attach(path, request)
        except (OSError, ValueError) as exc:
            return None, f"cannot attach to gpud at {path}: {exc}"
        if not reply.ok:
            message = reply.error.message if reply.error else "refused"
            sock.close()
            return None, f"gpud at {path} refused: {message}"
        if reply.attempt and reply.attempt != request.attempt:  # the daemon renumbered it
            where = request.attempt_dir.replace(
                f"attempt-{request.attempt}", f"attempt-{reply.attempt}"
            )
            request = request.model_copy(update={"attempt": reply.attempt, "attempt_dir": where})
        link = cls(path, request, sock)
        link.reply = reply
        return link, ""

    # ------------------------------------------------------------------ while it runs

    def start(self) -> None:
        """Keep the link (and find the other daemons) in the background until `end()`."""
        self.write_daemon_file()
        self._thread = threading.Thread(target=self._keep, name="gpud-attach", daemon=True)
        self._thread.start()

    def end(self, report: EndReport) -> None:
        """The part's last word; then the link closes."""
        self.close(report)

    def close(self, report: EndReport | None = None) -> None:
        """Close the link (without a report, the daemon takes the part for gone)."""
        self._done.set()
        with self._lock:
            if self._sock is not None:
                if report is not None:
                    with contextlib.suppress(OSError):
                        self._sock.sendall(_line(report))
                self._sock.close()
                self._sock = None
        if self._thread is not None:
            self._thread.join(EVERY_S + CONNECT_TIMEOUT_S)

    def _node_dir(self, node_rank: int) -> Path:
        return Path(self.request.attempt_dir).parent / f"node-{node_rank}"

    def write_daemon_file(self) -> None:
        """Where this node's daemon is, for the other nodes' part runners."""
        reply = self.reply
        if reply is None or not reply.control:
            return
        node = NodeRefIn(control=reply.control, server_key=reply.server_key, name=reply.node)
        path = self._node_dir(self.request.node_rank) / DAEMON_FILE
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(node.model_dump_json())
            tmp.replace(path)

    def _read_daemon(self, node_rank: int) -> NodeRefIn | None:
        try:
            return NodeRefIn.model_validate_json(
                (self._node_dir(node_rank) / DAEMON_FILE).read_text()
            )
        except (OSError, ValidationError):
            return None

    def _updates(self) -> list[NodesUpdate | CoordinatorUpdate]:
        req = self.request
        if req.nnodes == 1:
            return []
        if req.node_rank == 0:
            nodes = [None, *(self._read_daemon(k) for k in range(1, req.nnodes))]
            return [NodesUpdate(nodes=nodes)] if any(nodes) else []
        coordinator = self._read_daemon(0)
        return [CoordinatorUpdate(coordinator=coordinator)] if coordinator else []

    def _keep(self) -> None:
        while not self._done.wait(EVERY_S):
            with self._lock:
                if self._done.is_set():
                    return
                if self._sock is None or _closed(self._sock):
                    self._reattach()
                if self._sock is None:
                    continue
                for update in self._updates():
                    if update in self._sent:
                        continue
                    try:
                        self._sock.sendall(_line(update))
                    except OSError:
                        break
                    self._sent = [u for u in self._sent if type(u) is not type(update)]
                    self._sent.append(update)

    def _reattach(self) -> None:
        """The daemon went away (a restart): attach again, and tell it again what it knew."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            sock, reply = _attach(self.path, self.request)
        except (OSError, ValueError):
            return
        if reply.ok:
            self._sock, self.reply = sock, reply
            self._sent = []
            self.write_daemon_file()
        else:
            sock.close()
            self._done.set()  # refused now (the daemon gave the run up): carry on without it


def _attach(path: Path, request: AttachRequest) -> tuple[socket.socket, AttachReply]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(str(path))
        sock.sendall(_line(request))
        reply = AttachReply.model_validate_json(_read_line(sock))
    except (OSError, ValidationError, ValueError):
        sock.close()
        raise
    sock.settimeout(None)
    return sock, reply


def _line(message: AttachRequest | NodesUpdate | CoordinatorUpdate | EndReport) -> bytes:
    return message.model_dump_json().encode() + b"\n"


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the daemon closed the connection")
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    """Whether the daemon's end is gone (it never sends after its reply)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
