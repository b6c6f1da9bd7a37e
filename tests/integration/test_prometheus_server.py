"""A real Prometheus (Debian's `prometheus`) scrapes a real daemon with simulated GPUs and
a running CPU run; queries through its HTTP API find what dashboards need (issue 11).
Skipped, with the reason, where the binary is absent; `.ci/run` installs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemons import RunningDaemon, free_port
from tests.support.runs import FAST, force_stop, launch, wait_for_step

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus binary is not installed (Debian: apt-get install prometheus)",
)
Daemons = Callable[..., RunningDaemon]


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                found = self.query(promql)
            except OSError:
                found = []
            if len(found) >= count:
                return found
            time.sleep(0.5)
        raise AssertionError(f"{promql}: {len(found)} series, wanted {count}: {found}")


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[int], Prometheus]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(target_port: int) -> Prometheus:
        assert PROMETHEUS is not None
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpud\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
        )
        port = free_port()
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
        )  # fmt: skip
        started.append(proc)
        return Prometheus(f"http://127.0.0.1:{port}")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_real_prometheus_finds_gpus_runs_and_the_ranks_on_them(
    daemons: Daemons, prometheus_for: Callable[[int], Prometheus]
) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=4, extra=("--metrics", f"127.0.0.1:{port}"))
    run_id = launch(daemon, FAST, "training.max_steps=100000", "gpus=[0, 3]")
    try:
        wait_for_step(daemon, run_id, 3)
        prometheus = prometheus_for(port)
        util = prometheus.wait_for("DCGM_FI_DEV_GPU_UTIL", 4)
        for series in util:
            labels = series["metric"]
            assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)
            assert labels["simulated"] == "true"
        ranks = prometheus.wait_for(f'DCGM_FI_DEV_FB_USED{{run="{run_id}"}}', 2)
        assert {(s["metric"]["gpu"], s["metric"]["rank"]) for s in ranks} == {
            ("0", "0"),
            ("3", "1"),
        }
        loss = prometheus.wait_for(f'gpud_run_metric{{metric="loss",run="{run_id}"}}', 1)
        assert 0 < float(loss[0]["value"][1]) < 10
        running = prometheus.wait_for(f'gpud_run_state{{run="{run_id}",state="running"}} == 1', 1)
        assert running[0]["metric"]["name"] == "cpu-ddp"
        free = prometheus.query('DCGM_FI_DEV_GPU_UTIL{run=""}')  # GPUs 1 and 2: no run label
        assert sorted(s["metric"]["gpu"] for s in free) == ["1", "2"]
    finally:
        force_stop(daemon, run_id)
