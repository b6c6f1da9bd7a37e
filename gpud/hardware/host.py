"""The host side of a node: CPU, memory, disk and network from psutil, IB from sysfs."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from gpud.hardware.infiniband import InfinibandReader
from gpud.hardware.rates import RateTracker
from gpud.snapshot import HostSample

IB_SYSFS = Path("/sys/class/infiniband")


class HostSampler:
    """Samples the host. Rates are per second since the previous sample (None at first)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        ib_root: Path = IB_SYSFS,
        hostname: str | None = None,
    ) -> None:
        self._clock = clock
        self._hostname = hostname or socket.gethostname()
        self._rates = RateTracker(clock)
        self._ib = InfinibandReader(ib_root, clock)
        self._cpu_logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self._cpu_physical = psutil.cpu_count(logical=False)
        # psutil's cpu_percent(interval=None) measures since its previous call: prime it so
        # the first sample already covers the time since start-up.
        psutil.cpu_percent(percpu=True, interval=None)

    def sample(self) -> HostSample:
        now = self._clock()
        per_core = psutil.cpu_percent(percpu=True, interval=None)
        try:
            load: tuple[float, ...] | tuple[None, ...] = os.getloadavg()
        except OSError:
            load = (None, None, None)
        mem = psutil.virtual_memory()
        swap = psutil.swap_memory()
        disk = psutil.disk_io_counters()
        nics = psutil.net_io_counters(pernic=True)
        rx = sum(c.bytes_recv for name, c in nics.items() if name != "lo")
        tx = sum(c.bytes_sent for name, c in nics.items() if name != "lo")
        return HostSample(
            hostname=self._hostname,
            cpu_count_logical=self._cpu_logical,
            cpu_count_physical=self._cpu_physical,
            cpu_percent=round(sum(per_core) / len(per_core), 1) if per_core else None,
            cpu_per_core_pct=per_core,
            load_1m=load[0],
            load_5m=load[1],
            load_15m=load[2],
            memory_total_bytes=mem.total,
            memory_used_bytes=mem.total - mem.available,
            memory_available_bytes=mem.available,
            swap_total_bytes=swap.total,
            swap_used_bytes=swap.used,
            disk_read_bytes_per_s=self._rates.rate(
                "disk_read", disk.read_bytes if disk else None, now
            ),
            disk_write_bytes_per_s=self._rates.rate(
                "disk_write", disk.write_bytes if disk else None, now
            ),
            net_rx_bytes_per_s=self._rates.rate("net_rx", rx, now),
            net_tx_bytes_per_s=self._rates.rate("net_tx", tx, now),
            infiniband=self._ib.read(),
        )
