"""A daemon's state dir: its layout, and the lock that gives it to one daemon at a time.

The lock is an `flock` on `gpud.pid`, held for the daemon's life and released by the
kernel even if the daemon is killed, so a stale file never blocks a restart.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from gpud.node.paths import ensure_private_dir

#: The audit log's name in a state dir (`gpud.security.audit` writes it).
AUDIT_LOG = "audit.log"


class StateDirBusy(Exception):
    """Another live daemon holds this state dir."""

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"gpud pid {pid}" if pid else "another gpud"
        super().__init__(
            f"state dir {path} is in use by {holder}; stop it, or pass another --state-dir"
        )
        self.pid = pid


class StateDir:
    """Paths inside one state dir. `acquire()` before writing anything."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self._lock_fd: int | None = None
        #: Sockets made in a private dir under /tmp (`ipc_endpoint`), removed at `release`.
        self._outside: list[Path] = []

    @property
    def pid_file(self) -> Path:
        return self.root / "gpud.pid"

    @property
    def database(self) -> Path:
        return self.root / "gpud.db"

    @property
    def audit_log(self) -> Path:
        return self.root / AUDIT_LOG

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def ipc_endpoint(self, name: str) -> str:
        """`ipc://` endpoint for a local socket; a short private dir when the path is long.

        Unix socket paths are limited to ~107 bytes, and state dirs (tests, home dirs on
        deep mounts) can be longer than that.
        """
        path = self.root / "sock" / name
        if len(str(path)) > 100:
            digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
            path = Path(tempfile.gettempdir()) / f"gpud-{os.getuid()}-{digest}" / name
            self._outside.append(path)
        ensure_private_dir(path.parent)
        return f"ipc://{path}"

    def acquire(self) -> None:
        ensure_private_dir(self.root)
        fd = os.open(self.pid_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(self.root, read_pid(self.pid_file)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def release(self) -> None:
        """Let go of the state dir; the sockets made outside it (and their dir, once
        empty) go with it, so /tmp does not keep one dir per daemon that ever ran. Only
        the holder of the lock releases: no other daemon uses these paths meanwhile."""
        if self._lock_fd is None:
            return
        for path in self._outside:
            try:
                path.unlink(missing_ok=True)
                path.parent.rmdir()
            except OSError:
                pass  # not empty yet (the other socket), or gone
        self._outside = []
        os.ftruncate(self._lock_fd, 0)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = None


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def held_by(pid_file: Path) -> int | None:
    """The pid of the live daemon holding this state dir, or None when none holds it."""
    try:
        fd = os.open(pid_file, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(pid_file)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
