"""gpud renders the text format itself, for speed; it must write exactly what
prometheus-client's `generate_latest` writes for the same families, and dcgm-exporter's
counters as dcgm-exporter writes them."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpud.prometheus.endpoint import render
from gpud.prometheus.series import DcgmCounterFamily

VALUES = [0.0, 1.0, -2.5, 0.1, 1e-05, 123456.789, 999999.0, 1e6, 81559.0, 1.5e7, 2.0**53,
          -1e7, math.inf, -math.inf, math.nan, 3]  # fmt: skip


def families() -> list[Metric]:
    gauge = GaugeMetricFamily(
        "g_value", 'help with \\ and\nnewline "quoted"', labels=["gpu", "UUID"]
    )
    for i, value in enumerate(VALUES):
        gauge.add_metric([str(i), 'a"b\\c\nd' if i % 2 else ""], value)
    counter = CounterMetricFamily("c_events", "counted", labels=["method"])
    counter.add_metric(["run.stop"], 7)
    plain = GaugeMetricFamily("no_labels", "none")
    plain.add_metric([], 0.25)
    return [gauge, counter, plain]


class FixedFamilies(Collector):
    def __init__(self, fixed: list[Metric]) -> None:
        self.fixed = fixed

    def collect(self) -> Iterator[Metric]:
        yield from self.fixed


def test_render_writes_the_same_bytes_as_generate_latest() -> None:
    registry = CollectorRegistry()
    registry.register(FixedFamilies(families()))
    assert render(families()) == generate_latest(registry)


def test_a_dcgm_counter_keeps_its_name_as_dcgm_exporter_writes_it() -> None:
    # What dcgm-exporter's template writes for a field its CSV types `counter`: the name
    # as it is on the TYPE line and the samples, no `_total`, which generate_latest cannot.
    replays = DcgmCounterFamily(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", ["gpu", "UUID"]
    )
    replays.add_metric(["0", "GPU-1"], 3)
    assert render([replays]).decode() == (
        "# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.\n"
        "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n"
        'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{UUID="GPU-1",gpu="0"} 3.0\n'
    )
    (parsed,) = text_string_to_metric_families(render([replays]).decode())
    assert (parsed.name, parsed.type, parsed.samples[0].value) == (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 3.0,
    )  # fmt: skip


def test_a_dcgm_counter_named_total_is_what_prometheus_client_writes() -> None:
    ours = DcgmCounterFamily("gpud_nvlink_crc_errors_total", "CRC errors.", ["gpu"])
    theirs = CounterMetricFamily("gpud_nvlink_crc_errors", "CRC errors.", labels=["gpu"])
    for family in (ours, theirs):
        family.add_metric(["0"], 12)
    registry = CollectorRegistry()
    registry.register(FixedFamilies([theirs]))
    assert render([ours]) == generate_latest(registry)
