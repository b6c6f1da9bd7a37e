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
from gpud.model.snapshot import HostSample

IB_SYSFS = Path("/sys/class/infiniband")
MEMINFO = Path("/proc/meminfo")
#: What the sample needs of /proc/meminfo, in bytes (the file says kB).
MEMINFO_FIELDS = (b"MemTotal:", b"MemAvailable:", b"SwapTotal:", b"SwapFree:")


def read_meminfo(path: Path = MEMINFO) -> dict[bytes, int] | None:
    """Memory and swap in one read of /proc/meminfo (psutil reads it, and all of
    /proc/vmstat, for the two); None where a field is missing (not Linux, a kernel before
    3.14 without MemAvailable)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    found: dict[bytes, int] = {}
    for line in lines:
        name, _, rest = line.partition(b" ")
        if name in MEMINFO_FIELDS:
            found[name] = int(rest.split()[0]) * 1024
    return found if len(found) == len(MEMINFO_FIELDS) else None


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
        meminfo = read_meminfo()
        if meminfo is not None:
            mem_total, mem_available = meminfo[b"MemTotal:"], meminfo[b"MemAvailable:"]
            swap_total = meminfo[b"SwapTotal:"]
            swap_used = swap_total - meminfo[b"SwapFree:"]
        else:
            mem, swap = psutil.virtual_memory(), psutil.swap_memory()
            mem_total, mem_available = mem.total, mem.available
            swap_total, swap_used = swap.total, swap.used
        # nowrap=False: a counter that wrapped has no rate this once (RateTracker), which
        # spares psutil's bookkeeping of every counter at every sample.
        disk = psutil.disk_io_counters(nowrap=False)
        nics = psutil.net_io_counters(pernic=True, nowrap=False)
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
            memory_total_bytes=mem_total,
            memory_used_bytes=mem_total - mem_available,
            memory_available_bytes=mem_available,
            swap_total_bytes=swap_total,
            swap_used_bytes=swap_used,
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
