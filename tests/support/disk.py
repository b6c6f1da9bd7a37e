"""A small disk of its own for a test: a tmpfs of a few megabytes, filled and emptied.

Mounting needs root (CAP_SYS_ADMIN): where it is refused, the test is skipped and says so.
A real filesystem, so what fills it is what a user's full disk does: the kernel answers
ENOSPC, SQLite `database or disk is full`, torch's writer a short write.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FILLER = ".filler"


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self) -> int:
        """Write a file until the disk says ENOSPC; returns its size. `make_room()` deletes
        it. (Whatever else writes there meanwhile finds the disk full too.)"""
        chunk = b"\0" * (64 << 10)
        fd = os.open(self.path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        written = 0
        try:
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return written
                    chunk = chunk[: len(chunk) // 2]
        finally:
            os.close(fd)

    def make_room(self) -> None:
        (self.path / FILLER).unlink(missing_ok=True)

    def grow(self, size: str) -> None:
        """The disk becomes `size` (a bigger volume, or another job's files deleted)."""
        subprocess.run(
            ["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True
        )


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[SmallDisk]:
    """A tmpfs of `size` (e.g. "12m") mounted on `path` for the block; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount(8) here: a full disk needs a tmpfs of its own")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs ({done.stderr.strip()}): the full-disk tests run as root"
        )
    try:
        yield SmallDisk(path)
    finally:
        # Lazily: a process the test failed to end must not keep the mount for good.
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
