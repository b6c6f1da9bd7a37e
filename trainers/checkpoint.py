"""Checkpoints that make a resumed run continue exactly where it stopped.

`Checkpointer.save()` is collective: every rank calls it, each rank's RNG states are
gathered, and rank 0 writes one file atomically (temp file, fsync, rename), keeps the last
K and reports it to gpud. A save that fails takes its temporary file with it; one that
does not fit on the disk raises `CheckpointSpaceError`, which names the dir and the room
it lacked. A temporary file that no save holds (a save killed half-way) is removed when
the next Checkpointer starts on rank 0. `load()` restores this rank's RNG states and
returns what was saved. DeepSpeed engines save on all ranks with their own format:
`save_deepspeed()` / `load_deepspeed()` wrap that the same way.

torch is imported here, so `import trainers` stays light; import this module from
training code only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers.output import DISK_FULL
from trainers.run import Run

FORMAT = 1
_STEP_NAME = re.compile(r"^step_(\d{8})(\.pt)?$")
#: The temporary file of a save in progress (`save()` holds an flock on it while it writes).
_TEMP_NAME = re.compile(r"^\.step_\d{8}\.pt\.tmp$")
#: What torch's zip writer says when a write under it came up short (the disk filled).
_SHORT_WRITE = re.compile(r"unexpected pos|file write failed|PytorchStreamWriter failed")


class CheckpointSpaceError(OSError):
    """A checkpoint did not fit on its disk; its partial file has been removed."""

    def __init__(self, directory: Path, step: int, need_bytes: int, free_bytes: int) -> None:
        super().__init__(errno.ENOSPC, "")
        self.directory = directory
        self.step = step
        self.need_bytes = need_bytes
        self.free_bytes = free_bytes

    def __str__(self) -> str:
        return (
            f"no space left on {self.directory} (checkpoint step {self.step} needs"
            f" ~{self.need_bytes / 1e6:.1f} MB, {self.free_bytes / 1e6:.1f} MB free)"
        )


def _tensor_bytes(value: Any, seen: set[int] | None = None) -> int:
    """What the tensors in `value` hold (each storage once): a checkpoint's size, nearly."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return int(storage.nbytes())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in value)
    return 0


def out_of_room(exc: BaseException, directory: Path, need: int) -> bool:
    """Whether a failed save failed for lack of room: an ENOSPC anywhere in the chain of
    exceptions, or torch's short-write error on a disk without `need` bytes free."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, RuntimeError) and _SHORT_WRITE.search(str(exc)):
        return shutil.disk_usage(directory).free < need
    return False


def remove_abandoned(directory: Path) -> list[Path]:
    """Remove the temporary files no save is writing (one killed half-way left them: they
    only hold the disk); a save in progress holds an flock on its own, and is left be."""
    removed = []
    try:
        names = [p for p in directory.iterdir() if _TEMP_NAME.match(p.name)]
    except OSError:
        return []
    for path in names:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live save
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from, on this rank."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


def _gather_rng() -> list[dict[str, Any]]:
    mine = rng_state()
    if not _distributed():
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def _restore_rng(states: list[dict[str, Any]], rank: int) -> None:
    if rank < len(states):
        set_rng_state(states[rank])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Saves to `directory` (default: the run's checkpoint dir) and keeps the last K."""

    def __init__(self, run: Run, directory: str | None = None, keep_last: int | None = None):
        self.run = run
        self.dir = Path(directory or run.env.checkpoint_dir or "checkpoints")
        self.keep_last = keep_last or run.env.checkpoint_keep
        if run.rank == 0:
            for path in remove_abandoned(self.dir):
                print(f"[gpud] removed {path}: a save that never finished left it", flush=True)

    def path_for(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.pt"

    # ------------------------------------------------------------------ plain torch

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Collective. Rank 0 writes `state` plus every rank's RNG state; returns the path."""
        began = time.monotonic()
        rngs = _gather_rng()
        path = self.path_for(step)
        if self.run.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            payload = {
                "format": FORMAT,
                "step": step,
                "world_size": self.run.world_size,
                "rng": rngs,
                "state": state,
            }
            self._write(path, step, payload)
            self._prune()
            self.run.checkpoint_saved(path, step, time.monotonic() - began)
        if _distributed():
            dist.barrier()
        return path

    def _write(self, path: Path, step: int, payload: dict[str, Any]) -> None:
        """Temp file (flocked while written), fsync, rename; on failure no temp is left,
        and a disk without room is named (CheckpointSpaceError)."""
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "wb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(self.dir)
        except BaseException as exc:
            try:
                written = tmp.stat().st_size
                tmp.unlink()
            except OSError:
                written = 0
            if isinstance(exc, Exception):
                need = max(written, _tensor_bytes(payload))
                if out_of_room(exc, self.dir, need):
                    free = shutil.disk_usage(self.dir).free
                    raise CheckpointSpaceError(self.dir, step, need, free) from exc
            raise

    def load(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """The saved `state` plus `step`, or None when there is nothing to resume from."""
        source = path or self.run.resume_from
        if not source:
            return None
        payload = torch.load(source, map_location="cpu", weights_only=False)
        _restore_rng(payload["rng"], self.run.rank)
        return {"step": payload["step"], **payload["state"]}

    # ------------------------------------------------------------------ DeepSpeed

    def save_deepspeed(self, engine: Any, step: int, client_state: dict[str, Any]) -> Path:
        """Collective: DeepSpeed's own sharded save, with every rank's RNG state."""
        tag = f"step_{step:08d}"
        began = time.monotonic()
        rngs = _gather_rng()
        engine.save_checkpoint(
            str(self.dir), tag=tag, client_state={**client_state, "step": step, "rng": rngs}
        )
        path = self.dir / tag
        if self.run.rank == 0:
            self._prune()
            self.run.checkpoint_saved(path, step, time.monotonic() - began)
        if _distributed():
            dist.barrier()
        return path

    def load_deepspeed(
        self, engine: Any, path: str | os.PathLike[str] | None = None
    ) -> dict[str, Any] | None:
        source = path or self.run.resume_from
        if not source:
            return None
        where = Path(source)
        _, client_state = engine.load_checkpoint(str(where.parent), tag=where.name)
        if client_state is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint at {where}")
        _restore_rng(client_state.get("rng", []), self.run.rank)
        return dict(client_state)

    # ------------------------------------------------------------------ housekeeping

    def _prune(self) -> None:
        saved = sorted(p for p in self.dir.iterdir() if _STEP_NAME.match(p.name))
        for old in saved[: -self.keep_last]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
