"""gpud renders the text format itself, for speed; it must write exactly what
prometheus-client's `generate_latest` writes for the same families."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpud.prometheus.endpoint import render

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


class Fixed(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from families()


def test_render_writes_the_same_bytes_as_generate_latest() -> None:
    registry = CollectorRegistry()
    registry.register(Fixed())
    assert render(families()) == generate_latest(registry)
