"""Simulated GPUs for machines without them: tests, CI and demos.

Values are deterministic functions of (node, GPU index, time), plausible for an idle
H100 box, and move towards a busy profile for GPUs that have processes attached (the
supervisor attaches a run's ranks). Every sample is flagged `simulated`, so nobody takes
it for real hardware.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpud.hardware.base import GpuSystemInfo
from gpud.hardware.xid import XidTracker
from gpud.model.snapshot import Backend, GpuProcess, GpuSample, NvLinkSample

MIB = 1024 * 1024


#: What the driver of an H100 80GB HBM3 reserves (NVML v2), seen on one: 2026-11-24.
RESERVED_BYTES = 480 * MIB


@dataclass(frozen=True)
class SimulatedModel:
    """The static facts of the simulated GPU model."""

    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 81559 * MIB
    compute_capability: tuple[int, int] = (9, 0)
    power_limit_w: float = 700.0
    idle_power_w: float = 72.0
    clock_sm_max_mhz: int = 1980
    clock_mem_max_mhz: int = 2619
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    nvlinks: int = 18
    nvlink_version: int = 4


#: A process on a simulated GPU: pid, memory it "holds", and how busy it keeps the GPU.
@dataclass(frozen=True)
class SimulatedLoad:
    pid: int
    name: str | None
    used_memory_bytes: int
    busy_pct: float


LoadSource = Callable[[], Mapping[int, Sequence[SimulatedLoad]]]


def _reasons(load: float, busy: bool) -> list[str]:
    if not busy:
        return ["gpu_idle"]
    return ["sw_power_cap"] if load > 0.97 else []


def _wave(t: float, period_s: float, phase: float) -> float:
    """A smooth 0..1 wave; deterministic for a given time."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * t / period_s + phase)


class SimulatedSampler:
    """`count` simulated GPUs. `loads` maps GPU index → processes attached to it."""

    backend: Backend = "simulated"
    simulated = True

    def __init__(
        self,
        count: int,
        node: str,
        clock: Callable[[], float] = time.time,
        model: SimulatedModel | None = None,
        loads: LoadSource | None = None,
        xid_file: Path | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("--simulate-gpus needs at least 1 GPU")
        self._count = count
        self._clock = clock
        self._model = model or SimulatedModel()
        self._loads = loads
        # Node-specific identity, so two simulated daemons never share GPU uuids.
        self._node_tag = zlib.crc32(node.encode()) & 0xFFFFFFFF
        self.xids = XidTracker(count, clock)
        self._xid_file = xid_file
        # Energy counters: the simulated driver loads with the sampler, so they start at 0
        # and grow by each sample's power over the time since the last one.
        self._energy_mj = [0.0] * count
        self._energy_at: float | None = None
        # Each GPU's links at the last rate: samples are frozen, so a GPU whose rate did not
        # move (every idle one) reuses them instead of building 18 models a sample.
        self._links: dict[int, tuple[float, list[NvLinkSample]]] = {}

    def system_info(self) -> GpuSystemInfo:
        return GpuSystemInfo(
            driver_version="simulated", cuda_driver_version=None, nvml_version=None
        )

    def gpu_count(self) -> int:
        return self._count

    def acknowledge_xids(self, gpu_index: int | None) -> int:
        return self.xids.acknowledge(gpu_index)

    def close(self) -> None:
        return None

    def _inject_xids(self) -> None:
        """The test hook: GPU:CODE lines in the file become XIDs, once (it is emptied)."""
        path = self._xid_file
        if path is None:
            return
        try:
            text = path.read_text()
            if not text:
                return
            path.write_text("")
        except OSError:
            return
        for line in text.split():
            gpu, _, code = line.partition(":")
            if gpu.isdigit() and code.isdigit() and int(gpu) < self._count:
                self.xids.record(int(gpu), int(code))

    def sample(self) -> list[GpuSample]:
        self._inject_xids()
        now = self._clock()
        loads = self._loads() if self._loads else {}
        elapsed = 0.0 if self._energy_at is None else max(0.0, now - self._energy_at)
        self._energy_at = now
        return [self._sample_one(i, now, loads.get(i, ()), elapsed) for i in range(self._count)]

    def _nvlinks(self, i: int, rate: float) -> list[NvLinkSample]:
        cached = self._links.get(i)
        if cached is not None and cached[0] == rate:
            return cached[1]
        m = self._model
        links = [
            NvLinkSample(
                link=link,
                active=True,
                version=m.nvlink_version,
                tx_bytes_per_s=rate,
                rx_bytes_per_s=rate,
                crc_errors=0,
                replay_errors=0,
                recovery_errors=0,
            )
            for link in range(m.nvlinks)
        ]
        self._links[i] = (rate, links)
        return links

    def _sample_one(
        self, i: int, t: float, procs: Sequence[SimulatedLoad], elapsed_s: float
    ) -> GpuSample:
        m = self._model
        phase = i * 0.7
        busy = min(100.0, sum(p.busy_pct for p in procs))
        idle_util = 3.0 * _wave(t, 17.0, phase)
        util = busy * (0.93 + 0.07 * _wave(t, 5.0, phase)) if procs else idle_util
        held = sum(p.used_memory_bytes for p in procs)
        memory_used = min(m.memory_total_bytes, 512 * MIB + held)
        load = util / 100.0
        power = m.idle_power_w + load * (m.power_limit_w * 0.9 - m.idle_power_w)
        power += 4.0 * _wave(t, 11.0, phase)
        temperature = 31.0 + 42.0 * load + 2.0 * _wave(t, 29.0, phase)
        self._energy_mj[i] += power * elapsed_s * 1000
        sm_clock = int(345 + load * (m.clock_sm_max_mhz - 345))
        pcie_rate = 2.0e8 * load + 1.0e6 * _wave(t, 7.0, phase)
        nvlink_rate = 2.5e9 * load if procs else 0.0  # no process, no peer traffic
        return GpuSample(
            index=i,
            simulated=True,
            name=m.name,
            uuid=f"GPU-sim{self._node_tag:08x}-0000-4000-8000-{i:012x}",
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            serial=f"SIM{self._node_tag:08X}{i:02d}",
            compute_capability=m.compute_capability,
            utilization_gpu_pct=round(util, 1),
            utilization_memory_pct=round(util * 0.45, 1),
            sm_activity_pct=round(util * 0.82, 1),
            sm_occupancy_pct=round(util * 0.41, 1),
            tensor_activity_pct=round(util * 0.55, 1),
            graphics_activity_pct=round(util * 0.97, 1),
            dram_activity_pct=round(util * 0.38, 1),
            encoder_utilization_pct=0.0,  # training does not encode or decode video
            decoder_utilization_pct=0.0,
            memory_used_bytes=memory_used,
            memory_total_bytes=m.memory_total_bytes,
            memory_reserved_bytes=RESERVED_BYTES,
            temperature_c=round(temperature, 1),
            memory_temperature_c=round(temperature + 4.0 + 6.0 * load, 1),  # HBM runs warmer
            power_w=round(power, 1),
            energy_mj=int(self._energy_mj[i]),
            power_limit_w=m.power_limit_w,
            fan_pct=None,  # SXM boards have no fan of their own: not available, like NVML
            clock_sm_mhz=sm_clock,
            clock_sm_max_mhz=m.clock_sm_max_mhz,
            clock_mem_mhz=m.clock_mem_max_mhz,
            clock_mem_max_mhz=m.clock_mem_max_mhz,
            clock_event_reasons=_reasons(load, busy=bool(procs)),
            persistence_mode=True,
            mig_mode=False,
            ecc_mode=True,
            ecc_corrected_volatile=0,
            ecc_uncorrected_volatile=0,
            ecc_corrected_aggregate=0,
            ecc_uncorrected_aggregate=0,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=False,
            remapped_rows_failed=False,
            pcie_link_gen=m.pcie_gen_max if procs else 1,  # links train down when idle
            pcie_link_gen_max=m.pcie_gen_max,
            pcie_link_width=m.pcie_width_max,
            pcie_link_width_max=m.pcie_width_max,
            pcie_replay_count=0,
            pcie_tx_bytes_per_s=round(pcie_rate, 1),
            pcie_rx_bytes_per_s=round(pcie_rate * 1.1, 1),
            nvlinks=self._nvlinks(i, nvlink_rate),
            xid=self.xids.summary(i),
            processes=[
                GpuProcess(pid=p.pid, name=p.name, used_memory_bytes=p.used_memory_bytes)
                for p in procs
            ],
        )
