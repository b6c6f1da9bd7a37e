"""One snapshot of a whole node: the chosen GPU sampler plus the host sampler."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpud.hardware.base import GpuSampler, NoGpuSampler
from gpud.hardware.host import HostSampler
from gpud.hardware.simulated import LoadSource, SimulatedSampler
from gpud.model.snapshot import GpuSample, NodeSnapshot

log = logging.getLogger("gpud.hardware")


def open_gpu_sampler(
    simulate_gpus: int | None,
    node: str,
    clock: Callable[[], float] = time.time,
    loads: LoadSource | None = None,
    xid_file: Path | None = None,
) -> GpuSampler:
    """Simulated GPUs when asked for; else NVML; else (no driver, no GPUs) none at all."""
    if simulate_gpus:
        return SimulatedSampler(simulate_gpus, node, clock=clock, loads=loads, xid_file=xid_file)
    from gpud.hardware.nvml import NvmlSampler, NvmlUnavailable

    try:
        return NvmlSampler.open(clock=clock)
    except NvmlUnavailable as exc:
        log.warning("no GPUs: %s; serving host metrics only (--simulate-gpus N for a demo)", exc)
        return NoGpuSampler()


class NodeSampler:
    """Combines GPU and host samples into numbered `NodeSnapshot`s."""

    def __init__(
        self,
        node: str,
        gpus: GpuSampler,
        host: HostSampler,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        annotate: Callable[[list[GpuSample]], list[GpuSample]] | None = None,
    ) -> None:
        """`annotate`: what adds to the GPUs' samples what the GPU sampler cannot know
        (on Kubernetes, their pods: gpud.kube.pods), in this thread."""
        self.node = node
        self._annotate = annotate
        self.gpus = gpus
        self._host = host
        self._interval_s = interval_s
        self._clock = clock
        self._info = gpus.system_info()
        self._seq = 0

    def sample(self) -> NodeSnapshot:
        started = time.perf_counter()
        now = self._clock()
        gpu_samples = self.gpus.sample()
        if self._annotate is not None:
            gpu_samples = self._annotate(gpu_samples)
        host = self._host.sample()
        self._seq += 1
        return NodeSnapshot(
            node=self.node,
            seq=self._seq,
            time=now,
            interval_s=self._interval_s,
            backend=self.gpus.backend,
            simulated=self.gpus.simulated,
            driver_version=self._info.driver_version,
            cuda_driver_version=self._info.cuda_driver_version,
            nvml_version=self._info.nvml_version,
            sample_ms=round((time.perf_counter() - started) * 1000, 2),
            gpus=gpu_samples,
            host=host,
        )
