"""Where gpud keeps things: the daemon's state dir and the user's config dir.

The state dir belongs to one daemon (keys, database, run dirs, audit log). The config dir
belongs to the user who runs gpuctl and gputop (their client key and the known-nodes file).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STATE_DIR_ENV = "GPUD_STATE_DIR"
CONFIG_DIR_ENV = "GPUD_CONFIG_DIR"


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base) if base else Path.home() / fallback


def default_state_dir() -> Path:
    """`$GPUD_STATE_DIR`, else `$XDG_STATE_HOME/gpud`, else `~/.local/state/gpud`."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return _xdg("XDG_STATE_HOME", ".local/state") / "gpud"


def config_dir() -> Path:
    """`$GPUD_CONFIG_DIR`, else `$XDG_CONFIG_HOME/gpud`, else `~/.config/gpud`."""
    explicit = os.environ.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return _xdg("XDG_CONFIG_HOME", ".config") / "gpud"


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) readable only by the owner; tighten it if it exists."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Serialize read-modify-write of `path` across processes (a sibling `.lock` file)."""
    ensure_private_dir(path.parent)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
