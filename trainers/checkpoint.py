"""Checkpoints that make a resumed run continue exactly where it stopped.

`Checkpointer.save()` is collective: every rank calls it, each rank's RNG states are
gathered, and rank 0 writes one file atomically (temp file, fsync, rename), keeps the last
K and reports it to gpud. `load()` restores this rank's RNG states and returns what was
saved. DeepSpeed engines save on all ranks with their own format: `save_deepspeed()` /
`load_deepspeed()` wrap that the same way.

torch is imported here, so `import trainers` stays light; import this module from
training code only.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers.run import Run

FORMAT = 1
_STEP_NAME = re.compile(r"^step_(\d{8})(\.pt)?$")


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

    def path_for(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.pt"

    # ------------------------------------------------------------------ plain torch

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Collective. Rank 0 writes `state` plus every rank's RNG state; returns the path."""
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
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(self.dir)
            self._prune()
            self.run.checkpoint_saved(path, step)
        if _distributed():
            dist.barrier()
        return path

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
        rngs = _gather_rng()
        engine.save_checkpoint(
            str(self.dir), tag=tag, client_state={**client_state, "step": step, "rng": rngs}
        )
        path = self.dir / tag
        if self.run.rank == 0:
            self._prune()
            self.run.checkpoint_saved(path, step)
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
