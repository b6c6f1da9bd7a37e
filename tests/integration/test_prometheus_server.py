"""A real Prometheus (Debian's `prometheus`) scrapes a real daemon with simulated GPUs and
a running CPU run; queries through its HTTP API find what dashboards need (issue 11).
Skipped, with the reason, where the binary is absent; `.ci/run` installs it."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpud.efficiency.goodput import Bucket
from gpud.prometheus.series import FIELDS
from tests.support.alert_rules import NOT_YET_EXPORTED, RULES, rules
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.dcgm_exporter import dcgm_types
from tests.support.runs import FAST, force_stop, launch, script_spec, wait_for, wait_for_step
from tests.support.waiting import until

DASHBOARD = Path(__file__).parents[2] / "config" / "grafana" / "gpud.json"
#: What issues 11 and 24 ask the dashboard to show: the fleet, errors, runs.
PANELS_WANTED = (
    "utilization", "SM activity", "memory", "Power", "Temperature",
    "Graphics engine and DRAM", "NVLink bandwidth", "Video", "Energy", "driver version",
    "XID", "ECC", "Row remapping", "NVLink", "PCIe",
    "Loss", "Throughput", "Step time per rank", "Health verdict", "Straggler", "stalled",
    "bandwidth", "MFU", "Achieved FLOP/s", "Goodput", "Wall time by bucket",
)  # fmt: skip
#: Series a run on simulated GPUs never has (MFU is n/a there, and absent, never 0);
#: tests/unit/config/test_grafana_dashboard.py renders them for a run on a real GPU.
REAL_GPU_ONLY = ("gpud_run_mfu",)
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

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def metadata(self) -> dict[str, str]:
        """Each metric's type as Prometheus read it from the scrapes."""
        with urllib.request.urlopen(f"{self.url}/api/v1/metadata", timeout=10) as reply:
            body = json.loads(reply.read())
        return {name: entries[0]["type"] for name, entries in body["data"].items()}

    def label_values(self, label: str, match: str) -> list[str]:
        query = urllib.parse.urlencode({"match[]": match})
        url = f"{self.url}/api/v1/label/{label}/values?{query}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return list(json.loads(reply.read())["data"])

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
def prometheus_for(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(target_port: int, rules: Path | None = None) -> Prometheus:
        assert PROMETHEUS is not None
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            + (f"rule_files: ['{rules}']\n" if rules is not None else "")
            + "scrape_configs:\n"
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
        # Prometheus reads dcgm-exporter's types, counters included, under its names.
        types, dcgm = prometheus.metadata(), dcgm_types()
        typed = {f.name for f in FIELDS} & set(dcgm)
        assert len(typed) >= 30, typed
        for name in typed:
            assert types.get(name) == dcgm[name], (name, types.get(name))
        versions = prometheus.label_values("DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_GPU_UTIL")
        assert versions == ["simulated"]
    finally:
        force_stop(daemon, run_id)


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends for "All" in every variable, and its interval macros."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    expr = expr.replace("$__range", "5m")
    return re.sub(r"\$\{?(Hostname|run)\}?", ".*", expr)


def test_every_dashboard_panel_finds_data_in_a_real_prometheus(
    daemons: Daemons, prometheus_for: Callable[[int], Prometheus]
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = " ".join(p["title"] for p in panels)
    for wanted in PANELS_WANTED:
        assert wanted in titles, f"no panel for {wanted}"
    heatmaps = [p["title"] for p in panels if p["type"] == "heatmap"]
    assert len(heatmaps) == 2, heatmaps  # utilization and SM activity, by host and GPU
    port = free_port()
    daemon = daemons(simulate_gpus=4, extra=("--metrics", f"127.0.0.1:{port}"))
    run_id = launch(daemon, FAST, "training.max_steps=100000", "gpus=[0, 3]",
                    "training.seq_len=256")  # fmt: skip
    try:
        wait_for_step(daemon, run_id, 3)
        prometheus = prometheus_for(port)
        prometheus.wait_for(f'gpud_rank_step_time_seconds{{run="{run_id}"}}', 2)
        time.sleep(3)  # a few scrapes, for the panels that take a rate
        for variable in dashboard["templating"]["list"]:
            if variable["type"] != "query":
                continue
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
            assert found, variable["definition"]
            values = prometheus.label_values(found[2], found[1])
            assert values, f"variable {variable['name']} lists nothing"
        assert run_id in prometheus.label_values("run", "gpud_run_state")
        empty: list[str] = []
        n_a: list[dict[str, Any]] = []
        for panel in panels:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                data = prometheus.query(grafana_to_promql(target["expr"]))
                if any(name in target["expr"] for name in REAL_GPU_ONLY):
                    n_a += data
                elif not data:
                    empty.append(f"{panel['title']}: {target['expr']}")
        assert not empty, "panels with no data:\n" + "\n".join(empty)
        assert not n_a, n_a  # the run's GPUs are simulated: no MFU, not an MFU of 0
        # The run's panels show this run, with numbers that make sense.
        tokens = prometheus.query(f'gpud_run_tokens_per_second{{run="{run_id}"}}')
        samples = prometheus.query(f'gpud_run_samples_per_second{{run="{run_id}"}}')
        ratio = float(tokens[0]["value"][1]) / float(samples[0]["value"][1])
        assert abs(ratio - 256) < 1e-6 and float(samples[0]["value"][1]) > 0
        verdict = prometheus.query(grafana_to_promql(
            next(p for p in panels if p["title"] == "Health verdict")["targets"][0]["expr"]
        ))  # fmt: skip
        assert {v["metric"]["run"] for v in verdict} == {run_id}
        assert float(verdict[0]["value"][1]) in {0.0, 1.0, 2.0}  # ok, idle or degraded
        # The wall time panel: this run's buckets, each a share of its wall time.
        buckets = prometheus.query(grafana_to_promql(
            next(p for p in panels if p["title"] == "Wall time by bucket")["targets"][0]["expr"]
        ))  # fmt: skip
        assert {b["metric"]["run"] for b in buckets} == {run_id}
        shares = {b["metric"]["bucket"]: float(b["value"][1]) for b in buckets}
        # rate() would read seconds moved out of training (a save's) as a counter reset.
        assert len(shares) == len(Bucket) and 0.8 < sum(shares.values()) < 1.2, shares
        assert shares["training"] > 0.5, shares
    finally:
        force_stop(daemon, run_id)


#: gpud's /metrics on a real H100 80GB HBM3 (PCIe, in a VM: no NVLink, no fan), with a
#: running NCCL run on it, 2026-11-24 (docs/verified-on-gpu.md).
H100_SCRAPE = Path(__file__).parent / "data" / "h100-metrics.txt"
#: What that GPU does not offer, so gpud leaves out (never 0).
H100_ABSENT = ("NVLINK", "nvlink", "FAN_SPEED")
#: What gpud did not read yet when that scrape was recorded (issue 24 §4 added them); the
#: next GPU session records a new one (docs/verified-on-gpu.md).
NOT_RECORDED = (
    "MEMORY_TEMP", "TOTAL_ENERGY_CONSUMPTION", "ENC_UTIL", "DEC_UTIL", "GR_ENGINE_ACTIVE",
    "DRAM_ACTIVE", "DCGM_FI_DRIVER_VERSION",
)  # fmt: skip


@pytest.fixture
def recorded_scrape() -> Iterator[int]:
    """An HTTP server that answers every GET with the recorded H100 scrape."""
    body = H100_SCRAPE.read_bytes()

    class Replay(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()


def test_the_dashboards_gpu_panels_find_data_in_a_real_h100s_series(
    recorded_scrape: int, prometheus_for: Callable[[int], Prometheus]
) -> None:
    prometheus = prometheus_for(recorded_scrape)
    util = prometheus.wait_for("DCGM_FI_DEV_GPU_UTIL", 1)
    assert util[0]["metric"]["modelName"] == "NVIDIA H100 80GB HBM3"
    assert "simulated" not in util[0]["metric"]  # real: no simulated="true" (empty is none)
    time.sleep(3)  # a few scrapes, for the panels that take a rate
    dashboard = json.loads(DASHBOARD.read_text())
    checked, empty = 0, []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "DCGM_FI" not in expr or any(n in expr for n in H100_ABSENT + NOT_RECORDED):
                continue
            checked += 1
            if not prometheus.query(grafana_to_promql(expr)):
                empty.append(f"{panel['title']}: {expr}")
    assert checked >= 12, checked
    assert not empty, "GPU panels with no data on a real H100:\n" + "\n".join(empty)
    # The run on that GPU is named on its series, as on simulated ones.
    ranked = prometheus.query('DCGM_FI_DEV_FB_USED{run!=""}')
    assert [(s["metric"]["gpu"], s["metric"]["rank"]) for s in ranked] == [("0", "0")]


def test_the_alert_rules_fire_on_a_real_daemons_series(
    tmp_path: Path, daemons: Daemons, prometheus_for: Callable[..., Prometheus]
) -> None:
    """A run fails and a GPU gets XID 79 (quarantined) on a real daemon: a real Prometheus
    with gpud's rules fires GpudRunFailed, GpudGpuQuarantined and GpuXidError; every rule
    evaluates without error, and every series the rules read is in its database (but
    those of later releases: goodput, the state dir's bound)."""
    port = free_port()
    xids = tmp_path / "xids"
    daemon = daemons(simulate_gpus=4, extra=("--metrics", f"127.0.0.1:{port}",
                                             "--simulate-xid-file", str(xids)))  # fmt: skip
    # A training run (its ranks' series: straggler, stalled) beside the one that fails.
    training = launch(daemon, FAST, "training.max_steps=100000", "gpus=[2, 3]")
    try:
        wait_for_step(daemon, training, 3)
        prometheus = prometheus_for(port, rules=RULES)
        prometheus.wait_for('DCGM_FI_DEV_XID_ERRORS{gpu="1"} == 0', 1)
        time.sleep(2)  # a few evaluations that saw GPU 1 without an XID
        spec = script_spec(tmp_path, "raise ValueError('bad shard 17')\n", name="fails")
        launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
        assert launched.returncode == 0, launched.stderr
        run_id = json.loads(launched.stdout)["run"]["id"]
        wait_for(daemon, run_id, {"failed"}, timeout=60)
        xids.write_text("1:79\n")
        _rules_fire(prometheus, run_id)
    finally:
        force_stop(daemon, training)


def _rules_fire(prometheus: Prometheus, run_id: str) -> None:
    def firing() -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for alert in prometheus.get("/api/v1/alerts")["alerts"]:
            if alert["state"] == "firing":
                found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return found

    wanted = {"GpudRunFailed", "GpudGpuQuarantined", "GpuXidError"}
    alerts = until("the alerts fire", lambda: wanted <= set(f := firing()) and f, timeout=60)
    assert [(a["run"], a["name"]) for a in alerts["GpudRunFailed"]] == [(run_id, "fails")]
    (quarantined,) = alerts["GpudGpuQuarantined"]
    assert quarantined["gpu"] == "1" and "XID 79" in quarantined["reason"]
    assert [a["gpu"] for a in alerts["GpuXidError"]] == ["1"]
    assert not set(alerts) - wanted, alerts  # nothing else: the daemon is up, all is well

    groups = prometheus.get("/api/v1/rules")["groups"]
    health = {r["name"]: (r["health"], r.get("lastError")) for g in groups for r in g["rules"]}
    assert len(health) == len(rules())
    assert all(state == "ok" for state, _ in health.values()), health
    names = set(prometheus.label_values("__name__", '{job="gpud"}'))
    read = {
        name
        for rule in rules()
        for name in re.findall(r"\b(gpud_\w+|DCGM_\w+)\b", str(rule["expr"]))
    }
    assert read - NOT_YET_EXPORTED <= names, read - NOT_YET_EXPORTED - names
