"""Runs as load on simulated GPUs, so a demo's GPU view moves with its training.

Each rank of a running part (a process with LOCAL_RANK in its environment) is put on the
simulated GPU of its local rank; its CPU use stands in for GPU utilization and its RSS
for GPU memory. Only used with --simulate-gpus; real GPUs are read from NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import psutil

from gpud.hardware.simulated import SimulatedLoad
from gpud.runs import procs

RSS_AS_GPU_MEMORY = 4  # a CPU rank's RSS is small next to a GPU's; scale it to look the part


class SimulatedLoads:
    """Called from the sampler thread once per snapshot."""

    def __init__(self, shims: Callable[[], Iterable[int | None]], gpu_count: int) -> None:
        self._shims = shims
        self._gpu_count = gpu_count
        self._procs: dict[int, psutil.Process] = {}

    def __call__(self) -> dict[int, list[SimulatedLoad]]:
        loads: dict[int, list[SimulatedLoad]] = {}
        alive: dict[int, psutil.Process] = {}
        for shim in list(self._shims()):
            for proc in procs.tree(shim):
                try:
                    local = proc.environ().get("LOCAL_RANK")
                    if local is None or not local.isdigit():
                        continue
                    # Reuse the Process object: cpu_percent() measures since its last call.
                    tracked = self._procs.get(proc.pid, proc)
                    busy = min(100.0, tracked.cpu_percent(interval=None))
                    memory = tracked.memory_info().rss * RSS_AS_GPU_MEMORY
                    name = tracked.name()
                except psutil.Error:
                    continue
                alive[proc.pid] = tracked
                gpu = int(local) % self._gpu_count
                loads.setdefault(gpu, []).append(
                    SimulatedLoad(pid=proc.pid, name=name, used_memory_bytes=memory, busy_pct=busy)
                )
        self._procs = alive
        return loads
