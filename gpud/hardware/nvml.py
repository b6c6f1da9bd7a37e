"""The real GPU sampler: NVIDIA's NVML through nvidia-ml-py (module `pynvml`).

Owns every NVML call the daemon makes: opening and closing NVML, reading each GPU into a
`GpuSample`, and the background thread that turns XID events into `XidTracker` records.
Every call goes through `NvmlSampler._call`, which turns NVML errors into None (not
available) and remembers lost GPUs, so one unsupported field never costs a sample. The
NVML module is injected, so tests fake NVML at its lowest layer and nothing else.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psutil
import pynvml

from gpud.hardware.base import GpuSystemInfo
from gpud.hardware.nvml_fields import (
    as_bool,
    as_int,
    clock_event_reasons,
    cuda_version,
    field_value_number,
    memory_bytes,
    memory_temperature_c,
    milliwatts_to_w,
    text,
)
from gpud.hardware.rates import RateTracker
from gpud.hardware.xid import XidTracker
from gpud.model.snapshot import Backend, GpuProcess, GpuSample, NvLinkSample

log = logging.getLogger("gpud.nvml")

#: Error counters and modes change rarely and an operator reads them in seconds, not ms.
HEALTH_TTL_S = 5.0
#: The enforced limit changes only when someone runs `nvidia-smi -pl` or the board caps it.
POWER_LIMIT_TTL_S = 30.0
#: nvmlDeviceGetPcieThroughput blocks ~20 ms per call (it samples the link itself), so the
#: fallback for GPUs without cumulative PCIe counters is read at most this often.
PCIE_THROUGHPUT_TTL_S = 5.0
#: Reads that cost milliseconds of the host's CPU each, where every other read costs
#: microseconds (measured on an H100, driver 580: the energy counter 4.1 ms, GPM's graphics
#: engine activity 1.6 ms — 5.7 of a sample's 7.3 ms): taken as often as dcgm-exporter
#: collects by default, and the last reading reported in between.
SLOW_READ_S = 30.0
#: How long one event-set wait blocks; close() takes at most about this long.
XID_WAIT_MS = 500
KIB = 1024

#: The GPM metrics read between two samples, by the GpuSample field each fills: the ones
#: DCGM reads for DCGM_FI_PROF_SM_ACTIVE, SM_OCCUPANCY, PIPE_TENSOR_ACTIVE, GR_ENGINE_ACTIVE
#: and DRAM_ACTIVE on Hopper and newer.
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_activity_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_activity_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("graphics_activity_pct", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
    ("dram_activity_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
#: Of those, asked for every SLOW_READ_S only.
SLOW_GPM_METRICS = frozenset({"graphics_activity_pct"})

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why in one line."""


class _Cached(Generic[T]):
    """The last value read, reused until it is `ttl_s` old on the sampler's clock."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entry: tuple[float, T] | None = None

    def get(self, now: float, read: Callable[[], T]) -> T:
        if self._entry is None or not 0 <= now - self._entry[0] < self.ttl_s:
            self._entry = (now, read())
        return self._entry[1]


@dataclass(frozen=True)
class _Health:
    """Modes and error counters of one GPU: read together, cached for HEALTH_TTL_S."""

    persistence_mode: bool | None
    mig_mode: bool | None
    ecc_mode: bool | None
    ecc_corrected_volatile: int | None
    ecc_uncorrected_volatile: int | None
    ecc_corrected_aggregate: int | None
    ecc_uncorrected_aggregate: int | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failed: bool | None
    pcie_replay_count: int | None
    nvlinks: list[NvLinkSample] | None  # without throughput: that is read every sample


@dataclass(eq=False)
class _Gpu:
    """What the sampler keeps per GPU: its handle, static facts read at open, and state."""

    index: int
    uuid: str  # a placeholder until NVML tells the real one
    handle: Any = None
    name: str = "unknown"
    pci_bus_id: str | None = None
    serial: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    memory_v1: bool = False  # the driver has no v2 memory info
    clock_sm_max_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_max: int | None = None
    nvlink_count: int | None = None  # None: no NVLink at all
    peer_distance: dict[int, int] | None = None  # static: read once, after every GPU opened
    gpm_buffers: list[Any] = field(default_factory=list)  # [previous, next]; []: no GPM
    gpm_primed: bool = False  # `previous` holds a sample to diff against
    lost: bool = False  # NVML said GPU_IS_LOST: never asked about this GPU again
    health: _Cached[_Health] = field(default_factory=lambda: _Cached(HEALTH_TTL_S))
    power_limit: _Cached[int | None] = field(default_factory=lambda: _Cached(POWER_LIMIT_TTL_S))
    pcie_throughput: _Cached[tuple[float | None, float | None]] = field(
        default_factory=lambda: _Cached(PCIE_THROUGHPUT_TTL_S)
    )
    energy_mj: _Cached[int | None] = field(default_factory=lambda: _Cached(SLOW_READ_S))
    slow_gpm: dict[str, float] = field(default_factory=dict)  # SLOW_GPM_METRICS, last read
    slow_gpm_at: float = float("-inf")
    #: Reads NVML answered NOT_SUPPORTED (name and int arguments): never asked again. A fan
    #: speed on a board without fans cost 0.17 ms a sample, to learn the same each time.
    unsupported: set[tuple[Any, ...]] = field(default_factory=set)


def process_name_of(pid: int) -> str | None:
    """The OS name of `pid`; None when it is gone or not visible (another PID namespace)."""
    try:
        name: str = psutil.Process(pid).name()
    except psutil.Error:
        return None
    return name


class NvmlSampler:
    """Samples every GPU NVML sees. Build it with `open()`; the constructor expects an
    initialised NVML (`nvml.nvmlInit()` already called) and owns it from then on."""

    backend: Backend = "nvml"
    simulated = False

    def __init__(
        self,
        nvml: Any = pynvml,
        *,
        clock: Callable[[], float] = time.time,
        process_name: Callable[[int], str | None] = process_name_of,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._process_name = process_name
        # Errors that only mean "this GPU or driver does not offer it": logged at debug.
        self._expected_errors = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        }
        # pynvml raises NVMLLibraryMismatchError, not an NVMLError, from a few unversioned
        # functions when the driver lacks the version pynvml maps them to.
        self._errors = (nvml.NVMLError, getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError))
        self._logged: set[tuple[int | None, str]] = set()
        self._rates = RateTracker(clock)
        self._info = self._read_system_info()
        count = as_int(self._call(None, "nvmlDeviceGetCount")) or 0
        self._gpus = [self._open_gpu(i) for i in range(count)]
        self._read_topology()
        self._index_by_uuid = {gpu.uuid: gpu.index for gpu in self._gpus}
        self._index_by_handle = {
            _handle_key(gpu.handle): gpu.index for gpu in self._gpus if gpu.handle is not None
        }
        self._xids = XidTracker(count, clock)
        self._stop = threading.Event()
        self._event_set: Any = None
        self._xid_thread: threading.Thread | None = None
        self._closed = False
        self._start_xid_listener()

    @classmethod
    def open(
        cls,
        nvml: Any = pynvml,
        *,
        clock: Callable[[], float] = time.time,
        process_name: Callable[[int], str | None] = process_name_of,
    ) -> NvmlSampler:
        """Initialise NVML and open every GPU; NvmlUnavailable says why when it cannot."""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise NvmlUnavailable(_init_failure(nvml, err)) from None
        try:
            sampler = cls(nvml, clock=clock, process_name=process_name)
        except BaseException:
            nvml.nvmlShutdown()
            raise
        if sampler.gpu_count() == 0:
            sampler.close()
            raise NvmlUnavailable("NVML found no GPUs")
        return sampler

    def _read_topology(self) -> None:
        """How far apart each pair of GPUs is (`GpuSample.peer_distance`): 0 where NVLink
        peer-to-peer works, else the level of their common ancestor in the PCIe tree."""
        nvml = self._nvml
        nvlink_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        p2p_ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        opened = [gpu for gpu in self._gpus if gpu.handle is not None]
        for gpu in opened:
            distances: dict[int, int] = {}
            for other in opened:
                if other is gpu:
                    continue
                if nvlink_caps is not None:
                    status = self._call(
                        gpu, "nvmlDeviceGetP2PStatus", gpu.handle, other.handle, nvlink_caps
                    )
                    if status is not None and status is not True and status == p2p_ok:
                        distances[other.index] = 0
                        continue
                level = as_int(
                    self._call(gpu, "nvmlDeviceGetTopologyCommonAncestor", gpu.handle, other.handle)
                )
                if level is not None:
                    distances[other.index] = level
            gpu.peer_distance = distances or None

    def system_info(self) -> GpuSystemInfo:
        return self._info

    def gpu_count(self) -> int:
        return len(self._gpus)

    def sample(self) -> list[GpuSample]:
        now = self._clock()
        return [self._sample_gpu(gpu, now) for gpu in self._gpus]

    def acknowledge_xids(self, gpu_index: int | None) -> int:
        return self._xids.acknowledge(gpu_index)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=4 * XID_WAIT_MS / 1000)
            if self._xid_thread.is_alive():
                # Freeing the set or shutting NVML down under a waiting thread can crash.
                log.warning("XID listener did not stop; leaving NVML open")
                return
        if self._event_set is not None:
            self._call(None, "nvmlEventSetFree", self._event_set)
        for gpu in self._gpus:
            self._free_gpm(gpu)
        self._call(None, "nvmlShutdown")

    # -- the one way NVML is called ------------------------------------------------------

    def _call(self, gpu: _Gpu | None, name: str, *args: Any) -> Any:
        """`nvml.<name>(*args)`, or None when it is not available: the function is missing
        from this pynvml, NVML returned an error, or the GPU is lost. An NVML action that
        succeeds without a result gives True, so every failure reads as None."""
        fn = getattr(self._nvml, name, None)
        if fn is None or (gpu is not None and gpu.lost):
            return None
        key = (name, *(a for a in args if isinstance(a, int)))
        if gpu is not None and key in gpu.unsupported:
            return None
        try:
            result = fn(*args)
        except self._errors as err:
            if gpu is not None and getattr(err, "value", None) == getattr(
                self._nvml, "NVML_ERROR_NOT_SUPPORTED", object()
            ):
                gpu.unsupported.add(key)
            self._not_available(gpu, name, err)
            return None
        return True if result is None else result

    def _not_available(self, gpu: _Gpu | None, name: str, err: Exception) -> None:
        code = getattr(err, "value", None)
        if gpu is not None and code == self._nvml.NVML_ERROR_GPU_IS_LOST:
            if not gpu.lost:
                gpu.lost = True
                log.error("GPU %d (%s) is lost (%s failed)", gpu.index, gpu.uuid, name)
            return
        key = (None if gpu is None else gpu.index, name)
        if key in self._logged:
            return
        self._logged.add(key)
        level = logging.DEBUG if code in self._expected_errors else logging.WARNING
        where = "NVML" if gpu is None else f"GPU {gpu.index}"
        log.log(level, "%s: %s failed (%s); reporting it as not available", where, name, err)

    def _read(self, gpu: _Gpu, name: str, *args: Any) -> Any:
        """`_call` for the usual NVML shape: a function of the GPU's handle and more."""
        return self._call(gpu, name, gpu.handle, *args)

    def _memory(self, gpu: _Gpu) -> Any:
        """Memory info, v2 where the driver has it: its `used` leaves out what the driver
        reserves (`reserved`), as nvidia-smi and dcgm-exporter count it. v1's `used`
        includes it: ~500 MiB "used" on an idle H100 that nvidia-smi shows at 0 MiB."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if version is not None and not gpu.memory_v1:
            memory = self._read(gpu, "nvmlDeviceGetMemoryInfo", version)
            if memory is not None or gpu.lost:
                return memory
            memory = self._read(gpu, "nvmlDeviceGetMemoryInfo")
            gpu.memory_v1 = memory is not None  # v2 fails where v1 works: an older driver
            return memory
        return self._read(gpu, "nvmlDeviceGetMemoryInfo")

    # -- opening -------------------------------------------------------------------------

    def _read_system_info(self) -> GpuSystemInfo:
        cuda = as_int(self._call(None, "nvmlSystemGetCudaDriverVersion_v2"))
        return GpuSystemInfo(
            driver_version=text(self._call(None, "nvmlSystemGetDriverVersion")),
            cuda_driver_version=None if cuda is None else cuda_version(cuda),
            nvml_version=text(self._call(None, "nvmlSystemGetNVMLVersion")),
        )

    def _open_gpu(self, index: int) -> _Gpu:
        nvml = self._nvml
        gpu = _Gpu(index=index, uuid=f"unknown-{index}")
        gpu.handle = self._call(gpu, "nvmlDeviceGetHandleByIndex", index)
        if gpu.handle is None:
            # Nothing about it can be read; reporting it lost lets the daemon say so.
            if not gpu.lost:
                gpu.lost = True
                log.error("GPU %d cannot be opened; reporting it as lost", index)
            return gpu
        gpu.name = text(self._read(gpu, "nvmlDeviceGetName")) or gpu.name
        gpu.uuid = text(self._read(gpu, "nvmlDeviceGetUUID")) or gpu.uuid
        pci = self._read(gpu, "nvmlDeviceGetPciInfo")
        gpu.pci_bus_id = None if pci is None else text(pci.busId)
        gpu.serial = text(self._read(gpu, "nvmlDeviceGetSerial"))
        cc = self._read(gpu, "nvmlDeviceGetCudaComputeCapability")
        gpu.compute_capability = None if cc is None else (int(cc[0]), int(cc[1]))
        memory = self._memory(gpu)
        gpu.memory_total_bytes = None if memory is None else int(memory.total)
        gpu.clock_sm_max_mhz = as_int(
            self._read(gpu, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
        )
        gpu.clock_mem_max_mhz = as_int(
            self._read(gpu, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM)
        )
        # The GPU's own maximum first: the other one is capped by the slot and the bridge.
        gen_max = self._read(gpu, "nvmlDeviceGetGpuMaxPcieLinkGeneration")
        if gen_max is None:
            gen_max = self._read(gpu, "nvmlDeviceGetMaxPcieLinkGeneration")
        gpu.pcie_link_gen_max = as_int(gen_max)
        gpu.pcie_link_width_max = as_int(self._read(gpu, "nvmlDeviceGetMaxPcieLinkWidth"))
        # Links are numbered from 0; the first one NVML rejects is past the last link.
        links = 0
        while links < nvml.NVML_NVLINK_MAX_LINKS:
            if self._read(gpu, "nvmlDeviceGetNvLinkState", links) is None:
                break
            links += 1
        gpu.nvlink_count = links or None
        support = self._read(gpu, "nvmlGpmQueryDeviceSupport")
        if support is not None and support.isSupportedDevice:
            buffers = [self._call(gpu, "nvmlGpmSampleAlloc") for _ in range(2)]
            gpu.gpm_buffers = [b for b in buffers if b is not None]
            if len(gpu.gpm_buffers) < 2:
                self._free_gpm(gpu)
        return gpu

    def _free_gpm(self, gpu: _Gpu) -> None:
        for buffer in gpu.gpm_buffers:
            self._call(gpu, "nvmlGpmSampleFree", buffer)
        gpu.gpm_buffers = []

    # -- sampling ------------------------------------------------------------------------

    def _sample_gpu(self, gpu: _Gpu, now: float) -> GpuSample:
        if gpu.lost:
            return self._identity_only(gpu)
        nvml = self._nvml
        util = self._read(gpu, "nvmlDeviceGetUtilizationRates")
        gpm = self._read_gpm(gpu, now)
        memory = self._memory(gpu)
        # The "throttle" name is the pre-535 spelling of the same bitmask.
        reasons = self._read(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = self._read(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
        power_limit_mw = gpu.power_limit.get(
            now, lambda: as_int(self._read(gpu, "nvmlDeviceGetEnforcedPowerLimit"))
        )
        health = gpu.health.get(now, lambda: self._read_health(gpu))
        fields = self._read_field_values(gpu)
        traffic = self._traffic(gpu, now, fields)
        encoder = self._read(gpu, "nvmlDeviceGetEncoderUtilization")  # [%, sampling period µs]
        decoder = self._read(gpu, "nvmlDeviceGetDecoderUtilization")
        nvlinks = None
        if health.nvlinks is not None:
            tx_field = nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            rx_field = nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
            nvlinks = [
                link.model_copy(
                    update={
                        "tx_bytes_per_s": traffic.get((tx_field, link.link)),
                        "rx_bytes_per_s": traffic.get((rx_field, link.link)),
                    }
                )
                for link in health.nvlinks
            ]
        sample = GpuSample(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            serial=gpu.serial,
            compute_capability=gpu.compute_capability,
            utilization_gpu_pct=None if util is None else float(util.gpu),
            utilization_memory_pct=None if util is None else float(util.memory),
            encoder_utilization_pct=None if encoder is None else float(encoder[0]),
            decoder_utilization_pct=None if decoder is None else float(decoder[0]),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_reserved_bytes=as_int(getattr(memory, "reserved", None)),
            memory_total_bytes=gpu.memory_total_bytes,
            temperature_c=as_int(
                self._read(gpu, "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
            ),
            memory_temperature_c=memory_temperature_c(
                fields.get((nvml.NVML_FI_DEV_MEMORY_TEMP, 0))
            ),
            power_w=milliwatts_to_w(as_int(self._read(gpu, "nvmlDeviceGetPowerUsage"))),
            energy_mj=gpu.energy_mj.get(
                now, lambda: as_int(self._read(gpu, "nvmlDeviceGetTotalEnergyConsumption"))
            ),
            power_limit_w=milliwatts_to_w(power_limit_mw),
            fan_pct=as_int(self._read(gpu, "nvmlDeviceGetFanSpeed")),
            clock_sm_mhz=as_int(self._read(gpu, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)),
            clock_sm_max_mhz=gpu.clock_sm_max_mhz,
            clock_mem_mhz=as_int(self._read(gpu, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)),
            clock_mem_max_mhz=gpu.clock_mem_max_mhz,
            clock_event_reasons=None if reasons is None else clock_event_reasons(int(reasons)),
            persistence_mode=health.persistence_mode,
            mig_mode=health.mig_mode,
            ecc_mode=health.ecc_mode,
            ecc_corrected_volatile=health.ecc_corrected_volatile,
            ecc_uncorrected_volatile=health.ecc_uncorrected_volatile,
            ecc_corrected_aggregate=health.ecc_corrected_aggregate,
            ecc_uncorrected_aggregate=health.ecc_uncorrected_aggregate,
            remapped_rows_correctable=health.remapped_rows_correctable,
            remapped_rows_uncorrectable=health.remapped_rows_uncorrectable,
            remapped_rows_pending=health.remapped_rows_pending,
            remapped_rows_failed=health.remapped_rows_failed,
            pcie_link_gen=as_int(self._read(gpu, "nvmlDeviceGetCurrPcieLinkGeneration")),
            pcie_link_gen_max=gpu.pcie_link_gen_max,
            pcie_link_width=as_int(self._read(gpu, "nvmlDeviceGetCurrPcieLinkWidth")),
            pcie_link_width_max=gpu.pcie_link_width_max,
            pcie_replay_count=health.pcie_replay_count,
            pcie_tx_bytes_per_s=traffic.get((nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0)),
            pcie_rx_bytes_per_s=traffic.get((nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)),
            nvlinks=nvlinks,
            peer_distance=gpu.peer_distance,
            xid=self._xids.summary(gpu.index),
            processes=self._read_processes(gpu),
            **gpm,
        )
        # A GPU lost halfway through must not report the readings taken before it went.
        return self._identity_only(gpu) if gpu.lost else sample

    def _identity_only(self, gpu: _Gpu) -> GpuSample:
        return GpuSample(
            index=gpu.index,
            lost=gpu.lost,
            name=gpu.name,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            serial=gpu.serial,
            compute_capability=gpu.compute_capability,
            xid=self._xids.summary(gpu.index),
        )

    def _read_gpm(self, gpu: _Gpu, now: float) -> dict[str, float]:
        """The GPM metrics (GPM_METRICS) between the last two samples, by GpuSample field;
        empty on a GPU without GPM and at its first sample, without those it does not offer.
        SLOW_GPM_METRICS are read every SLOW_READ_S, their last value reported between."""
        if not gpu.gpm_buffers:
            return {}
        nvml = self._nvml
        previous, current = gpu.gpm_buffers
        if self._read(gpu, "nvmlGpmSampleGet", current) is None:
            gpu.gpm_primed = False
            return {}
        gpu.gpm_buffers = [current, previous]
        if not gpu.gpm_primed:
            gpu.gpm_primed = True
            return {}
        slow_due = now - gpu.slow_gpm_at >= SLOW_READ_S
        asked = [(n, m) for n, m in GPM_METRICS if slow_due or n not in SLOW_GPM_METRICS]
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(asked)
        request.sample1, request.sample2 = previous, current
        for i, (_, metric) in enumerate(asked):
            request.metrics[i].metricId = getattr(nvml, metric)
        result = self._call(gpu, "nvmlGpmMetricsGet", request)
        if result is None:
            return {}
        found = {
            name: float(m.value)
            for (name, _), m in zip(asked, result.metrics[: len(asked)], strict=True)
            if m.nvmlReturn == nvml.NVML_SUCCESS
        }
        if slow_due:
            gpu.slow_gpm_at = now
            gpu.slow_gpm = {n: v for n, v in found.items() if n in SLOW_GPM_METRICS}
        return {**gpu.slow_gpm, **found}

    def _read_health(self, gpu: _Gpu) -> _Health:
        nvml = self._nvml
        corrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED

        def ecc(error_type: int, counter_type: int) -> int | None:
            return as_int(self._read(gpu, "nvmlDeviceGetTotalEccErrors", error_type, counter_type))

        mig = self._read(gpu, "nvmlDeviceGetMigMode")  # [current, pending]
        ecc_mode = self._read(gpu, "nvmlDeviceGetEccMode")  # [current, pending]
        rows = self._read(gpu, "nvmlDeviceGetRemappedRows")  # corr, unc, pending, failed
        return _Health(
            persistence_mode=as_bool(self._read(gpu, "nvmlDeviceGetPersistenceMode")),
            mig_mode=None if mig is None else bool(mig[0]),
            ecc_mode=None if ecc_mode is None else bool(ecc_mode[0]),
            ecc_corrected_volatile=ecc(corrected, nvml.NVML_VOLATILE_ECC),
            ecc_uncorrected_volatile=ecc(uncorrected, nvml.NVML_VOLATILE_ECC),
            ecc_corrected_aggregate=ecc(corrected, nvml.NVML_AGGREGATE_ECC),
            ecc_uncorrected_aggregate=ecc(uncorrected, nvml.NVML_AGGREGATE_ECC),
            remapped_rows_correctable=None if rows is None else int(rows[0]),
            remapped_rows_uncorrectable=None if rows is None else int(rows[1]),
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failed=None if rows is None else bool(rows[3]),
            pcie_replay_count=as_int(self._read(gpu, "nvmlDeviceGetPcieReplayCounter")),
            nvlinks=None
            if gpu.nvlink_count is None
            else [self._read_nvlink(gpu, link) for link in range(gpu.nvlink_count)],
        )

    def _read_nvlink(self, gpu: _Gpu, link: int) -> NvLinkSample:
        nvml = self._nvml

        def errors(*counters: int) -> int | None:
            values = [self._read(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, c) for c in counters]
            return None if None in values else sum(int(v) for v in values)

        return NvLinkSample(
            link=link,
            active=as_bool(self._read(gpu, "nvmlDeviceGetNvLinkState", link)),
            version=as_int(self._read(gpu, "nvmlDeviceGetNvLinkVersion", link)),
            crc_errors=errors(
                nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA
            ),
            replay_errors=errors(nvml.NVML_NVLINK_ERROR_DL_REPLAY),
            recovery_errors=errors(nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
        )

    def _counter_ids(self, gpu: _Gpu) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(field id, scope) of the byte counters: PCIe TX/RX (scope 0), NVLink TX/RX
        (scope = link)."""
        nvml = self._nvml
        pcie = [
            (nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
            (nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
        ]
        nvlink_fields = (
            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        nvlink = [(f, link) for link in range(gpu.nvlink_count or 0) for f in nvlink_fields]
        return pcie, nvlink

    def _read_field_values(self, gpu: _Gpu) -> dict[tuple[int, int], Any]:
        """One nvmlDeviceGetFieldValues call, by (field id, scope): the byte counters and
        the memory temperature (as DCGM reads it). NVML answers each field apart, so one
        the GPU lacks costs the others nothing."""
        pcie, nvlink = self._counter_ids(gpu)
        wanted = [*pcie, (self._nvml.NVML_FI_DEV_MEMORY_TEMP, 0), *nvlink]
        values = self._read(gpu, "nvmlDeviceGetFieldValues", wanted)
        return {(int(v.fieldId), int(v.scopeId)): v for v in values or ()}

    def _traffic(
        self, gpu: _Gpu, now: float, fields: dict[tuple[int, int], Any]
    ) -> dict[tuple[int, int], float | None]:
        """Bytes per second by (field id, scope), from the byte counters among `fields`."""
        pcie, nvlink = self._counter_ids(gpu)
        counters = {key: field_value_number(fields[key]) for key in pcie + nvlink if key in fields}
        rates: dict[tuple[int, int], float | None] = {}
        for key in pcie + nvlink:
            value = counters.get(key)
            unit = 1 if key in pcie else KIB  # NVLink counters count KiB
            scaled = None if value is None else value * unit
            rates[key] = self._rates.rate((gpu.index, key), scaled, now)
        if all(counters.get(key) is None for key in pcie):
            rates[pcie[0]], rates[pcie[1]] = gpu.pcie_throughput.get(
                now, lambda: self._read_pcie_throughput(gpu)
            )
        return rates

    def _read_pcie_throughput(self, gpu: _Gpu) -> tuple[float | None, float | None]:
        """The fallback for GPUs without PCIe byte counters: KB/s over the last ~20 ms.
        Each call blocks that long, hence the cache (PCIE_THROUGHPUT_TTL_S) around it."""
        nvml = self._nvml
        tx, rx = (
            as_int(self._read(gpu, "nvmlDeviceGetPcieThroughput", counter))
            for counter in (nvml.NVML_PCIE_UTIL_TX_BYTES, nvml.NVML_PCIE_UTIL_RX_BYTES)
        )
        return (None if tx is None else tx * KIB, None if rx is None else rx * KIB)

    def _read_processes(self, gpu: _Gpu) -> list[GpuProcess] | None:
        processes = self._read(gpu, "nvmlDeviceGetComputeRunningProcesses")
        if processes is None:  # drivers older than pynvml's default (_v3) still have _v2
            processes = self._read(gpu, "nvmlDeviceGetComputeRunningProcesses_v2")
        if processes is None:
            return None
        return [
            GpuProcess(
                pid=int(p.pid),
                name=self._process_name(int(p.pid)),
                used_memory_bytes=memory_bytes(p.usedGpuMemory),
            )
            for p in processes
        ]

    # -- XID events ----------------------------------------------------------------------

    def _start_xid_listener(self) -> None:
        event_set = self._call(None, "nvmlEventSetCreate")
        if event_set is None:
            log.info("NVML events are not available; XIDs will not be reported")
            return
        xid = self._nvml.nvmlEventTypeXidCriticalError
        registered = 0
        for gpu in self._gpus:
            if gpu.lost:
                continue
            if self._read(gpu, "nvmlDeviceRegisterEvents", xid, event_set) is None:
                log.info("GPU %d does not report XID events; skipping it", gpu.index)
            else:
                registered += 1
        if registered == 0:
            self._call(None, "nvmlEventSetFree", event_set)
            return
        self._event_set = event_set
        self._xid_thread = threading.Thread(
            target=self._listen_for_xids, name="gpud-nvml-xid", daemon=True
        )
        self._xid_thread.start()

    def _listen_for_xids(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            # Not through _call: here a timeout is the normal answer, not a failure, and
            # an error must slow the loop down rather than spin it.
            try:
                event = nvml.nvmlEventSetWait_v2(self._event_set, XID_WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as err:
                self._not_available(None, "nvmlEventSetWait_v2", err)
                self._stop.wait(XID_WAIT_MS / 1000)
                continue
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                self._record_xid(event.device, int(event.eventData))

    def _record_xid(self, device: Any, code: int) -> None:
        # By handle first: a GPU that fell off the bus (XID 79) can no longer tell its uuid.
        index = self._index_by_handle.get(_handle_key(device))
        uuid = None
        if index is None:
            uuid = text(self._call(None, "nvmlDeviceGetUUID", device))
            index = self._index_by_uuid.get(uuid or "")
        if index is None:
            log.warning("XID %d from a GPU this sampler does not know (uuid %s)", code, uuid)
            return
        log.warning("GPU %d: XID %d", index, code)
        self._xids.record(index, code)


def _handle_key(handle: Any) -> int:
    """A device handle's identity: the address it points to (or the object, for fakes)."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0) or id(handle)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _init_failure(nvml: Any, err: Exception) -> str:
    """One line that says why nvmlInit failed and, where it can, what to check."""
    reasons = {
        nvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library not found (no NVIDIA driver?)",
        nvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA kernel driver is not loaded",
        nvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices",
        nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "NVML library and kernel driver versions differ (reload the driver or reboot)"
        ),
    }
    return reasons.get(getattr(err, "value", None), f"NVML failed to initialise: {err}")
