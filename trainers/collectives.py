"""The collectives the library itself runs (imports torch; only called from Run).

- `Agreement`: every rank learns whether any rank was asked to stop (a one-integer MAX
  all-reduce on a CPU-side gloo group, asynchronous and read one step later: no CUDA
  sync, no stall, no interference with the trainer's own collectives);
- `probe`: a timed all-reduce of a fixed size on the trainer's own backend, giving the
  algorithm and bus bandwidth (busbw = algbw · 2(n−1)/n, as nccl-tests defines it);
- `watch_ddp`: a DDP comm hook that marks each gradient all-reduce as a collective from
  its launch to its completion, so a heartbeat says how long each step waited on the
  others, and that a rank blocked in one is waiting, not computing.
"""

# No `from __future__ import annotations` here: DDP inspects a comm hook's annotations and
# rejects string ones, so they must stay real objects.
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

PROBE_WARMUP = 1
PROBE_ITERS = 2


def ready() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Agreement:
    """Whether any rank raised its flag, learnt one call later.

    Each call starts an asynchronous one-integer MAX all-reduce and reads the previous
    call's result, so the collective runs behind a whole training step instead of
    stalling it. Every rank reads the same result at the same call, so they still stop
    together, one step after the request.
    """

    def __init__(self) -> None:
        self._group: Any = None
        self._pending: tuple[Any, torch.Tensor, float] | None = None

    def any(self, flag: bool) -> bool:
        if self.settle():
            return True
        if self._group is None:
            same = dist.get_backend() == "gloo"
            self._group = dist.group.WORLD if same else dist.new_group(backend="gloo")
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, tensor, time.time())
        return False

    def waiting_since(self) -> float | None:
        """When the all-reduce still in flight was posted: this rank waits on the others.

        Any thread may ask (the heartbeat does); a rank that stopped posting (hung in its
        step) has none in flight, which is how health tells it from the ranks it holds up.
        """
        pending = self._pending
        if pending is None or pending[0].is_completed():
            return None
        return pending[2]

    def settle(self) -> bool:
        """Wait for the all-reduce in flight, if any; True if a rank had raised its flag."""
        if self._pending is None:
            return False
        work, tensor, _ = self._pending
        self._pending = None
        work.wait()
        return bool(tensor.item())


@dataclass(frozen=True)
class ProbeResult:
    backend: str
    world_size: int
    size_bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


def default_probe_bytes(backend: str) -> int:
    # Big enough to measure bandwidth rather than latency, small enough to stay a rounding
    # error of training time (gloo on CPU is some 100× slower than NCCL on NVLink).
    return 4 * 2**20 if backend == "gloo" else 64 * 2**20


def probe(size_bytes: int | None = None) -> ProbeResult:
    """Collective; call on every rank at the same point."""
    backend = str(dist.get_backend())
    size = size_bytes or default_probe_bytes(backend)
    world = dist.get_world_size()
    on_gpu = backend == "nccl" and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.ones(size // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    for _ in range(PROBE_WARMUP):
        dist.all_reduce(tensor)
    sync()
    start = time.perf_counter()
    for _ in range(PROBE_ITERS):
        dist.all_reduce(tensor)
    sync()
    seconds = (time.perf_counter() - start) / PROBE_ITERS
    algbw = size / seconds / 1e9
    return ProbeResult(
        backend=backend,
        world_size=world,
        size_bytes=size,
        seconds=seconds,
        algbw_gbps=algbw,
        busbw_gbps=algbw * 2 * (world - 1) / world,
    )


class DeviceCompletions:
    """Calls `leave(now)` when work queued on a CUDA stream has finished, from one thread.

    NCCL's futures complete when the all-reduce is *enqueued*, not when it is done, so
    their `then()` callbacks run at once on the host: timed there, every NCCL all-reduce
    would read ~0 s and a rank whose GPU waits on a stuck peer would say it computes. The
    callback records a CUDA event instead, and this thread waits for each in turn
    (`Event.synchronize` releases the GIL; one stream's events finish in order).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Any, Callable[[float], None]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def after(self, device: torch.device, leave: Callable[[float], None]) -> None:
        """`leave(now)` once what is queued on `device`'s current stream has run."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(device))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._wait, name="gpud-collectives", daemon=True
                )
                self._thread.start()
        self._queue.put((event, leave))

    def _wait(self) -> None:
        while True:
            event, leave = self._queue.get()
            try:
                event.synchronize()
            finally:
                leave(time.time())


_DEVICE = DeviceCompletions()


def watch_ddp(model: Any, enter: Callable[[float], None], leave: Callable[[float], None]) -> None:
    """Mark DDP's gradient all-reduces (the default averaging, unchanged otherwise) as
    collectives: `enter(now)` when one is launched, `leave(now)` when it completes.

    Entry matters as much as completion: a rank blocked in an all-reduce that never
    completes (another rank is stuck) must say it waits from the moment it launched it.
    On a GPU, completion is when the all-reduce has run on the device (DeviceCompletions).
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def timed(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
        enter(time.time())
        try:
            future = allreduce_hook(state, bucket)
        except BaseException:
            leave(time.time())
            raise

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            try:
                tensor = fut.value()
            except BaseException:
                leave(time.time())  # a failed all-reduce is over too
                raise
            if tensor.is_cuda:
                _DEVICE.after(tensor.device, leave)
            else:
                leave(time.time())
            return tensor

        return future.then(done)

    model.register_comm_hook(None, timed)
