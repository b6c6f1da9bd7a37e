"""The audit log: who did what to the node, in JSON lines in the state dir.

- Every operator action the daemon accepted is one record, written (and flushed) before
  the reply goes out, and so is every change of the authorized keys: `gpuctl keys
  authorize`/`revoke` record who ran them, and the daemon records each change it loads
  from the file (hand edits included).
- A refusal (an operator method that failed, or a key without the role for it) is a record
  too, but a burst of identical ones — same action, caller, role and error code — is not
  a record each: the first is written in full, the rest are counted and written as one
  summary per interval ("412 more refused run.stop from op@host in the last 10 s:
  not_found", with `count` and `since`). An operator key refused 8,000 times a second thus
  writes a few hundred bytes a minute, not megabytes.
- The file is bounded: past a quarter of `max_bytes` it is rotated (`audit.log.1` ..
  `audit.log.3`, the oldest dropped), so the log and its rotations stay under `max_bytes`.
"""

from __future__ import annotations

import os
import pwd
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gpud.bursts import INTERVAL_S, Bursts, Summary

#: Rotated files kept beside the live one.
KEEP = 3
#: The default bound of the log and its rotated files together (`gpud serve
#: --audit-max-mb`); at about 300 bytes a record, some 200,000 records.
DEFAULT_MAX_BYTES = 64 * 2**20

#: The audit log's name in a state dir.
AUDIT_LOG = "audit.log"

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


def append_record(path: Path, record: AuditRecord) -> None:
    """Append one record to an audit log the caller does not hold open (gpuctl's key
    changes: the daemon may be running, or not). One write: appends never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (record.model_dump_json() + "\n").encode())
    finally:
        os.close(fd)


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
        self.file_bytes = max(4096, max_bytes // (KEEP + 1))
        self._wall = wall
        self._lock = threading.Lock()  # the daemon records key changes from other threads
        self._refusals: Bursts[_Key] = Bursts(interval_s, clock=clock)
        self._fd = -1
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        os.close(self._fd)
        for n in range(KEEP, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if newer.exists():
                os.replace(newer, older)
        self._open()

    def _write(self, entry: AuditRecord) -> None:
        line = (entry.model_dump_json() + "\n").encode()
        with self._lock:
            if self._fd < 0:
                return  # closed: the daemon is stopping
            if self._size and self._size + len(line) > self.file_bytes:
                self._rotate()
            os.write(self._fd, line)
            self._size += len(line)

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
        of its kind in a while, else counted for the next summary."""
        entry = AuditRecord(
            time=self._wall(),
            caller=caller,
            role=role,
            action=action,
            body=body,
            ok=ok,
            detail=detail,
            code=code,
        )
        if ok or self._refusals.admit((action, caller, role, code or "")):
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
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
