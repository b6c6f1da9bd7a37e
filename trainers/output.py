"""A rank's stdout and stderr on a full disk: dropped and counted, never an exception.

torchrun's `--tee` (which gpud uses, for the rank prefixes) points every worker's stdout
and stderr at files in the attempt dir, on the daemon's state dir. When that disk fills,
a `print()` raises OSError (ENOSPC), and the rank dies of its own log line. `guard()`
wraps both streams when they are files: a write the disk refuses is dropped and counted,
and the first write that fits again is preceded by one line saying how much was lost.
Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any, TextIO

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class FullDiskTolerant:
    """A text stream that swallows the disk's refusals; everything else is the stream's."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.dropped_writes = 0
        self.dropped_chars = 0
        self._failed: OSError | None = None

    def write(self, text: str) -> int:
        if self._failed is not None and not self._say_dropped():
            return self._drop(text)
        try:
            return self._inner.write(text)
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            self._failed = exc
            return self._drop(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            self._failed = exc

    def _drop(self, text: str) -> int:
        self.dropped_writes += 1
        self.dropped_chars += len(text)
        return len(text)

    def _say_dropped(self) -> bool:
        """After a refusal: whether the disk takes writes again (this line says so)."""
        failed = self._failed
        assert failed is not None
        line = (
            f"\n[gpud] {self.dropped_chars} characters of this rank's output were dropped:"
            f" {errno.errorcode.get(failed.errno or 0, 'ENOSPC')} ({failed.strerror})\n"
        )
        try:
            self._inner.write(line)
            self._inner.flush()
        except OSError:
            return False
        self._failed = None
        self.dropped_writes = self.dropped_chars = 0
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _is_file(stream: TextIO) -> bool:
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def guard() -> None:
    """Make sys.stdout and sys.stderr tolerate a full disk, where they are files."""
    if _is_file(sys.stdout) and not isinstance(sys.stdout, FullDiskTolerant):
        sys.stdout = FullDiskTolerant(sys.stdout)
    if _is_file(sys.stderr) and not isinstance(sys.stderr, FullDiskTolerant):
        sys.stderr = FullDiskTolerant(sys.stderr)
