"""A real `gpud serve --metrics` with simulated GPUs, scraped over HTTP and checked against
dcgm-exporter's default counters (issue 24 §4): each field it exports by default is in the
scrape under its name and type, the driver version is its label on every GPU series, and
the counters count (tests/support/dcgm_exporter.py; the NVML side is
tests/unit/gpud/test_dcgm_parity.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.integration.test_prometheus import scrape
from tests.support.daemons import RunningDaemon, free_port
from tests.support.dcgm_exporter import Scrape, parity_problems
from tests.support.waiting import until

Daemons = Callable[..., RunningDaemon]


def values(text: str, name: str) -> dict[str, float]:
    """GPU index → value of `name` in a scrape."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            gpu = line.split('gpu="', 1)[1].split('"', 1)[0]
            found[gpu] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_daemons_scrape_has_dcgm_exporters_default_fields_names_and_types(
    daemons: Daemons,
) -> None:
    port = free_port()
    daemons(simulate_gpus=2, extra=("--metrics", f"127.0.0.1:{port}"))
    url = f"http://127.0.0.1:{port}/metrics"

    def with_gpus() -> str | None:
        text = scrape(url)
        return text if "DCGM_" in text else None

    first = until("a scrape with GPUs", with_gpus, timeout=30)

    assert parity_problems(first) == []
    found = Scrape.parse(first)
    gpu_series = [labels for name, each in found.samples.items() if name.startswith("DCGM_")
                  for labels in each]  # fmt: skip
    assert {labels["DCGM_FI_DRIVER_VERSION"] for labels in gpu_series} == {"simulated"}
    assert {labels["simulated"] for labels in gpu_series} == {"true"}
    # Plausible simulated values in dcgm-exporter's units, and the counters count.
    for gpu in ("0", "1"):
        assert 25 < values(first, "DCGM_FI_DEV_MEMORY_TEMP")[gpu] < 95
        assert 0 <= values(first, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")[gpu] <= 1
        assert 0 <= values(first, "DCGM_FI_PROF_DRAM_ACTIVE")[gpu] <= 1
        assert values(first, "DCGM_FI_DEV_ENC_UTIL")[gpu] == 0.0
        assert values(first, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")[gpu] >= 0
    energy = values(first, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    since = time.monotonic()

    def grown_on_both() -> dict[str, float] | None:
        now = values(scrape(url), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        return now if all(now[gpu] - energy[gpu] > 50_000 for gpu in ("0", "1")) else None

    # An idle simulated H100 draws 70-80 W: 50,000 mJ within a second or two (30 s would
    # be under 2 W), and far below what its 700 W limit would allow over the time waited.
    grown = until("50,000 mJ more on each GPU", grown_on_both, timeout=30)
    took = time.monotonic() - since
    for gpu in ("0", "1"):
        assert grown[gpu] - energy[gpu] < 700 * 1000 * (took + 2), (energy, grown)
