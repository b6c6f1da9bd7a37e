"""The NVML sampler's scrape against dcgm-exporter's default counters (issue 24 §4): every
field dcgm-exporter exports by default, under its name and type, from the real sampler,
node sampler, series and renderer over NVML faked at its lowest layer
(tests/support/dcgm_exporter.py has the check; tests/integration/test_dcgm_parity.py
runs it against a real daemon)."""

from __future__ import annotations

import pytest

from gpud.hardware.host import HostSampler
from gpud.hardware.node import NodeSampler
from gpud.hardware.nvml import NvmlSampler
from gpud.prometheus.endpoint import render
from gpud.prometheus.series import gpu_families
from tests.support.dcgm_exporter import Scrape, csv_fields, dcgm_types, parity_problems
from tests.unit.gpud.hardware.fake_nvml import FakeGpu, FakeNvml, h100, rtx4090


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def scrape(gpus: list[FakeGpu]) -> str:
    """/metrics as the daemon renders it, after two samples a second apart (rates and GPM
    need two), with every counter moved on in between."""
    clock = Clock()
    sampler = NvmlSampler.open(FakeNvml(gpus), clock=clock, process_name=lambda pid: None)
    node = NodeSampler("n0", sampler, HostSampler(), interval_s=1.0, clock=clock)
    try:
        node.sample()
        clock.now += 1.0
        for gpu in gpus:
            gpu.energy_mj += 500_000  # 500 W for a second
            for link in gpu.nvlinks:
                link.tx_kib += 1_000_000
                link.rx_kib += 3_000_000
            if gpu.pcie_tx_bytes is not None and gpu.pcie_rx_bytes is not None:
                gpu.pcie_tx_bytes += 10**6
                gpu.pcie_rx_bytes += 10**6
        snapshot = node.sample()
    finally:
        sampler.close()
    return render(gpu_families(snapshot, [])).decode()


def test_the_csv_copies_are_read_whole() -> None:
    enabled = {row.name for row in csv_fields() if row.enabled}
    # 26 fields enabled in each file, the same 26; the rest commented out.
    assert len(enabled) == 26 and len([row for row in csv_fields() if row.enabled]) == 52
    types = dcgm_types()
    assert types["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert types["DCGM_FI_DRIVER_VERSION"] == "label"
    assert types["DCGM_FI_PROF_PCIE_TX_BYTES"] == "gauge"  # the enabled row, not the comment
    assert types["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "counter"  # commented out: still typed


def test_an_h100s_scrape_has_every_default_field_under_dcgm_exporters_name_and_type() -> None:
    text = scrape([h100(0), h100(1)])

    assert parity_problems(text) == []

    def value(name: str) -> float:
        """GPU 0's value of `name`."""
        line = next(x for x in text.splitlines() if x.startswith(name + "{") and 'gpu="0"' in x)
        return float(line.rsplit(" ", 1)[1])

    # The new fields, with NVML's values in dcgm-exporter's units.

    assert value("DCGM_FI_DEV_MEMORY_TEMP") == 71.0
    # mJ; read every 30 s (4 ms of CPU a read on an H100): still the first reading
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 987_654_321
    assert (value("DCGM_FI_DEV_ENC_UTIL"), value("DCGM_FI_DEV_DEC_UTIL")) == (0.0, 12.0)
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0.935
    assert value("DCGM_FI_PROF_DRAM_ACTIVE") == 0.2775
    # DCGM's arithmetic: (TX + RX KiB over all 18 links) per second / 1000.
    assert value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == pytest.approx(18 * 4_000_000 / 1000)
    utilization = Scrape.parse(text).samples["DCGM_FI_DEV_GPU_UTIL"]
    assert {labels["DCGM_FI_DRIVER_VERSION"] for labels in utilization} == {"550.54.15"}


def test_a_geforce_cards_missing_fields_are_absent_never_zero() -> None:
    text = scrape([rtx4090()])

    lacks = {
        "DCGM_FI_DEV_MEMORY_TEMP": "GDDR6X: no memory temperature",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "no NVLink",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "no GPM before Hopper",
        "DCGM_FI_PROF_DRAM_ACTIVE": "no GPM before Hopper",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "no GPM before Hopper",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "no row remapping",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "no row remapping",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "no row remapping",
    }
    assert parity_problems(text, absent=lacks) == []
    for name in lacks:
        assert name not in text


def test_the_check_finds_a_type_a_field_and_a_label_gone_astray() -> None:
    text = scrape([h100()])
    drifted = (
        text.replace("# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter",
                     "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER gauge")
        .replace('DCGM_FI_DRIVER_VERSION="550.54.15",', "")
    )  # fmt: skip
    kept = "\n".join(x for x in drifted.splitlines() if "DCGM_FI_DEV_MEMORY_TEMP" not in x)
    series = sum(len(v) for k, v in Scrape.parse(kept).samples.items() if k.startswith("DCGM_"))

    assert sorted(parity_problems(kept)) == [
        "DCGM_FI_DEV_MEMORY_TEMP: dcgm-exporter exports it by default; gpud does not",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER: gauge, dcgm-exporter's is counter",
        f"DCGM_FI_DRIVER_VERSION: not a label on {series} GPU series",
    ]
    assert parity_problems(text, absent={"DCGM_FI_DEV_MEMORY_TEMP": "?"}) == [
        "DCGM_FI_DEV_MEMORY_TEMP: exported, yet listed as left out"
    ]
