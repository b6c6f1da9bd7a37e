"""`trainers.init()` and the `Run` a training script talks to.

Integration in a plain loop (call `log` and `should_stop` on every rank, at the same
point of the loop; only rank 0's metrics are kept). `step` is the 0-based loop index of
the step just finished; gpud shows index + 1 as the steps done (20/20 when the last index
of `range(0, 20)` is logged):

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

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from trainers import errors, output
from trainers.env import Hints, RunEnv
from trainers.flops import FlopCount
from trainers.hooks import TestHooks
from trainers.link import QUEUE_CAPACITY, GpudLink, Item
from trainers.pulse import Pulse
from trainers.wandb_mirror import WandbMirror

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
        self.last_probe: Any = None
        self._stop = threading.Event()
        self._pulse = Pulse(time.time())
        self._hooks = TestHooks.from_env(os.environ, self.rank) if env.launched else None
        self._agreement: Any = None
        self._agreed = False
        self._probe_every: int | None = None
        self._probe_bytes: int | None = None
        self._probed_step: int | None = None
        self._link: GpudLink | None = None
        self._flops = FlopCount(self._counted) if env.launched else None
        self._host = socket.gethostname()
        self._run_id = env.run_id
        self._attempt = env.attempt
        self._ended = False
        if env.launched:
            self._start_link()

    # ------------------------------------------------------------------ setup

    def _start_link(self) -> None:
        env = self.env
        assert env.run_id is not None
        output.guard()  # torchrun's --tee files live on the state dir, which may fill
        error_file = errors.error_file(os.environ, self.rank)
        if error_file is not None:
            errors.install(error_file, step=lambda: self._pulse.step)
        jsonl = mirror = None
        if self.rank == 0 and env.run_dir:
            jsonl = str(Path(env.run_dir) / "metrics.jsonl")
        if self.rank == 0 and env.wandb:
            mirror = WandbMirror(env.run_id, env.attempt, env.run_dir, _hints_config(self.hints))
        self._link = GpudLink(
            env.run_id,
            env.ingest,
            env.control,
            jsonl,
            self._request_stop,
            on_dump=self._dump_flight_recorder,
            ticker=self._tick,
            mirror=mirror,
            token=env.ingest_token,
        )
        self._send(
            "hello",
            {
                "world_size": self.world_size,
                "local_rank": self.local_rank,
                "node_rank": env.node_rank,
                "node": env.node,
                "nnodes": env.nnodes,
                "host": self._host,
                "pid": os.getpid(),
                "library": LIBRARY_VERSION,
            },
        )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _dump_flight_recorder(self) -> None:
        """gpud saw a hang: write this rank's flight-recorder trace where torch writes its
        own dump on a collective timeout (runs on the link thread: the training thread is
        most likely stuck in the collective)."""
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        if not prefix:
            return
        try:
            import torch
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            trace = torch._C._distributed_c10d._dump_fr_trace()  # type: ignore[attr-defined]
            path = f"{prefix}{self.rank}"
            with open(path + ".tmp", "wb") as f:
                f.write(trace)
            os.replace(path + ".tmp", path)
        except Exception:  # a missing dump must never kill the rank
            return

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

    def _tick(self, force: bool = False) -> list[Item]:
        """Called by the link thread: a heartbeat when one is due (or `force`d)."""
        now = time.time()
        beat = self._pulse.heartbeat(now, force=force)
        if beat is None:
            return []
        agreement = self._agreement
        waiting_since = agreement.waiting_since() if agreement is not None else None
        if waiting_since is not None and beat["phase"] == "compute":
            beat.update(phase="collective", phase_since=waiting_since)
        link = self._link
        beat.update(
            run=self.env.run_id,
            attempt=self.env.attempt,
            rank=self.rank,
            time=now,
            local_rank=self.local_rank,
            world_size=self.world_size,
            node_rank=self.env.node_rank,
            node=self.env.node,
            host=self._host,
            pid=os.getpid(),
            dropped=link.dropped if link else 0,
        )
        return [("heartbeat", beat)]

    @property
    def launched(self) -> bool:
        return self.env.launched

    @property
    def dropped(self) -> int:
        """Messages lost so far (queue full, or gpud down); metrics.jsonl still has them."""
        return self._link.dropped if self._link else 0

    # ------------------------------------------------------------------ hot path

    def log(self, step: int, **metrics: float) -> None:
        """Mark `step` (its 0-based index) done; rank 0 also records `metrics`. Never blocks.

        The hot path of the library, kept to about a microsecond: one clock read, the
        pulse update, and (rank 0) one append to the link's bounded deque.
        """
        link = self._link
        if link is None:
            return
        now = time.time()
        self._pulse.step_done(step, now)
        if self.rank == 0:
            queue = link.queue
            if len(queue) == QUEUE_CAPACITY:
                link.dropped_queue += 1
            queue.append(
                (
                    "metrics",
                    {
                        "run": self._run_id,
                        "attempt": self._attempt,
                        "step": step,
                        "time": now,
                        "values": metrics,
                    },
                )
            )
        if self._hooks is not None:
            self._hooks.after_step(step)

    def should_stop(self) -> bool:
        """True once gpud asked this run to stop (or SIGTERM arrived), on every rank alike.

        In a distributed run the ranks agree (a one-integer all-reduce on a gloo group,
        started here and read at the next call, so it overlaps the step) and all stop
        after the same step, one step after the request; call it once per step at the same
        point of the loop on every rank. When `probe_collectives()` was asked for, the
        probe runs here too.
        """
        if self._agreed:
            return True
        local = self._stop.is_set()
        if self.world_size <= 1 or not self.launched:
            return local
        from trainers import collectives

        if not collectives.ready():
            return local
        step = self._pulse.step
        if (
            self._probe_every is not None
            and step is not None
            and step % self._probe_every == 0
            and step != self._probed_step
        ):
            self._probed_step = step
            self._run_probe(step)
        if self._agreement is None:
            self._agreement = collectives.Agreement()
        self._pulse.enter_collective(time.time())
        try:
            agreed = bool(self._agreement.any(local))
        finally:
            self._pulse.leave_collective(time.time())
        if agreed:
            self._agreed = True
            if not local:
                self._request_stop("another rank was asked to stop")
        return agreed

    # ------------------------------------------------------------------ collectives

    def probe_collectives(self, every_n_steps: int = 100, size_bytes: int | None = None) -> None:
        """Time an all-reduce every N steps (inside `should_stop()`); rank 0 reports it."""
        if every_n_steps < 1:
            raise ValueError("every_n_steps must be at least 1")
        self._probe_every = every_n_steps
        self._probe_bytes = size_bytes

    def _run_probe(self, step: int) -> None:
        from trainers import collectives

        self._pulse.enter_collective(time.time())
        try:
            result = collectives.probe(self._probe_bytes)
        finally:
            self._pulse.leave_collective(time.time())
        self.last_probe = result
        if self.rank == 0:
            self._send(
                "probe",
                {
                    "step": step,
                    "backend": result.backend,
                    "world_size": result.world_size,
                    "size_bytes": result.size_bytes,
                    "seconds": result.seconds,
                    "algbw_gbps": result.algbw_gbps,
                    "busbw_gbps": result.busbw_gbps,
                },
            )

    def count_flops(self) -> contextlib.AbstractContextManager[Any]:
        """Wrap each optimizer step (forward and backward of all its micro-batches):

            with run.count_flops():
                loss = model(x).loss
                loss.backward()

        The first step's FLOPs are counted once (torch.utils.flop_counter) and every
        heartbeat carries them; gpud turns them into achieved FLOP/s and MFU. Later steps
        get a no-op context, and so does every step outside gpud.
        """
        if self._flops is None:
            return contextlib.nullcontext()
        return self._flops.step()

    @property
    def flops_per_step(self) -> float | None:
        """This rank's FLOPs per step, once `count_flops()` counted them."""
        return self._pulse.flops_per_step

    def _counted(self, flops: float) -> None:
        self._pulse.flops_per_step = flops

    def watch(self, model: Any) -> Any:
        """Mark a DDP model's gradient all-reduces as collectives in the heartbeats (from
        launch to completion); returns the model."""
        if self.launched and hasattr(model, "register_comm_hook"):
            from trainers import collectives

            collectives.watch_ddp(model, self._pulse.enter_collective, self._pulse.leave_collective)
        return model

    # ------------------------------------------------------------------ reports

    def checkpoint_saved(
        self, path: str | os.PathLike[str], step: int, seconds: float | None = None
    ) -> None:
        """Tell gpud a checkpoint exists (rank 0); resume uses the latest one reported.
        `seconds`: what the save took (gpud counts it as checkpointing, not training)."""
        if self.rank == 0:
            body: dict[str, object] = {"path": str(path), "step": step}
            if seconds is not None:
                body["seconds"] = round(max(seconds, 0.0), 6)
            self._send("checkpoint", body)

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
        self.ended(exit_code)
        try:
            import torch.distributed as dist

            if self._agreement is not None:
                self._agreement.settle()
            if dist.is_available() and dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        except Exception as exc:  # ending must not turn into a crash
            print(f"[gpud] process group teardown: {exc}", file=sys.stderr)
        self.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)

    def ended(self, exit_code: int = 0) -> None:
        """Training is over on this rank (ran to its end, or stopped): where it ended, and
        (not stopped) that it finished. `finish()` says this itself; a framework that owns
        the process's exit (the `trainers.callbacks`) says it at its train end, once."""
        if self._ended:
            return
        self._ended = True
        if self._link is not None:
            # Heartbeats go out twice a second, so the last steps may not have been in one:
            # send where this rank ended now, or health would stay a step or two behind.
            for kind, body in self._tick(force=True):
                self._link.put(kind, body)
        if self.stop_reason is None:
            # Training ran to its end (not stopped): gpud uses this to tell a teardown abort
            # after a complete run from a real failure.
            self._send("finished", {"exit_code": exit_code})

    def close(self) -> None:
        """Send what is queued and stop the link (once; later messages are not sent)."""
        link, self._link = self._link, None
        if link is not None:
            link.close()


def _hints_config(hints: Hints) -> dict[str, Any]:
    return {k: v for k, v in vars(hints).items() if v is not None}


_current: Run | None = None


def init() -> Run:
    """The Run of this process (created on first call; later calls return the same)."""
    global _current  # noqa: PLW0603 - one Run per process, by design
    if _current is None:
        _current = Run(RunEnv.from_environ())
    return _current
