"""The audit log: one JSON line per accepted operator action, in the state dir."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class AuditRecord(BaseModel):
    time: float
    caller: str
    role: str
    action: str
    body: dict[str, Any]
    ok: bool
    detail: str | None = None


class AuditLog:
    """Append-only; each record is flushed before the reply goes out."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "a", buffering=1)

    def record(
        self,
        caller: str,
        role: str,
        action: str,
        body: dict[str, Any],
        ok: bool,
        detail: str | None = None,
    ) -> None:
        entry = AuditRecord(
            time=time.time(),
            caller=caller,
            role=role,
            action=action,
            body=body,
            ok=ok,
            detail=detail,
        )
        self._file.write(entry.model_dump_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
