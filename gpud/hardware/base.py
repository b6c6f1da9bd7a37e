"""The interface every GPU sampler implements, and the system facts it reports."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from gpud.model.snapshot import Backend, GpuSample


class GpuSystemInfo(BaseModel):
    """Facts about the GPU stack that do not change while the daemon runs."""

    model_config = ConfigDict(frozen=True)

    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None


class GpuSampler(Protocol):
    """Samples every GPU of the node. Implementations: NvmlSampler, SimulatedSampler."""

    backend: Backend
    simulated: bool

    def system_info(self) -> GpuSystemInfo: ...

    def gpu_count(self) -> int: ...

    def sample(self) -> list[GpuSample]:
        """Read all GPUs now. Never raises for one missing field: that field is None."""
        ...

    def acknowledge_xids(self, gpu_index: int | None) -> int:
        """Mark XID events handled; returns how many were unacknowledged."""
        ...

    def close(self) -> None: ...


class NoGpuSampler:
    """A node without GPUs (no NVML and no --simulate-gpus): host metrics only."""

    backend: Backend = "none"
    simulated = False

    def system_info(self) -> GpuSystemInfo:
        return GpuSystemInfo()

    def gpu_count(self) -> int:
        return 0

    def sample(self) -> list[GpuSample]:
        return []

    def acknowledge_xids(self, gpu_index: int | None) -> int:
        return 0

    def close(self) -> None:
        return None
