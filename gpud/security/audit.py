"""The audit log: who did what to the node, in JSON lines in the state dir.

- Every operator action the daemon accepted is one record, written (and flushed) before
  the reply goes out, and so is every change of the authorized keys: `gpuctl keys
  authorize`/`revoke` record who ran them, and the daemon records each change it loads
  from the file (hand edits included). These go to `audit.log`.
- A refusal (an operator method that failed, or a key without the role for it) is a record
  too, in a file of its own, `audit-refused.log`, so that no flood of refusals from a
  viewer or a revoked key can push an accepted action out. It never carries the request's
  body, only its size and a digest (`body_bytes`, `body_sha256`): a refused body is
  untrusted input of up to the wire's 4 MiB. A burst of identical ones — same action,
  caller, role and error code — is not a record each: the first is written, the rest are
  counted and written as one summary per interval ("412 more refused run.stop from
  op@host in the last 10 s: not_found", with `count` and `since`).
- No record is large: an accepted body over `body_max` (16 KiB, less for a small bound) is
  kept as its size and digest too, and a detail is cut at DETAIL_MAX characters.
- Both are bounded, together under `max_bytes` to the byte: accepted records get three
  quarters of it, refusals a quarter; each is rotated (`.1` .. `.3`, the oldest dropped)
  before a write would take its file past its share's quarter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gpud.security.bursts import INTERVAL_S, Bursts, Summary, ThrottledLog

#: Rotated files kept beside the live one.
KEEP = 3
#: The default bound of the log and its rotated files together (`gpud serve
#: --audit-max-mb`); at about 300 bytes a record, some 200,000 records.
DEFAULT_MAX_BYTES = 64 * 2**20

log = logging.getLogger("gpud.audit")
_unwritten = ThrottledLog(log)

#: The audit log's refusals, beside it in the state dir.
REFUSED_LOG = "audit-refused.log"
#: The share of the bound that refusals may use (accepted records keep the rest).
REFUSED_SHARE = 0.25
#: The most of a body a record keeps (beyond: its size and digest), and of a detail.
BODY_MAX = 16 * 1024
DETAIL_MAX = 1024

_Key = tuple[str, str, str, str]  # action, caller, role, error code


def local_user() -> str:
    """Who runs this process, as the audit log names a person at the machine: the
    effective user (and whoever ran sudo), and the host."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    sudo = os.environ.get("SUDO_USER")
    via = f" (sudo by {sudo})" if sudo and sudo != user else ""
    return f"{user}@{socket.gethostname()}{via}"


class AuditRecord(BaseModel):
    time: float
    caller: str
    role: str
    action: str
    body: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    detail: str | None = None
    code: str | None = Field(None, description="a refusal's error code")
    count: int = Field(1, description="how many identical refusals this record stands for")
    since: float | None = Field(None, description="a summary's: when the first came")
    body_bytes: int | None = Field(
        None, description="a body not kept (a refusal's, or too large): its size as JSON"
    )
    body_sha256: str | None = Field(None, description="… and its SHA-256, hex")


def canonical(body: dict[str, Any]) -> bytes:
    """A body as JSON, compact with its keys sorted: what `body_bytes` and `body_sha256`
    measure."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str).encode()


def append_record(path: Path, record: AuditRecord) -> None:
    """Append one record to an audit log the caller does not hold open (gpuctl's key
    changes: the daemon may be running, or not). One write: appends never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (record.model_dump_json() + "\n").encode())
    finally:
        os.close(fd)


class _Bounded:
    """One file and its rotations, together under `max_bytes`. A write the disk refuses
    (a full state dir) is counted and logged, never raised: the request is answered."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.file_bytes = max(1024, max_bytes // (KEEP + 1))
        self.lost = 0  # records a write refused
        self._closed = False
        self._fd = -1
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        for n in range(KEEP, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if newer.exists():
                os.replace(newer, older)
        self._open()

    def write(self, line: bytes) -> None:
        if self._closed:
            return  # the daemon is stopping
        try:
            if self._fd < 0:
                self._open()  # a rotation the disk cut short
            # the file's own size (gpuctl appends key changes to it while the daemon runs)
            if os.fstat(self._fd).st_size + len(line) > self.file_bytes:
                self._rotate()
            os.write(self._fd, line)
        except OSError as exc:
            self.lost += 1
            _unwritten.warning(
                self.path.name, f"{self.path}: a record could not be written ({exc.strerror});"
                f" {self.lost} lost so far"
            )  # fmt: skip

    def close(self) -> None:
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class AuditLog:
    """Append-only, bounded; accepted actions are flushed before the reply goes out."""

    def __init__(
        self,
        path: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        refused_bytes = int(max_bytes * REFUSED_SHARE)
        self._accepted = _Bounded(path, max_bytes - refused_bytes)
        self._refused = _Bounded(path.with_name(REFUSED_LOG), refused_bytes)
        # a record always fits in a file of its share, with room to spare
        self.body_max = min(BODY_MAX, self._refused.file_bytes // 4)
        self._wall = wall
        self._lock = threading.Lock()  # the daemon records key changes from other threads
        self._refusals: Bursts[_Key] = Bursts(interval_s, clock=clock)

    def _write(self, entry: AuditRecord) -> None:
        line = (entry.model_dump_json() + "\n").encode()
        with self._lock:
            (self._accepted if entry.ok else self._refused).write(line)

    def record(
        self,
        caller: str,
        role: str,
        action: str,
        body: dict[str, Any],
        ok: bool,
        detail: str | None = None,
        code: str | None = None,
    ) -> None:
        """One action. Accepted (`ok`): written now. Refused: written now if it is the first
        of its kind in a while, else counted for the next summary; without its body."""
        if not ok and not self._refusals.admit((action, caller, role, code or "")):
            return
        data = canonical(body)
        kept = ok and len(data) <= self.body_max
        entry = AuditRecord(
            time=self._wall(),
            caller=caller[:DETAIL_MAX],
            role=role,
            action=action[:DETAIL_MAX],
            body=body if kept else {},
            ok=ok,
            detail=None if detail is None else detail[:DETAIL_MAX],
            code=code,
            body_bytes=None if kept else len(data),
            body_sha256=None if kept else hashlib.sha256(data).hexdigest(),
        )
        self._write(entry)

    def flush(self, everything: bool = False) -> None:
        """Write the summaries of refusal bursts whose interval is over (all with
        `everything`, at shutdown)."""
        summaries = self._refusals.drain() if everything else self._refusals.due()
        for summary in summaries:
            self._write(self._summary(summary))

    def _summary(self, summary: Summary[_Key]) -> AuditRecord:
        now = self._wall()
        if len(summary.key) == 4:
            action, caller, role, code = summary.key
        else:  # more kinds of refusal than the log follows at once
            action, caller, role, code = "(various)", "(various)", "", ""
        seconds = summary.seconds
        return AuditRecord(
            time=now,
            caller=caller,
            role=role,
            action=action,
            ok=False,
            code=code or None,
            count=summary.count,
            since=now - seconds,
            detail=f"{summary.count} more refused {action} from {caller} in the last "
            f"{seconds:.0f} s: {code}",
        )

    def close(self) -> None:
        self.flush(everything=True)
        with self._lock:
            self._accepted.close()
            self._refused.close()
