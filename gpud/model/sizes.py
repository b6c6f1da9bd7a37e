"""Byte sizes as people write them in specs, flags and config files, and as logs show them.

`parse_size("100MB")` is 100,000,000 bytes and `parse_size("1.5GiB")` 1,610,612,736: the SI
units (k, M, G, T, with or without B) are powers of 1000, the IEC ones (Ki, Mi, Gi, Ti,
with or without B) powers of 1024, as Kubernetes and systemd read them. A plain number is
bytes. `size_text` writes a size back the short SI way ("1.2 GB").
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


class SizeError(ValueError):
    """Text that is not a byte size; the message says what is expected."""


def parse_size(value: object) -> int:
    """Bytes from an int or text such as "100MB", "64 MiB", "1.5G"."""
    if isinstance(value, bool):
        raise SizeError(f"expected a size such as 100MB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"expected a size of 0 or more bytes, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise SizeError(
            f"expected a size such as 100MB, 64MiB or 1.5GB (bytes without a unit), got {value!r}"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def size_text(size: int) -> str:
    """`size` bytes the short way: "512 B", "200 kB", "1.2 GB"."""
    if size < 1000:
        return f"{size} B"
    for unit, scale in (("kB", 1000), ("MB", 1000**2), ("GB", 1000**3), ("TB", 1000**4)):
        value = size / scale
        if value < 999.5 or unit == "TB":
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")
