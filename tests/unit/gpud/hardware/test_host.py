"""Host sampling: real psutil readings, and InfiniBand counters from a sysfs tree."""

from __future__ import annotations

from pathlib import Path

import psutil

from gpud.hardware.host import HostSampler, read_meminfo
from gpud.hardware.infiniband import InfinibandReader


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_host_sample_reads_this_machine(tmp_path: Path) -> None:
    clock = Clock()
    sampler = HostSampler(clock=clock, ib_root=tmp_path / "none")
    first = sampler.sample()
    assert first.cpu_count_logical >= 1
    assert len(first.cpu_per_core_pct) == first.cpu_count_logical
    assert 0 < first.memory_used_bytes < first.memory_total_bytes
    assert first.net_rx_bytes_per_s is None  # a rate needs two samples: not available, not 0
    assert first.infiniband == []
    clock.now += 1.0
    second = sampler.sample()
    assert second.net_rx_bytes_per_s is not None and second.net_rx_bytes_per_s >= 0
    assert second.load_1m is not None


def test_memory_and_swap_come_from_one_read_of_meminfo_and_agree_with_psutil() -> None:
    mine = read_meminfo()
    assert mine is not None  # Linux
    mem, swap = psutil.virtual_memory(), psutil.swap_memory()
    assert mine[b"MemTotal:"] == mem.total and mine[b"SwapTotal:"] == swap.total
    assert abs(mine[b"MemAvailable:"] - mem.available) < 256 * 2**20  # read apart in time
    assert abs((mine[b"SwapTotal:"] - mine[b"SwapFree:"]) - swap.used) < 256 * 2**20


def test_a_meminfo_without_memavailable_is_none_so_psutil_answers(tmp_path: Path) -> None:
    old = tmp_path / "meminfo"  # a kernel before 3.14
    old.write_text("MemTotal:  1000 kB\nMemFree:  500 kB\nSwapTotal:  0 kB\nSwapFree:  0 kB\n")
    assert read_meminfo(old) is None
    assert read_meminfo(tmp_path / "missing") is None
    new = tmp_path / "new"
    new.write_text(old.read_text() + "MemAvailable:     700 kB\n")
    assert read_meminfo(new) == {
        b"MemTotal:": 1_024_000, b"MemAvailable:": 716_800, b"SwapTotal:": 0, b"SwapFree:": 0
    }  # fmt: skip


def _port(root: Path, dev: str, port: int, rx_words: int, tx_words: int, **errors: int) -> None:
    d = root / dev / "ports" / str(port)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "state").write_text("4: ACTIVE\n")
    (d / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (d / "link_layer").write_text("InfiniBand\n")
    (d / "counters" / "port_rcv_data").write_text(f"{rx_words}\n")
    (d / "counters" / "port_xmit_data").write_text(f"{tx_words}\n")
    for name, value in errors.items():
        (d / "counters" / name).write_text(f"{value}\n")


def test_infiniband_counters_become_byte_rates(tmp_path: Path) -> None:
    clock = Clock()
    _port(tmp_path, "mlx5_0", 1, rx_words=1000, tx_words=500, symbol_error=2, link_downed=1)
    reader = InfinibandReader(tmp_path, clock)
    (port,) = reader.read()
    assert (port.device, port.port, port.state, port.rate_gbps) == ("mlx5_0", 1, "ACTIVE", 200.0)
    assert port.link_layer == "InfiniBand"
    assert port.rx_bytes_per_s is None
    assert (port.symbol_errors, port.link_downed) == (2, 1)
    assert port.rx_errors is None  # counter file absent: not available
    clock.now += 2.0
    _port(tmp_path, "mlx5_0", 1, rx_words=1000 + 500, tx_words=500 + 50)
    (port,) = reader.read()
    assert port.rx_bytes_per_s == 500 * 4 / 2.0  # data counters count 4-byte words
    assert port.tx_bytes_per_s == 50 * 4 / 2.0


def test_counter_reset_gives_no_rate(tmp_path: Path) -> None:
    clock = Clock()
    _port(tmp_path, "mlx5_1", 1, rx_words=9000, tx_words=9000)
    reader = InfinibandReader(tmp_path, clock)
    reader.read()
    clock.now += 1.0
    _port(tmp_path, "mlx5_1", 1, rx_words=10, tx_words=10)
    (port,) = reader.read()
    assert port.rx_bytes_per_s is None and port.tx_bytes_per_s is None


def test_host_sampler_includes_infiniband_ports(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, rx_words=1, tx_words=1)
    _port(tmp_path, "mlx5_1", 1, rx_words=1, tx_words=1)
    sample = HostSampler(clock=Clock(), ib_root=tmp_path).sample()
    assert [(p.device, p.port) for p in sample.infiniband] == [("mlx5_0", 1), ("mlx5_1", 1)]
