"""A fake of the `pynvml` module for NvmlSampler tests: NVML faked at its lowest layer.

Constants, error classes and ctypes structs are the real pynvml ones; only the functions
the sampler calls are fakes, answering from `FakeGpu` records. A device handle is the
FakeGpu itself. Anything a FakeGpu lists in `unsupported` raises NVMLError_NotSupported;
`errors` maps a function name to any other NVML error code; `lost` raises GPUIsLost for
every call. Functions the fake does not define are missing, as in an older pynvml.
"""

from __future__ import annotations

import ctypes
import functools
import queue
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3

#: What a datacenter board (SXM, no fan of its own) does not offer.
DATACENTER_UNSUPPORTED = frozenset({"nvmlDeviceGetFanSpeed"})
#: What a GeForce card does not offer: no ECC, no row remapping, no MIG, no serial.
CONSUMER_UNSUPPORTED = frozenset(
    {
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetMigMode",
    }
)


@dataclass
class FakeNvLink:
    active: int = 1
    version: int = 4
    errors: dict[int, int] = field(default_factory=dict)  # NVML_NVLINK_ERROR_DL_* → count
    tx_kib: int = 0  # cumulative, as NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX counts
    rx_kib: int = 0


@dataclass(eq=False)
class FakeGpu:
    """One GPU's answers; change fields between samples to move counters on."""

    name: str | bytes = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    bus_id: bytes = b"00000000:18:00.0"
    serial: str = "1654321098765"
    compute_capability: tuple[int, int] = (9, 0)
    utilization: tuple[int, int] = (87, 41)  # gpu %, memory %
    memory_used: int = 30 * GIB
    memory_total: int = 80 * GIB
    memory_reserved: int = 512 * 1024**2  # what the driver keeps (v2 memory info)
    temperature: int = 64
    memory_temperature: int | None = 71  # NVML_FI_DEV_MEMORY_TEMP; None: not supported
    memory_temperature_as_double: bool = False  # how r545 drivers mislabel it (an int)
    power_mw: int = 512_345
    energy_mj: int = 987_654_321  # since the driver was loaded
    encoder: tuple[int, int] = (0, 167_000)  # utilization %, sampling period µs
    decoder: tuple[int, int] = (12, 167_000)
    power_limit_mw: int = 700_000
    fan: int = 45
    clocks: dict[int, int] = field(
        default_factory=lambda: {pynvml.NVML_CLOCK_SM: 1755, pynvml.NVML_CLOCK_MEM: 2619}
    )
    max_clocks: dict[int, int] = field(
        default_factory=lambda: {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}
    )
    clock_reasons: int = 0
    persistence: int = 1
    mig: int = 0
    ecc: int = 1
    ecc_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (type, counter)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    pcie_gen: int = 5
    pcie_gen_max: int = 4  # what the slot allows
    pcie_gpu_gen_max: int = 5  # what the GPU itself can do
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_replays: int = 0
    pcie_tx_bytes: int | None = 0  # cumulative; None: the field is not supported
    pcie_rx_bytes: int | None = 0
    pcie_throughput_kb: tuple[int, int] = (0, 0)  # the blocking fallback, KB/s
    nvlinks: list[FakeNvLink] = field(default_factory=list)  # []: no NVLink
    gpm: dict[int, float] | None = None  # NVML_GPM_METRIC_* → value; None: no GPM
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    unsupported: frozenset[str] | set[str] = frozenset()
    errors: dict[str, int] = field(default_factory=dict)  # function name → NVML error
    lost: bool = False
    calls: int = 0  # NVML calls made about this GPU


def h100(index: int = 0, **overrides: Any) -> FakeGpu:
    """An H100 SXM: NVLink, GPM, ECC, no fan."""
    values: dict[str, Any] = {
        "uuid": f"GPU-00000000-0000-0000-0000-{index:012d}",
        "bus_id": f"00000000:{0x18 + index:02X}:00.0".encode(),
        "nvlinks": [FakeNvLink() for _ in range(18)],
        "gpm": {
            pynvml.NVML_GPM_METRIC_SM_UTIL: 71.5,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 33.25,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 48.0,
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 93.5,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 27.75,
        },
        "unsupported": DATACENTER_UNSUPPORTED,
    }
    return FakeGpu(**(values | overrides))


def rtx4090(**overrides: Any) -> FakeGpu:
    """A GeForce card: a fan, but no ECC, NVLink, GPM, MIG, serial or memory temperature
    (GDDR6X: nvidia-smi shows it N/A)."""
    values: dict[str, Any] = {
        "name": "NVIDIA GeForce RTX 4090",
        "uuid": "GPU-40904090-4090-4090-4090-409040904090",
        "compute_capability": (8, 9),
        "memory_temperature": None,
        "unsupported": CONSUMER_UNSUPPORTED,
    }
    return FakeGpu(**(values | overrides))


def _device_call(method: Callable[..., Any]) -> Callable[..., Any]:
    """Counts the call and raises what the GPU is set up to raise for it."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: FakeNvml, gpu: FakeGpu, *args: Any) -> Any:
        self.calls[name] += 1
        gpu.calls += 1
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[name])
        if name in gpu.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return method(self, gpu, *args)

    return call


def _field(gpu: FakeGpu, field_id: int, scope: int) -> Any:
    if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
        # An unsigned int; r545 drivers mark it a double all the same.
        as_double = gpu.memory_temperature_as_double
        kind = pynvml.NVML_VALUE_TYPE_DOUBLE if as_double else pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        return _field_value(field_id, scope, gpu.memory_temperature, kind, "uiVal")
    return _field_value(field_id, scope, _counter(gpu, field_id, scope))


def _counter(gpu: FakeGpu, field_id: int, scope: int) -> int | None:
    if field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
        return gpu.pcie_tx_bytes
    if field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
        return gpu.pcie_rx_bytes
    if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
        return gpu.nvlinks[scope].tx_kib
    if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
        return gpu.nvlinks[scope].rx_kib
    raise AssertionError(f"the fake has no field {field_id}")


def _field_value(
    field_id: int,
    scope: int,
    number: int | None,
    kind: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    member: str = "ullVal",
) -> Any:
    value = pynvml.c_nvmlFieldValue_t()
    value.fieldId, value.scopeId = field_id, scope
    if number is None:
        value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    else:
        value.nvmlReturn = pynvml.NVML_SUCCESS
        value.valueType = kind
        setattr(value.value, member, number)
    return value


class FakeNvml:
    """Stands in for the `pynvml` module."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        events_supported: bool = True,
        cuda_version: int = 12040,
        topology: dict[tuple[int, int], int] | None = None,
        nvlink_pairs: frozenset[tuple[int, int]] = frozenset(),
    ) -> None:
        self.gpus = gpus
        # (i, j) with i < j → NVML_TOPOLOGY_* level; absent: NOT_SUPPORTED (no topology)
        self.topology = topology
        self.nvlink_pairs = nvlink_pairs
        self.init_error = init_error
        self.events_supported = events_supported
        self.cuda_version = cuda_version
        self.calls: Counter[str] = Counter()
        self.initialized = False
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self._gpm_buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}  # address → memory
        self._gpm_owner: dict[int, FakeGpu] = {}

    def __getattr__(self, name: str) -> Any:
        # Only what pynvml defines as data: constants, error classes, ctypes structs.
        if name.startswith(("NVML", "nvmlEventType", "c_nvml", "nvmlMemory_v")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- test controls -------------------------------------------------------------------

    def inject_xid(self, gpu_index: int, code: int) -> None:
        self.events.put(
            SimpleNamespace(
                device=self.gpus[gpu_index],
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=code,
            )
        )

    @property
    def live_gpm_samples(self) -> int:
        return len(self._gpm_buffers)

    # -- system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda_version

    def nvmlSystemGetNVMLVersion(self) -> bytes:
        return b"12.550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if self.gpus[index].lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[index]

    # -- identity and static facts -------------------------------------------------------

    @_device_call
    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str | bytes:
        return gpu.name

    @_device_call
    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> bytes:
        return gpu.uuid.encode()  # pynvml returns bytes here: no convertStrBytes

    @_device_call
    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.bus_id
        return info

    @_device_call
    def nvmlDeviceGetSerial(self, gpu: FakeGpu) -> str:
        return gpu.serial

    @_device_call
    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu) -> tuple[int, int]:
        return gpu.compute_capability

    @_device_call
    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        return gpu.max_clocks[clock]

    @_device_call
    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return gpu.pcie_gpu_gen_max

    @_device_call
    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return gpu.pcie_gen_max

    @_device_call
    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: FakeGpu) -> int:
        return gpu.pcie_width_max

    @_device_call
    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        return gpu.power_limit_mw

    # -- live readings -------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> pynvml.c_nvmlUtilization_t:
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization[0], memory=gpu.utilization[1])

    @_device_call
    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> Any:
        """v1 counts the reserved memory as used; v2 (newer drivers) reports it apart."""
        free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        if version is None:
            used = gpu.memory_used + gpu.memory_reserved
            return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=free, used=used)
        if "nvmlMemory_v2" in gpu.unsupported:  # an older driver
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert version == pynvml.nvmlMemory_v2
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=gpu.memory_total, reserved=gpu.memory_reserved, free=free,
            used=gpu.memory_used,
        )  # fmt: skip

    @_device_call
    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return gpu.temperature

    @_device_call
    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return gpu.power_mw

    @_device_call
    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        return gpu.energy_mj

    @_device_call
    def nvmlDeviceGetEncoderUtilization(self, gpu: FakeGpu) -> list[int]:
        return list(gpu.encoder)

    @_device_call
    def nvmlDeviceGetDecoderUtilization(self, gpu: FakeGpu) -> list[int]:
        return list(gpu.decoder)

    @_device_call
    def nvmlDeviceGetFanSpeed(self, gpu: FakeGpu) -> int:
        return gpu.fan

    @_device_call
    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        return gpu.clocks[clock]

    @_device_call
    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        return gpu.clock_reasons

    @_device_call
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        return gpu.clock_reasons

    @_device_call
    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return gpu.pcie_gen

    @_device_call
    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: FakeGpu) -> int:
        return gpu.pcie_width

    @_device_call
    def nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        return gpu.pcie_throughput_kb[counter]  # NVML_PCIE_UTIL_TX_BYTES = 0, RX = 1

    @_device_call
    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[tuple[int, int]]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, (field_id, scope) in enumerate(field_ids):
            values[i] = _field(gpu, field_id, scope)
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        # Like pynvml: the unversioned name calls _v3 and reports a driver without it as a
        # library mismatch, which is not an NVMLError.
        try:
            processes: list[SimpleNamespace] = self.nvmlDeviceGetComputeRunningProcesses_v3(gpu)
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError("use a versioned function") from None
        return processes

    @_device_call
    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    @_device_call
    def nvmlDeviceGetComputeRunningProcesses_v2(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    # -- health --------------------------------------------------------------------------

    @_device_call
    def _pair(self, a: FakeGpu, b: FakeGpu) -> tuple[int, int]:
        i, j = self.gpus.index(a), self.gpus.index(b)
        return (min(i, j), max(i, j))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        self.calls["nvmlDeviceGetTopologyCommonAncestor"] += 1
        if self.topology is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.topology[self._pair(a, b)]

    def nvmlDeviceGetP2PStatus(self, a: FakeGpu, b: FakeGpu, caps: int) -> int:
        assert caps == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        if self._pair(a, b) in self.nvlink_pairs:
            return int(pynvml.NVML_P2P_STATUS_OK)
        return int(pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    def nvmlDeviceGetPersistenceMode(self, gpu: FakeGpu) -> int:
        return gpu.persistence

    @_device_call
    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        return [gpu.mig, gpu.mig]

    @_device_call
    def nvmlDeviceGetEccMode(self, gpu: FakeGpu) -> list[int]:
        return [gpu.ecc, gpu.ecc]

    @_device_call
    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter: int) -> int:
        return gpu.ecc_errors.get((error_type, counter), 0)

    @_device_call
    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        return gpu.remapped_rows

    @_device_call
    def nvmlDeviceGetPcieReplayCounter(self, gpu: FakeGpu) -> int:
        return gpu.pcie_replays

    @_device_call
    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        if not gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlinks):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link].active

    @_device_call
    def nvmlDeviceGetNvLinkVersion(self, gpu: FakeGpu, link: int) -> int:
        return gpu.nvlinks[link].version

    @_device_call
    def nvmlDeviceGetNvLinkErrorCounter(self, gpu: FakeGpu, link: int, counter: int) -> int:
        return gpu.nvlinks[link].errors.get(counter, 0)

    # -- GPM -----------------------------------------------------------------------------

    @_device_call
    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> pynvml.c_nvmlGpmSupport_t:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        memory = ctypes.create_string_buffer(8)
        self._gpm_buffers[ctypes.addressof(memory)] = memory
        return ctypes.cast(memory, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        del self._gpm_buffers[_address(sample)]

    @_device_call
    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:
        self._gpm_owner[_address(sample)] = gpu
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        gpu = self._gpm_owner[_address(request.sample2)]
        assert self._gpm_owner[_address(request.sample1)] is gpu
        assert gpu.gpm is not None
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in gpu.gpm:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    # -- events --------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        if not self.events_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return object()

    @_device_call
    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, event_types: int, event_set: object) -> None:
        assert event_types & pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        # Waits at most 5 ms, not timeout_ms, so closing a sampler in a test is quick.
        try:
            return self.events.get(timeout=min(timeout_ms, 5) / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.calls["nvmlEventSetFree"] += 1


def _address(sample: Any) -> int:
    address = ctypes.cast(sample, ctypes.c_void_p).value
    assert address is not None
    return address
