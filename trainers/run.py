"""`trainers.init()` and the `Run` a training script talks to.

Integration in a plain loop:

    run = trainers.init()
    for step in range(start, max_steps):
        ...train...
        run.log(step, loss=loss, lr=lr)
        if run.should_stop():
            run.stopped(checkpoint=ckpt.save(step, state), step=step)
            break
    run.finish()

Outside gpud (no GPUD_RUN_ID) `init()` returns a detached Run whose `log()` and
`should_stop()` cost a function call and do nothing, so the same script runs anywhere.
torch is imported only inside the calls that need it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from trainers.env import Hints, RunEnv
from trainers.link import GpudLink

LIBRARY_VERSION = "1"


class Run:
    def __init__(self, env: RunEnv) -> None:
        self.env = env
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.world_size = env.world_size
        self.hints: Hints = env.hints
        self.resume_from = env.resume_from
        self.stop_reason: str | None = None
        self._stop = threading.Event()
        self._agree_group: Any = None
        self._link: GpudLink | None = None
        if env.launched:
            self._start_link()

    # ------------------------------------------------------------------ setup

    def _start_link(self) -> None:
        env = self.env
        assert env.run_id is not None
        jsonl = None
        if self.rank == 0 and env.run_dir:
            jsonl = str(Path(env.run_dir) / "metrics.jsonl")
        self._link = GpudLink(env.run_id, env.ingest, env.control, jsonl, self._request_stop)
        self._send(
            "hello",
            {
                "world_size": self.world_size,
                "local_rank": self.local_rank,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "library": LIBRARY_VERSION,
            },
        )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._request_stop("SIGTERM")

    def _request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    def _send(self, kind: str, body: dict[str, Any]) -> None:
        if self._link is None:
            return
        body["run"] = self.env.run_id
        body["attempt"] = self.env.attempt
        body["rank"] = self.rank
        body["time"] = time.time()
        self._link.put(kind, body)

    @property
    def launched(self) -> bool:
        return self.env.launched

    @property
    def dropped(self) -> int:
        """Messages lost so far (queue full, or gpud down); metrics.jsonl still has them."""
        return self._link.dropped if self._link else 0

    # ------------------------------------------------------------------ hot path

    def log(self, step: int, **metrics: float) -> None:
        """Record metrics for `step` (rank 0 only; other ranks return at once). Never blocks."""
        link = self._link
        if link is None or self.rank != 0:
            return
        link.put(
            "metrics",
            {
                "run": self.env.run_id,
                "attempt": self.env.attempt,
                "step": step,
                "time": time.time(),
                "values": metrics,
            },
        )

    def should_stop(self) -> bool:
        """True once gpud asked this run to stop (or SIGTERM arrived), on every rank alike.

        In a distributed run the ranks agree (a one-integer all-reduce on a gloo group) so
        they all stop after the same step; call it at the same point of the loop on every
        rank.
        """
        local = self._stop.is_set()
        if self.world_size <= 1 or not self.launched:
            return local
        return self._agree(local)

    def _agree(self, local: bool) -> bool:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return local
        if self._agree_group is None:
            # A CPU-side group: no CUDA sync on NCCL runs, and no interference with the
            # trainer's own collectives.
            same = dist.get_backend() == "gloo"
            self._agree_group = dist.group.WORLD if same else dist.new_group(backend="gloo")
        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._agree_group)
        agreed = bool(flag.item())
        if agreed and not local:
            self._request_stop("another rank was asked to stop")
        return agreed

    # ------------------------------------------------------------------ reports

    def checkpoint_saved(self, path: str | os.PathLike[str], step: int) -> None:
        """Tell gpud a checkpoint exists (rank 0); resume uses the latest one reported."""
        if self.rank == 0:
            self._send("checkpoint", {"path": str(path), "step": step})

    def stopped(self, checkpoint: str | os.PathLike[str] | None, step: int) -> None:
        """After a stop: the checkpoint written for it and the last completed step."""
        if self.rank == 0:
            self._send(
                "stopped",
                {"checkpoint": None if checkpoint is None else str(checkpoint), "step": step},
            )

    def finish(self, exit_code: int = 0) -> NoReturn:
        """End the process cleanly: barrier, destroy the process group, flush, `_exit`.

        gloo can abort a rank at interpreter exit after training finished (SIGABRT);
        leaving through here avoids that.
        """
        if self.stop_reason is None:
            # Training ran to its end (not stopped): gpud uses this to tell a teardown abort
            # after a complete run from a real failure.
            self._send("finished", {"exit_code": exit_code})
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        except Exception as exc:  # ending must not turn into a crash
            print(f"[gpud] process group teardown: {exc}", file=sys.stderr)
        if self._link is not None:
            self._link.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


_current: Run | None = None


def init() -> Run:
    """The Run of this process (created on first call; later calls return the same)."""
    global _current  # noqa: PLW0603 - one Run per process, by design
    if _current is None:
        _current = Run(RunEnv.from_environ())
    return _current
