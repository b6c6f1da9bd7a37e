"""Runs as load on simulated GPUs, so a demo's GPU view moves with its training.

Each rank of a running part (a process with LOCAL_RANK in its environment) is put on the
simulated GPU it was given: entry LOCAL_RANK of its CUDA_VISIBLE_DEVICES (the part's
lease), else the GPU of its local rank; its CPU use stands in for GPU utilization and its
RSS for GPU memory. `foreign` puts processes outside gpud on chosen GPUs (`gpud serve
--simulate-foreign GPU:PID`) with FOREIGN_MEMORY_BYTES each, so a shared box's notebook or
hand-started job can be tested without a GPU. Only used with --simulate-gpus; real GPUs
are read from NVML.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import psutil

from gpud.hardware.simulated import SimulatedLoad
from gpud.runs.process import procs

RSS_AS_GPU_MEMORY = 4  # a CPU rank's RSS is small next to a GPU's; scale it to look the part
#: What a simulated foreign process holds: well over what makes a GPU busy.
FOREIGN_MEMORY_BYTES = 2 * 2**30
#: How often the shims' process trees are walked again to find their ranks (at once when
#: the set of shims changes). Walking a tree reads every process's /proc/PID/stat on the
#: host: once per snapshot it was most of a test daemon's CPU beside a run.
RESCAN_S = 2.0


class SimulatedLoads:
    """Called from the sampler thread once per snapshot."""

    def __init__(
        self,
        shims: Callable[[], Iterable[int | None]],
        gpu_count: int,
        foreign: Mapping[int, list[int]] | None = None,
    ) -> None:
        self._shims = shims
        self._gpu_count = gpu_count
        self._foreign = dict(foreign or {})
        self._ranks: dict[int, tuple[psutil.Process, int, str]] = {}
        self._shim_set: frozenset[int] = frozenset()
        self._scanned_at = float("-inf")
        self._measured: set[psutil.Process] = set()  # ranks whose CPU use has a baseline

    def _foreign_loads(self) -> dict[int, list[SimulatedLoad]]:
        loads: dict[int, list[SimulatedLoad]] = {}
        for gpu, pids in self._foreign.items():
            for pid in pids:
                try:
                    name = psutil.Process(pid).name()
                except psutil.Error:
                    continue  # it ended: the GPU is free again
                loads.setdefault(gpu, []).append(
                    SimulatedLoad(pid=pid, name=name, used_memory_bytes=FOREIGN_MEMORY_BYTES,
                                  busy_pct=50.0)
                )  # fmt: skip
        return loads

    def __call__(self) -> dict[int, list[SimulatedLoad]]:
        loads = self._foreign_loads()
        shims = frozenset(pid for pid in self._shims() if pid is not None)
        now = time.monotonic()
        if shims != self._shim_set or now - self._scanned_at >= RESCAN_S:
            self._ranks = self._find_ranks(shims)
            self._shim_set, self._scanned_at = shims, now
            self._measured &= {proc for proc, _gpu, _name in self._ranks.values()}
        for pid, (proc, gpu, name) in list(self._ranks.items()):
            try:
                # The same Process each time: cpu_percent() measures since its last call;
                # at the first, which has no last, its use over its life so far.
                since = proc.cpu_percent(interval=None)
                if proc not in self._measured:  # a Process is its pid and start time
                    self._measured.add(proc)
                    since = _lifetime_pct(proc)
                busy = min(100.0, since)
                memory = proc.memory_info().rss * RSS_AS_GPU_MEMORY
            except psutil.Error:
                del self._ranks[pid]  # it ended
                self._measured.discard(proc)
                continue
            loads.setdefault(gpu, []).append(
                SimulatedLoad(pid=pid, name=name, used_memory_bytes=memory, busy_pct=busy)
            )
        return loads

    def _find_ranks(self, shims: Iterable[int]) -> dict[int, tuple[psutil.Process, int, str]]:
        """Each rank under the shims (a process with LOCAL_RANK in its environment), with
        its GPU and name; a rank already known keeps its Process (and CPU baseline)."""
        found: dict[int, tuple[psutil.Process, int, str]] = {}
        for shim in shims:
            for proc in procs.tree(shim):
                known = self._ranks.get(proc.pid)
                if known is not None and known[0] == proc:  # same pid and start time
                    found[proc.pid] = known
                    continue
                try:
                    env = proc.environ()
                    name = proc.name()
                except psutil.Error:
                    continue
                local = env.get("LOCAL_RANK")
                if local is None or not local.isdigit():
                    continue
                gpu = _gpu_of(int(local), env.get("CUDA_VISIBLE_DEVICES"), self._gpu_count)
                found[proc.pid] = (proc, gpu, name)
        return found


def _lifetime_pct(proc: psutil.Process) -> float:
    """A process's CPU use since it started, in percent of a core."""
    times = proc.cpu_times()
    alive = max(time.time() - proc.create_time(), 1e-3)
    return 100.0 * (times.user + times.system) / alive


def _gpu_of(local_rank: int, visible: str | None, gpu_count: int) -> int:
    """The simulated GPU a rank runs on: its entry of CUDA_VISIBLE_DEVICES, as CUDA picks
    device LOCAL_RANK among the visible ones."""
    devices = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if devices:
        chosen = devices[local_rank % len(devices)]
        if chosen.isdigit() and int(chosen) < gpu_count:
            return int(chosen)
    return local_rank % gpu_count
