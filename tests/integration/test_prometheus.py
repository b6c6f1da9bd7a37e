"""`gpud serve --metrics`: a real daemon with simulated GPUs and a real gloo run, scraped
over real HTTP(S) and parsed with prometheus-client's own parser (issue 11)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpud.prometheus.series import FIELDS
from tests.support.daemons import RunningDaemon, free_port
from tests.support.dcgm_exporter import dcgm_types
from tests.support.runs import FAST, force_stop, launch, wait_for_step
from tests.support.waiting import until

Daemons = Callable[..., RunningDaemon]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(reply.read().decode())


def parse(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def by_gpu(samples: Samples, name: str) -> dict[str, tuple[dict[str, str], float]]:
    return {labels["gpu"]: (labels, value) for labels, value in samples[name]}


def _with_ranks(url: str) -> str | None:
    """A scrape with both ranks' load on their GPUs and both heartbeats in, or None."""
    text = scrape(url)
    samples = parse(text)
    active = [v for labels, v in samples.get("DCGM_FI_PROF_SM_ACTIVE", []) if labels["run"]]
    beats = {labels["rank"] for labels, _ in samples.get("gpud_rank_heartbeat_age_seconds", [])}
    ready = len(active) == 2 and all(v > 0 for v in active) and beats == {"0", "1"}
    return text if ready else None


def test_gpu_series_carry_dcgm_names_labels_and_the_run_and_rank_on_them(
    daemons: Daemons,
) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=4, extra=("--metrics", f"127.0.0.1:{port}"))
    # A run inside a Slurm allocation: its processes carry the job id.
    run_id = launch(
        daemon, FAST, "training.max_steps=100000", "gpus=[1, 2]", "env.SLURM_JOB_ID=4242"
    )
    try:
        wait_for_step(daemon, run_id, 10)
        # Until a sample has the ranks' load on their GPUs (their CPU since the sample
        # before stands in for it: a rank just found has none yet) and a health round
        # has the heartbeats.
        url = f"http://127.0.0.1:{port}/metrics"
        text = until("the ranks' load and heartbeats in a scrape", lambda: _with_ranks(url),
                     timeout=30, every=0.25)  # fmt: skip
    finally:
        force_stop(daemon, run_id)
    samples = parse(text)
    util = by_gpu(samples, "DCGM_FI_DEV_GPU_UTIL")
    assert sorted(util) == ["0", "1", "2", "3"]
    labels, _ = util["1"]
    assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                           "DCGM_FI_DRIVER_VERSION", "run", "rank", "hpc_job",
                           "simulated"}  # fmt: skip
    assert labels["DCGM_FI_DRIVER_VERSION"] == "simulated"  # dcgm-exporter's label for it
    assert (labels["device"], labels["modelName"]) == ("nvidia1", "NVIDIA H100 80GB HBM3")
    assert labels["simulated"] == "true" and labels["UUID"].startswith("GPU-sim")
    # The run's ranks on the GPUs it leased, by local rank: what dcgm-exporter cannot say.
    assert (util["1"][0]["run"], util["1"][0]["rank"]) == (run_id, "0")
    assert (util["2"][0]["run"], util["2"][0]["rank"]) == (run_id, "1")
    # No run on GPUs 0 and 3: empty, which Prometheus stores as no label at all.
    assert util["0"][0]["run"] == util["3"][0]["run"] == util["3"][0]["rank"] == ""
    # The Slurm job of the processes on a GPU, as dcgm-exporter's hpc_job.
    assert util["1"][0]["hpc_job"] == util["2"][0]["hpc_job"] == "4242"
    assert util["0"][0]["hpc_job"] == ""
    # Units and scales as dcgm-exporter's: MiB, ratios from 0 to 1.
    used = by_gpu(samples, "DCGM_FI_DEV_FB_USED")["1"][1]
    total = by_gpu(samples, "DCGM_FI_DEV_FB_TOTAL")["1"][1]
    assert 512 <= used < total == 81559
    assert 0 < by_gpu(samples, "DCGM_FI_PROF_SM_ACTIVE")["1"][1] <= 1.0
    # A field the simulated board does not offer (no fan on SXM) is absent, never 0.
    assert "DCGM_FI_DEV_FAN_SPEED" not in samples
    offered = {f.name.removesuffix("_total") for f in FIELDS} - {"DCGM_FI_DEV_FAN_SPEED"}
    missing = {n for n in offered if n not in samples and f"{n}_total" not in samples}
    assert not missing, missing
    # The run's own series.
    wanted = {"metric": "loss", "run": run_id}
    losses = [v for labels, v in samples["gpud_run_metric"] if labels == wanted]
    assert len(losses) == 1 and 0 < losses[0] < 10
    states = {labels["state"]: value for labels, value in samples["gpud_run_state"]}
    assert states["running"] == 1.0 and sum(states.values()) == 1.0
    ages = {labels["rank"] for labels, _ in samples["gpud_rank_heartbeat_age_seconds"]}
    assert ages == {"0", "1"}
    verdicts = {labels["verdict"]: v for labels, v in samples["gpud_run_health"]}
    assert sum(verdicts.values()) == 1.0
    assert samples["gpud_daemon_requests_total"]
    promtool = shutil.which("promtool")
    if promtool is not None:  # Debian's prometheus package; CI installs it
        check = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        # promtool's style lint flags what dcgm-exporter itself does, and dashboards
        # depend on: its camelCase labels, a name ending in COUNTER, and its counters'
        # names without `_total`. Nothing else.
        dcgm_counters = {name for name, kind in dcgm_types().items() if kind == "counter"}
        problems = {
            line.strip()
            for line in (check.stdout + check.stderr).splitlines()
            if line.strip()
            and not line.strip().endswith("label names should be written in 'snake_case' not"
                                          " 'camelCase'")
            and line.strip() != "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not"
            " include type 'counter'"
            and line.strip() not in {f'{name} counter metrics should have "_total" suffix'
                                     for name in dcgm_counters}
        }  # fmt: skip
        assert not problems, problems


def test_a_non_loopback_address_needs_tls_or_an_explicit_insecure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpud", "serve", "--state-dir", str(tmp_path / "s"),
         "--metrics", "0.0.0.0:9400"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--metrics-insecure" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_bad_scrapers_cost_nothing_and_the_daemon_keeps_serving(daemons: Daemons) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=2, extra=("--metrics", f"127.0.0.1:{port}"))
    url = f"http://127.0.0.1:{port}"
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # slowloris
    try:
        with socket.create_connection(("127.0.0.1", port)) as junk:
            junk.sendall(b"\x16\x03\x01garbage\r\n\r\n")
            assert junk.recv(100).startswith(b"HTTP/1.1 400")
        with socket.create_connection(("127.0.0.1", port)) as huge:
            huge.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")
            assert huge.recv(100).startswith(b"HTTP/1.1 431")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{url}/", timeout=5)
        assert missing.value.code == 404
        assert "DCGM_FI_DEV_GPU_UTIL" in scrape(f"{url}/metrics")
        assert daemon.client().node_info().node == daemon.node
    finally:
        for sock in silent:
            sock.close()


openssl = shutil.which("openssl")


def make_cert(tmp_path: Path, name: str, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    assert openssl is not None
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.crt"
    subject = ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"]
    if ca is None:
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "2", "-keyout", key, "-out", cert, *subject],
                       check=True, capture_output=True)  # fmt: skip
        return cert, key
    request = tmp_path / f"{name}.csr"
    subprocess.run([openssl, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", request, *subject], check=True, capture_output=True)  # fmt: skip
    subprocess.run([openssl, "x509", "-req", "-in", request, "-CA", ca[0], "-CAkey", ca[1],
                    "-CAcreateserial", "-days", "2", "-out", cert, "-copy_extensions", "copy"],
                   check=True, capture_output=True)  # fmt: skip
    return cert, key


@pytest.mark.skipif(openssl is None, reason="openssl is not installed")
def test_tls_with_client_certificates(daemons: Daemons, tmp_path: Path) -> None:
    ca = make_cert(tmp_path, "ca")
    server = make_cert(tmp_path, "server", ca)
    client = make_cert(tmp_path, "client", ca)
    port = free_port()
    daemons(simulate_gpus=1, extra=(
        "--metrics", f"127.0.0.1:{port}", "--metrics-tls-cert", str(server[0]),
        "--metrics-tls-key", str(server[1]), "--metrics-client-ca", str(ca[0]),
    ))  # fmt: skip
    context = ssl.create_default_context(cafile=str(ca[0]))
    context.load_cert_chain(client[0], client[1])
    assert "DCGM_FI_DEV_GPU_UTIL" in scrape(f"https://127.0.0.1:{port}/metrics", context)
    stranger = ssl.create_default_context(cafile=str(ca[0]))  # no client certificate
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        scrape(f"https://127.0.0.1:{port}/metrics", stranger)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(f"http://127.0.0.1:{port}/metrics")  # plain HTTP on a TLS port
