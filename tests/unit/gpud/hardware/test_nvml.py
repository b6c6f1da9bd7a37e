"""NvmlSampler against a fake `pynvml` module (tests/unit/gpud/hardware/fake_nvml.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from gpud.hardware.nvml import NvmlSampler, NvmlUnavailable
from gpud.hardware.nvml_fields import clock_event_reasons, cuda_version, memory_temperature_c
from gpud.model.snapshot import GpuSample
from gpud.runs.placement.gpus import Gpu, choose, closeness_from
from tests.unit.gpud.hardware.fake_nvml import (
    DATACENTER_UNSUPPORTED,
    GIB,
    FakeGpu,
    FakeNvLink,
    FakeNvml,
    h100,
    rtx4090,
)

IDENTITY = {"index", "simulated", "name", "uuid", "pci_bus_id", "serial", "compute_capability"}
NOT_READINGS = IDENTITY | {"lost", "xid"}
CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE = pynvml.NVML_VOLATILE_ECC
AGGREGATE = pynvml.NVML_AGGREGATE_ECC


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


OpenSampler = Callable[[FakeNvml], NvmlSampler]


@pytest.fixture
def open_sampler(clock: FakeClock) -> Iterator[OpenSampler]:
    samplers: list[NvmlSampler] = []

    def open_(nvml: FakeNvml) -> NvmlSampler:
        sampler = NvmlSampler.open(nvml, clock=clock, process_name=lambda pid: f"proc-{pid}")
        samplers.append(sampler)
        return sampler

    yield open_
    for sampler in samplers:
        sampler.close()


def wait_until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def readings(sample: GpuSample) -> dict[str, object]:
    return {k: v for k, v in sample.model_dump().items() if k not in NOT_READINGS}


# -- field mapping ---------------------------------------------------------------------


def test_maps_every_field_with_unit_conversions(open_sampler: OpenSampler) -> None:
    gpu = h100(
        clock_reasons=pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        mig=1,
        ecc_errors={
            (CORRECTED, VOLATILE): 3,
            (UNCORRECTED, VOLATILE): 1,
            (CORRECTED, AGGREGATE): 30,
            (UNCORRECTED, AGGREGATE): 2,
        },
        remapped_rows=(5, 1, 1, 0),
        pcie_gen=4,
        pcie_width=8,
        pcie_replays=7,
        processes=[(4242, 3 * GIB), (4343, None), (4444, 2**64 - 1)],
    )
    gpu.nvlinks[2] = FakeNvLink(
        active=0,
        version=3,
        errors={
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 2,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 3,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 4,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 1,
        },
    )
    sampler = open_sampler(FakeNvml([gpu]))

    (s,) = sampler.sample()

    assert (s.index, s.simulated) == (0, False)
    assert s.name == "NVIDIA H100 80GB HBM3"
    assert s.uuid == "GPU-00000000-0000-0000-0000-000000000000"  # bytes from NVML
    assert s.pci_bus_id == "00000000:18:00.0"  # bytes from NVML
    assert s.serial == "1654321098765"
    assert s.compute_capability == (9, 0)
    assert (s.utilization_gpu_pct, s.utilization_memory_pct) == (87.0, 41.0)
    assert (s.memory_used_bytes, s.memory_total_bytes) == (30 * GIB, 80 * GIB)
    assert s.memory_reserved_bytes == 512 * 1024**2  # apart from used, as nvidia-smi shows
    assert s.temperature_c == 64
    assert s.memory_temperature_c == 71  # NVML_FI_DEV_MEMORY_TEMP, in the batched read
    assert s.power_w == pytest.approx(512.345)  # mW → W
    assert s.energy_mj == 987_654_321  # mJ, as NVML and DCGM count it
    assert (s.encoder_utilization_pct, s.decoder_utilization_pct) == (0.0, 12.0)
    assert s.power_limit_w == 700.0
    assert s.fan_pct is None  # an SXM board has no fan: not available, not 0
    assert (s.clock_sm_mhz, s.clock_sm_max_mhz) == (1755, 1980)
    assert (s.clock_mem_mhz, s.clock_mem_max_mhz) == (2619, 2619)
    assert s.clock_event_reasons == ["sw_power_cap", "hw_thermal_slowdown"]
    assert (s.persistence_mode, s.mig_mode, s.ecc_mode) == (True, True, True)
    assert (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile) == (3, 1)
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (30, 2)
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable) == (5, 1)
    assert (s.remapped_rows_pending, s.remapped_rows_failed) == (True, False)
    assert (s.pcie_link_gen, s.pcie_link_gen_max) == (4, 5)  # the GPU's own max, not the slot's
    assert (s.pcie_link_width, s.pcie_link_width_max) == (8, 16)
    assert s.pcie_replay_count == 7
    assert s.nvlinks is not None and len(s.nvlinks) == 18
    assert s.nvlinks[0].model_dump() == {
        "link": 0,
        "active": True,
        "version": 4,
        "tx_bytes_per_s": None,
        "rx_bytes_per_s": None,
        "crc_errors": 0,
        "replay_errors": 0,
        "recovery_errors": 0,
    }
    link2 = s.nvlinks[2]
    assert (link2.active, link2.version) == (False, 3)
    assert (link2.crc_errors, link2.replay_errors, link2.recovery_errors) == (5, 4, 1)
    assert s.processes is not None
    assert [(p.pid, p.name, p.used_memory_bytes) for p in s.processes] == [
        (4242, "proc-4242", 3 * GIB),
        (4343, "proc-4343", None),
        (4444, "proc-4444", None),  # NVML_VALUE_NOT_AVAILABLE
    ]
    assert s.xid.total == 0


def test_an_older_driver_without_v2_memory_info_counts_reserved_memory_as_used(
    open_sampler: OpenSampler,
) -> None:
    nvml = FakeNvml([FakeGpu(unsupported={"nvmlMemory_v2"})])
    sampler = open_sampler(nvml)
    for _ in range(3):
        (s,) = sampler.sample()
        assert s.memory_used_bytes == 30 * GIB + 512 * 1024**2  # v1: what the driver says
        assert s.memory_reserved_bytes is None
    # v2 is asked once (at open), then never again: v1 from then on.
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 2 + 3


def test_system_info(open_sampler: OpenSampler) -> None:
    info = open_sampler(FakeNvml([h100()], cuda_version=12040)).system_info()

    assert info.driver_version == "550.54.15"
    assert info.cuda_driver_version == "12.4"
    assert info.nvml_version == "12.550.54.15"


@pytest.mark.parametrize(
    ("value", "text"), [(12040, "12.4"), (11080, "11.8"), (12090, "12.9"), (13000, "13.0")]
)
def test_cuda_version(value: int, text: str) -> None:
    assert cuda_version(value) == text


def test_str_or_bytes_from_pynvml(open_sampler: OpenSampler) -> None:
    gpu = h100(name=b"NVIDIA A100-SXM4-80GB", bus_id=b"00000000:07:00.0")

    (s,) = open_sampler(FakeNvml([gpu])).sample()

    assert (s.name, s.pci_bus_id) == ("NVIDIA A100-SXM4-80GB", "00000000:07:00.0")


def test_consumer_gpu_unsupported_fields_are_none_not_zero(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    sampler = open_sampler(FakeNvml([rtx4090()]))
    sampler.sample()
    clock.advance(1)

    (s,) = sampler.sample()

    assert s.fan_pct == 45
    assert s.utilization_gpu_pct == 87.0
    assert s.nvlinks is None  # no NVLink is None, never []
    for name in (
        "serial",
        "mig_mode",
        "ecc_mode",
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failed",
        "sm_activity_pct",
        "sm_occupancy_pct",
        "tensor_activity_pct",
        "graphics_activity_pct",
        "dram_activity_pct",
        "memory_temperature_c",  # GDDR6X: no memory sensor NVML reads
    ):
        assert getattr(s, name) is None, name
    assert s.energy_mj == 987_654_321
    assert (s.encoder_utilization_pct, s.decoder_utilization_pct) == (0.0, 12.0)


def test_energy_and_video_engines_a_gpu_does_not_offer_are_none_not_zero(
    open_sampler: OpenSampler,
) -> None:
    unsupported = {
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
    }
    gpu = h100(unsupported=DATACENTER_UNSUPPORTED | unsupported, memory_temperature=None)
    (s,) = open_sampler(FakeNvml([gpu])).sample()

    assert s.energy_mj is None
    assert (s.encoder_utilization_pct, s.decoder_utilization_pct) == (None, None)
    assert s.memory_temperature_c is None  # that field alone; the batch's others still read
    assert s.temperature_c == 64 and s.power_w is not None


def test_memory_temperature_survives_the_r545_drivers_mislabelled_value_type(
    open_sampler: OpenSampler,
) -> None:
    # r545 marks the field a double but writes an unsigned int (NVIDIA bug 4300930):
    # read as a double it would be ~3.5e-322 °C.
    gpu = h100(memory_temperature_as_double=True)
    (s,) = open_sampler(FakeNvml([gpu])).sample()
    assert s.memory_temperature_c == 71


def test_memory_temperature_decoding() -> None:
    def value(kind: int, member: str, number: float, ok: bool = True) -> pynvml.c_nvmlFieldValue_t:
        v = pynvml.c_nvmlFieldValue_t()
        v.nvmlReturn = pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED
        v.valueType = kind
        setattr(v.value, member, number)
        return v

    double, uint = pynvml.NVML_VALUE_TYPE_DOUBLE, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert memory_temperature_c(value(uint, "uiVal", 66)) == 66.0
    assert memory_temperature_c(value(double, "dVal", 66.5)) == 66.5  # a real double
    assert memory_temperature_c(value(double, "uiVal", 66)) == 66.0  # r545's int
    assert memory_temperature_c(value(uint, "uiVal", 255)) is None  # no sensor reads that
    assert memory_temperature_c(value(uint, "uiVal", 66, ok=False)) is None
    assert memory_temperature_c(None) is None


def test_a_failed_field_values_call_loses_memory_temperature_and_falls_back_for_pcie(
    open_sampler: OpenSampler,
) -> None:
    gpu = h100(errors={"nvmlDeviceGetFieldValues": pynvml.NVML_ERROR_UNKNOWN},
               pcie_throughput_kb=(100, 250))  # fmt: skip
    (s,) = open_sampler(FakeNvml([gpu])).sample()

    assert s.memory_temperature_c is None
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (100 * 1024, 250 * 1024)
    assert s.temperature_c == 64


# -- rates from counters ---------------------------------------------------------------


def test_pcie_and_nvlink_rates_from_counter_deltas(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    gpu = h100(pcie_tx_bytes=1_000, pcie_rx_bytes=5_000)
    sampler = open_sampler(FakeNvml([gpu]))

    (first,) = sampler.sample()
    clock.advance(2.0)
    gpu.pcie_tx_bytes = 1_000 + 4_000_000
    gpu.pcie_rx_bytes = 5_000 + 1_000_000
    gpu.nvlinks[0].tx_kib += 2048
    gpu.nvlinks[0].rx_kib += 1024
    (second,) = sampler.sample()

    assert (first.pcie_tx_bytes_per_s, first.pcie_rx_bytes_per_s) == (None, None)
    assert first.nvlinks is not None and first.nvlinks[0].tx_bytes_per_s is None
    assert (second.pcie_tx_bytes_per_s, second.pcie_rx_bytes_per_s) == (2_000_000, 500_000)
    assert second.nvlinks is not None
    assert second.nvlinks[0].tx_bytes_per_s == 1024 * 1024  # 2048 KiB over 2 s
    assert second.nvlinks[0].rx_bytes_per_s == 512 * 1024
    assert second.nvlinks[1].tx_bytes_per_s == 0.0


def test_counter_that_goes_backwards_has_no_rate(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    gpu = h100(pcie_tx_bytes=10_000)
    sampler = open_sampler(FakeNvml([gpu]))
    sampler.sample()
    clock.advance(1.0)
    gpu.pcie_tx_bytes = 50  # reset by a driver reload

    (s,) = sampler.sample()

    assert s.pcie_tx_bytes_per_s is None


def test_pcie_throughput_falls_back_and_is_cached(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    gpu = rtx4090(pcie_tx_bytes=None, pcie_rx_bytes=None, pcie_throughput_kb=(100, 250))
    nvml = FakeNvml([gpu])
    sampler = open_sampler(nvml)

    (first,) = sampler.sample()
    clock.advance(4.0)
    gpu.pcie_throughput_kb = (1, 1)
    (cached,) = sampler.sample()
    calls_within_ttl = nvml.calls["nvmlDeviceGetPcieThroughput"]
    clock.advance(1.0)
    (fresh,) = sampler.sample()

    assert (first.pcie_tx_bytes_per_s, first.pcie_rx_bytes_per_s) == (100 * 1024, 250 * 1024)
    assert cached.pcie_tx_bytes_per_s == 100 * 1024
    assert calls_within_ttl == 2  # one TX and one RX read for two samples
    assert fresh.pcie_tx_bytes_per_s == 1024
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 4


def test_counters_are_preferred_over_blocking_throughput(open_sampler: OpenSampler) -> None:
    nvml = FakeNvml([h100()])
    sampler = open_sampler(nvml)
    sampler.sample()
    sampler.sample()

    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 2  # one batched call per GPU and sample


# -- GPM -------------------------------------------------------------------------------


def test_gpm_metrics_none_first_then_between_samples(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    sampler = open_sampler(FakeNvml([h100()]))

    (first,) = sampler.sample()
    clock.advance(1.0)
    (second,) = sampler.sample()
    clock.advance(1.0)
    (third,) = sampler.sample()

    assert (first.sm_activity_pct, first.sm_occupancy_pct, first.tensor_activity_pct) == (
        None,
        None,
        None,
    )
    assert (first.graphics_activity_pct, first.dram_activity_pct) == (None, None)
    for s in (second, third):
        assert (s.sm_activity_pct, s.sm_occupancy_pct, s.tensor_activity_pct) == (
            71.5,
            33.25,
            48.0,
        )
        assert (s.graphics_activity_pct, s.dram_activity_pct) == (93.5, 27.75)


def test_gpm_metric_the_gpu_does_not_offer_is_none(open_sampler: OpenSampler) -> None:
    gpu = h100(gpm={pynvml.NVML_GPM_METRIC_SM_UTIL: 12.0})
    sampler = open_sampler(FakeNvml([gpu]))
    sampler.sample()

    (s,) = sampler.sample()

    assert (s.sm_activity_pct, s.sm_occupancy_pct, s.tensor_activity_pct) == (12.0, None, None)
    assert (s.graphics_activity_pct, s.dram_activity_pct) == (None, None)


# -- clock-event reasons ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, []),
        (pynvml.nvmlClocksEventReasonGpuIdle, ["gpu_idle"]),
        (
            pynvml.nvmlClocksEventReasonApplicationsClocksSetting
            | pynvml.nvmlClocksEventReasonSyncBoost
            | pynvml.nvmlClocksEventReasonDisplayClockSetting,
            ["applications_clocks_setting", "sync_boost", "display_clock_setting"],
        ),
        (
            pynvml.nvmlClocksEventReasonHwSlowdown
            | pynvml.nvmlClocksEventReasonSwThermalSlowdown
            | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
            ["hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"],
        ),
        (pynvml.nvmlClocksEventReasonSwPowerCap | 0x1000, ["sw_power_cap", "unknown_0x1000"]),
    ],
)
def test_clock_event_reasons_decoding(mask: int, names: list[str]) -> None:
    assert clock_event_reasons(mask) == names


def test_clock_reasons_fall_back_to_the_throttle_function(open_sampler: OpenSampler) -> None:
    gpu = h100(
        clock_reasons=pynvml.nvmlClocksEventReasonGpuIdle,
        errors={"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND},
    )

    (s,) = open_sampler(FakeNvml([gpu])).sample()

    assert s.clock_event_reasons == ["gpu_idle"]


# -- caching ---------------------------------------------------------------------------


def test_health_is_cached_for_its_ttl_but_utilization_is_read_every_sample(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    gpu = h100(ecc_errors={(CORRECTED, VOLATILE): 1})
    nvml = FakeNvml([gpu])
    sampler = open_sampler(nvml)
    (first,) = sampler.sample()
    ecc_reads = nvml.calls["nvmlDeviceGetTotalEccErrors"]
    nvlink_reads = nvml.calls["nvmlDeviceGetNvLinkErrorCounter"]

    gpu.ecc_errors[(CORRECTED, VOLATILE)] = 2
    gpu.utilization = (12, 3)
    clock.advance(4.9)
    (within_ttl,) = sampler.sample()

    assert within_ttl.ecc_corrected_volatile == 1
    assert within_ttl.utilization_gpu_pct == 12.0
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == ecc_reads
    assert nvml.calls["nvmlDeviceGetNvLinkErrorCounter"] == nvlink_reads
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 2

    clock.advance(0.2)
    (after_ttl,) = sampler.sample()

    assert after_ttl.ecc_corrected_volatile == 2
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 2 * ecc_reads
    assert first.ecc_corrected_volatile == 1


def test_static_facts_are_read_once_and_power_limit_every_30_s(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    gpu = h100()
    nvml = FakeNvml([gpu])
    sampler = open_sampler(nvml)
    for _ in range(3):
        sampler.sample()
        clock.advance(10.0)
    gpu.power_limit_mw = 500_000

    (s,) = sampler.sample()

    assert nvml.calls["nvmlDeviceGetMaxClockInfo"] == 2  # SM and memory, at open
    assert nvml.calls["nvmlDeviceGetCudaComputeCapability"] == 1
    assert nvml.calls["nvmlDeviceGetEnforcedPowerLimit"] == 2  # at t=0 and t=30
    assert s.power_limit_w == 500.0


# -- XID events ------------------------------------------------------------------------


def test_xid_events_are_counted_with_recent_codes_and_acknowledged(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    nvml = FakeNvml([h100(0), h100(1)])
    sampler = open_sampler(nvml)
    t0 = clock.now

    nvml.inject_xid(1, 79)
    wait_until(lambda: sampler.sample()[1].xid.total == 1)
    clock.advance(5.0)
    nvml.inject_xid(1, 48)
    nvml.inject_xid(1, 79)
    wait_until(lambda: sampler.sample()[1].xid.total == 3)
    xid = sampler.sample()[1].xid

    assert xid.counts == {79: 2, 48: 1}
    assert [(r.code, r.time) for r in xid.recent] == [(79, t0), (48, t0 + 5), (79, t0 + 5)]
    assert xid.unacknowledged == 3
    assert sampler.sample()[0].xid.total == 0

    assert sampler.acknowledge_xids(1) == 3
    after = sampler.sample()[1].xid
    assert (after.total, after.counts, after.unacknowledged) == (3, {79: 2, 48: 1}, 0)
    assert sampler.acknowledge_xids(None) == 0


def test_xid_from_a_gpu_that_fell_off_the_bus_is_still_counted(
    open_sampler: OpenSampler,
) -> None:
    gpus = [h100(0), h100(1)]
    nvml = FakeNvml(gpus)
    sampler = open_sampler(nvml)
    gpus[1].lost = True  # it no longer answers anything, not even its uuid

    nvml.inject_xid(1, 79)

    wait_until(lambda: sampler.sample()[1].xid.total == 1)
    lost = sampler.sample()[1]
    assert lost.lost and lost.xid.counts == {79: 1}


def test_gpu_that_refuses_xid_registration_is_skipped(open_sampler: OpenSampler) -> None:
    gpus = [h100(0, unsupported={"nvmlDeviceRegisterEvents"}), h100(1)]
    nvml = FakeNvml(gpus)
    sampler = open_sampler(nvml)

    nvml.inject_xid(1, 31)

    wait_until(lambda: sampler.sample()[1].xid.total == 1)


def test_no_event_api_means_no_thread_and_sampling_still_works(
    open_sampler: OpenSampler,
) -> None:
    sampler = open_sampler(FakeNvml([h100()], events_supported=False))

    (s,) = sampler.sample()

    assert not [t for t in threading.enumerate() if t.name == "gpud-nvml-xid"]
    assert s.xid.total == 0 and s.utilization_gpu_pct == 87.0


def test_close_stops_the_xid_thread_and_releases_nvml(clock: FakeClock) -> None:
    nvml = FakeNvml([h100()])
    sampler = NvmlSampler.open(nvml, clock=clock)
    (thread,) = [t for t in threading.enumerate() if t.name == "gpud-nvml-xid"]
    sampler.sample()
    assert thread.is_alive() and nvml.live_gpm_samples == 2

    sampler.close()
    sampler.close()

    assert not thread.is_alive()
    assert nvml.live_gpm_samples == 0
    assert nvml.calls["nvmlEventSetFree"] == 1
    assert not nvml.initialized


# -- errors and lost GPUs --------------------------------------------------------------


def test_lost_gpu_keeps_identity_reads_all_none_and_is_not_asked_again(
    open_sampler: OpenSampler, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [h100(0), h100(1)]
    sampler = open_sampler(FakeNvml(gpus))
    sampler.sample()

    gpus[1].lost = True
    with caplog.at_level(logging.ERROR, logger="gpud.nvml"):
        healthy, lost = sampler.sample()
        calls = gpus[1].calls
        sampler.sample()

    assert (healthy.lost, healthy.utilization_gpu_pct) == (False, 87.0)
    assert lost.lost
    assert (lost.uuid, lost.pci_bus_id) == (gpus[1].uuid, "00000000:19:00.0")
    assert all(value is None for value in readings(lost).values()), readings(lost)
    assert gpus[1].calls == calls
    assert [r.getMessage() for r in caplog.records].count(
        f"GPU 1 ({gpus[1].uuid}) is lost (nvmlDeviceGetUtilizationRates failed)"
    ) == 1


def test_gpu_lost_before_open_is_reported_lost(open_sampler: OpenSampler) -> None:
    gpus = [h100(0), h100(1, lost=True)]

    _, lost = open_sampler(FakeNvml(gpus)).sample()

    assert (lost.index, lost.uuid, lost.lost) == (1, "unknown-1", True)
    assert all(value is None for value in readings(lost).values())


def test_unexpected_error_is_none_and_logged_once(
    open_sampler: OpenSampler, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = h100(errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN})
    sampler = open_sampler(FakeNvml([gpu]))

    with caplog.at_level(logging.WARNING, logger="gpud.nvml"):
        samples = [sampler.sample()[0] for _ in range(3)]

    assert [s.temperature_c for s in samples] == [None, None, None]
    assert [s.power_w for s in samples] == [pytest.approx(512.345)] * 3
    warnings = [r for r in caplog.records if "nvmlDeviceGetTemperature" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_processes_from_a_driver_without_the_v3_call(open_sampler: OpenSampler) -> None:
    gpu = h100(
        processes=[(77, GIB)],
        errors={"nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND},
    )

    (s,) = open_sampler(FakeNvml([gpu])).sample()

    assert s.processes is not None
    assert [(p.pid, p.name, p.used_memory_bytes) for p in s.processes] == [(77, "proc-77", GIB)]


def test_gpu_without_processes_has_an_empty_list(open_sampler: OpenSampler) -> None:
    (s,) = open_sampler(FakeNvml([h100()])).sample()

    assert s.processes == []


def test_unsupported_fields_are_not_logged_as_warnings(
    open_sampler: OpenSampler, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpud.nvml"):
        open_sampler(FakeNvml([rtx4090()])).sample()

    assert caplog.records == []


# -- opening ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found (no NVIDIA driver?)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA kernel driver is not loaded"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to initialise: Unknown Error"),
    ],
)
def test_open_says_why_nvml_is_unavailable(error: int, message: str) -> None:
    with pytest.raises(NvmlUnavailable) as raised:
        NvmlSampler.open(FakeNvml([], init_error=error))

    assert str(raised.value) == message


def test_open_with_no_gpus_is_unavailable_and_shuts_nvml_down() -> None:
    nvml = FakeNvml([])

    with pytest.raises(NvmlUnavailable, match="NVML found no GPUs"):
        NvmlSampler.open(nvml)

    assert not nvml.initialized


def test_gpu_count(open_sampler: OpenSampler) -> None:
    assert open_sampler(FakeNvml([h100(0), h100(1), FakeGpu()])).gpu_count() == 3


def test_topology_is_read_once_and_a_count_of_gpus_is_leased_close_together(
    open_sampler: OpenSampler,
) -> None:
    # Two PCIe switches, GPUs 0+2 on one and 1+3 on the other; the host bridge between.
    single, bridge = pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    levels = {(0, 1): bridge, (0, 2): single, (0, 3): bridge, (1, 2): bridge, (1, 3): single}
    levels[(2, 3)] = bridge

    def two_of(nvml: FakeNvml) -> list[int]:
        samples = open_sampler(nvml).sample()
        gpus = [Gpu(s.index, s.uuid) for s in samples]
        closeness = closeness_from({s.index: s.peer_distance for s in samples})
        return [g.index for g in choose(2, "auto", gpus, {}, closeness)]

    pcie = FakeNvml([h100() for _ in range(4)], topology=levels)
    assert two_of(pcie) == [0, 2]
    assert pcie.calls["nvmlDeviceGetTopologyCommonAncestor"] == 12  # at open, not per sample
    nvlink = FakeNvml([h100() for _ in range(4)], topology=levels, nvlink_pairs=frozenset({(1, 3)}))
    assert two_of(nvlink) == [1, 3]
    nvlink_samples = open_sampler(
        FakeNvml([h100() for _ in range(4)], topology=levels, nvlink_pairs=frozenset({(1, 3)}))
    ).sample()
    assert nvlink_samples[1].peer_distance == {0: bridge, 2: bridge, 3: 0}
    unknown = FakeNvml([h100() for _ in range(4)])  # no topology: the lowest free indices
    assert two_of(unknown) == [0, 1]


# -- what a sample costs ---------------------------------------------------------------


def test_the_costly_reads_come_every_30_s_and_an_unsupported_one_only_once(
    open_sampler: OpenSampler, clock: FakeClock
) -> None:
    """On an H100 the energy counter (4.1 ms) and GPM's graphics activity (1.6 ms) were 5.7
    of a sample's 7.3 ms of CPU, and a fan the board does not have cost 0.17 ms to be told
    so again each second (docs/verified-on-gpu.md, 2026-11-27)."""
    gpu = h100()
    nvml = FakeNvml([gpu])
    sampler = open_sampler(nvml)
    samples = []
    assert gpu.gpm is not None
    for _ in range(10):
        samples.append(sampler.sample()[0])
        gpu.gpm[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL] += 1.0  # it moves every second
        gpu.energy_mj += 1000
        clock.advance(1.0)
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert {s.energy_mj for s in samples} == {samples[0].energy_mj}  # the last reading
    assert nvml.calls["nvmlDeviceGetFanSpeed"] == 1
    assert all(s.fan_pct is None for s in samples)
    graphics = [s.graphics_activity_pct for s in samples[1:]]
    assert len(set(graphics)) == 1 and graphics[0] is not None, graphics
    assert len({s.sm_activity_pct for s in samples[1:]}) == 1  # the cheap ones each time
    clock.advance(30.0)
    later = sampler.sample()[0]
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2
    first_energy = samples[0].energy_mj
    assert first_energy is not None and later.energy_mj == first_energy + 10_000
    assert later.graphics_activity_pct is not None and later.graphics_activity_pct > graphics[0]
