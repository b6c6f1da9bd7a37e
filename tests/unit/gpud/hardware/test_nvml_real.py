"""NvmlSampler against the real NVML: skipped where there is no driver or no GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpud.hardware.nvml import NvmlSampler, NvmlUnavailable

pytestmark = pytest.mark.gpu


@pytest.fixture
def sampler() -> Iterator[NvmlSampler]:
    try:
        opened = NvmlSampler.open()
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVML GPUs here: {exc}")
    yield opened
    opened.close()


def test_samples_real_gpus(sampler: NvmlSampler) -> None:
    sampler.sample()
    time.sleep(0.2)  # GPM metrics and counter rates need two samples some time apart
    samples = sampler.sample()

    assert len(samples) == sampler.gpu_count() > 0
    assert sampler.system_info().driver_version
    for s in samples:
        assert not s.lost and not s.simulated
        assert s.name and s.name != "unknown"
        assert s.uuid.startswith(("GPU-", "MIG-"))
        assert s.pci_bus_id
        assert s.memory_total_bytes is not None and s.memory_total_bytes > 0
        assert s.utilization_gpu_pct is not None and 0 <= s.utilization_gpu_pct <= 100
        assert s.utilization_memory_pct is not None and 0 <= s.utilization_memory_pct <= 100
