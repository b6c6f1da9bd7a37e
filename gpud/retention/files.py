"""A run's files: how many bytes its run dir holds, and removing it — never a checkpoint.

What is kept: the run's checkpoint dir and its latest checkpoint (a file or a dir),
wherever they are; `checkpoint.keep_last` is the only thing that prunes checkpoints. When
the run dir holds them (the default `checkpoint.dir` is `<run dir>/checkpoints`), the rest
of the run dir goes and they stay. A run dir outside the state dir's `runs/` (a run gpud
did not start: Slurm, a pod) is never touched: its owner chose where it lives.

Runs in a worker thread: nothing here touches the loop or the database.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class DirBytes:
    """A run dir's bytes: what retention may remove, and the checkpoints it keeps."""

    removable: int = 0
    checkpoints: int = 0


@dataclass
class Removed:
    """What removing one run dir did."""

    bytes: int = 0
    kept: list[str] = field(default_factory=list)  # checkpoint paths left in place
    errors: list[str] = field(default_factory=list)
    outside: bool = False  # the run dir is not under the state dir: left alone


def keep_paths(checkpoint_dir: str | None, last_checkpoint: str | None) -> list[str]:
    """What of a run is never removed, as real paths."""
    found = []
    for path in (checkpoint_dir, last_checkpoint):
        if path:
            found.append(os.path.realpath(path))
    return found


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def measure(path: Path, keep: list[str]) -> DirBytes:
    """Bytes under `path` (symlinks not followed), those under a kept path apart."""
    out = DirBytes()
    _walk(str(path), keep, out, kept=False)
    return out


#: A dir that holds still is measured again at most this often: a pass, or a reading of
#: the state dir's size between passes, takes the figure kept meanwhile.
MEASURED_FOR_S = 3600.0


class Sizes:
    """Dirs' sizes, kept while what they depend on (`stamp`) holds still: a finished run's
    dir has no writer left, and walking 500 of them took a retention pass 0.44 s of CPU
    each time, 0.74 % of a core at one pass a minute. Used from the retention thread only."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[object, float, DirBytes]] = {}
        self._seen: set[str] = set()

    def measure(self, path: Path, keep: list[str], stamp: object | None, now: float) -> DirBytes:
        """`measure(path, keep)`, or its figure kept for the same `stamp` (None: a dir
        still written to, measured every time)."""
        key = str(path)
        self._seen.add(key)
        held = self._held.get(key)
        fresh = held is not None and now - held[1] < MEASURED_FOR_S
        if stamp is not None and held is not None and fresh and held[0] == stamp:
            return held[2]
        found = measure(path, keep)
        if stamp is None:
            self._held.pop(key, None)
        else:
            self._held[key] = (stamp, now, found)
        return found

    def forget_unseen(self) -> None:
        """Let go of the dirs not measured since the last call (their runs are gone)."""
        for key in [k for k in self._held if k not in self._seen]:
            del self._held[key]
        self._seen.clear()


def _walk(path: str, keep: list[str], out: DirBytes, kept: bool) -> None:
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        here = kept or any(_inside(os.path.realpath(entry.path), k) for k in keep)
        try:
            if entry.is_dir(follow_symlinks=False):
                _walk(entry.path, keep, out, here)
                continue
            size = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        if here:
            out.checkpoints += size
        else:
            out.removable += size


def within(run_dir: Path, runs_root: Path) -> bool:
    """Whether `run_dir` is a run dir of this state dir (under `runs/`, not `runs/` itself)."""
    real, root = os.path.realpath(run_dir), os.path.realpath(runs_root)
    return real != root and _inside(real, root)


def remove_run_dir(run_dir: Path, runs_root: Path, keep: list[str]) -> Removed:
    """Remove the run dir but what `keep` names (and the dirs that lead to it)."""
    done = Removed()
    if not within(run_dir, runs_root):
        done.outside = True
        return done
    if not run_dir.exists():
        return done
    _remove(str(run_dir), keep, done)
    try:
        run_dir.rmdir()  # only when nothing was kept in it
    except OSError:
        pass
    return done


def _remove(path: str, keep: list[str], done: Removed) -> None:
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        done.errors.append(f"{path}: {exc.strerror}")
        return
    for entry in entries:
        real = os.path.realpath(entry.path)
        if not entry.is_symlink() and any(_inside(real, k) for k in keep):
            try:
                os.rmdir(entry.path)  # an empty checkpoint dir holds nothing to keep
            except OSError:
                done.kept.append(entry.path)
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if any(_inside(k, real) for k in keep):
                    _remove(entry.path, keep, done)  # a kept path lies inside: go around it
                    continue
                size = measure(Path(entry.path), []).removable
                shutil.rmtree(entry.path)
            else:
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
            done.bytes += size
        except OSError as exc:
            done.errors.append(f"{entry.path}: {exc.strerror}")
