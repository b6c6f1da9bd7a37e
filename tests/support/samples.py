"""Small hand-made hardware records for unit tests."""

from __future__ import annotations

from gpud.model.snapshot import HostSample


def host_sample() -> HostSample:
    """A minimal host: every optional reading left not-available."""
    return HostSample(
        hostname="h",
        cpu_count_logical=4,
        memory_total_bytes=8,
        memory_used_bytes=4,
        memory_available_bytes=4,
    )
