"""InfiniBand / RoCE port counters from sysfs (`/sys/class/infiniband`).

The data counters count 4-byte words (per the IB spec), so they are multiplied by 4.
Rates come from deltas between two reads; the first read has none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpud.hardware.rates import RateTracker
from gpud.model.snapshot import IbPortSample

_ERROR_COUNTERS = {
    "symbol_errors": "symbol_error",
    "link_downed": "link_downed",
    "rx_errors": "port_rcv_errors",
    "link_error_recovery": "link_error_recovery",
}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _parse_state(text: str | None) -> str | None:
    # sysfs says "4: ACTIVE"; keep the name.
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def _parse_rate_gbps(text: str | None) -> float | None:
    # sysfs says "200 Gb/sec (4X HDR)".
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


class InfinibandReader:
    """Reads every port under `root` each call; keeps the last counters for rates."""

    def __init__(self, root: Path, clock: Callable[[], float]) -> None:
        self._root = root
        self._clock = clock
        self._rates = RateTracker(clock)

    def read(self) -> list[IbPortSample]:
        if not self._root.is_dir():
            return []
        now = self._clock()
        ports: list[IbPortSample] = []
        for dev in sorted(self._root.iterdir()):
            ports_dir = dev / "ports"
            if not ports_dir.is_dir():
                continue
            for port_dir in sorted(ports_dir.iterdir(), key=lambda p: p.name):
                if not port_dir.name.isdigit():
                    continue
                ports.append(self._read_port(dev.name, port_dir, now))
        return ports

    def _read_port(self, device: str, port_dir: Path, now: float) -> IbPortSample:
        port = int(port_dir.name)
        counters = port_dir / "counters"
        rx_words = _read_int(counters / "port_rcv_data")
        tx_words = _read_int(counters / "port_xmit_data")
        rx = rx_words * 4 if rx_words is not None else None
        tx = tx_words * 4 if tx_words is not None else None
        errors = {field: _read_int(counters / name) for field, name in _ERROR_COUNTERS.items()}
        return IbPortSample(
            device=device,
            port=port,
            state=_parse_state(_read(port_dir / "state")),
            rate_gbps=_parse_rate_gbps(_read(port_dir / "rate")),
            link_layer=_read(port_dir / "link_layer"),
            rx_bytes_per_s=self._rates.rate((device, port, "rx"), rx, now),
            tx_bytes_per_s=self._rates.rate((device, port, "tx"), tx, now),
            **errors,
        )
