"""A real daemon on a "Kubernetes node": the kubelet's pod-resources API is a fake kubelet
on a unix socket (real gRPC, replies encoded by protobuf; the one mocked edge), a process
outside gpud holds a simulated GPU, and `/metrics`, `gpuctl hw` and the snapshot name the
pod the kubelet gave that GPU to, as dcgm-exporter labels it. A kubelet that goes away
costs one warning, not the daemon."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.hardware.simulated import SimulatedSampler
from tests.integration.test_prometheus import by_gpu, parse, scrape
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.kubelet import Container, FakeKubelet

Daemons = Callable[..., RunningDaemon]
NODE = "kube-node-a"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with tempfile.TemporaryDirectory(prefix="kubelet-") as short:  # unix paths are short
        uuids = [g.uuid for g in SimulatedSampler(2, NODE).sample()]
        fake = FakeKubelet(
            Path(short) / "kubelet.sock",
            [
                Container("trainer-0", "ml", "pytorch", {"nvidia.com/gpu": [uuids[0]]}),
                Container("trainer-0", "ml", "sidecar", {"example.com/nic": ["eth1"]}),
            ],
        ).start()
        try:
            yield fake
        finally:
            fake.stop()


@pytest.fixture
def outsider() -> Iterator[int]:
    """A process outside gpud, as a pod's trainer is to the node's daemon."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_pod_a_gpu_is_allocated_to_is_on_its_series_in_hw_and_in_the_snapshot(
    daemons: Daemons, kubelet: FakeKubelet, outsider: int
) -> None:
    port = free_port()
    daemon = daemons(
        node=NODE,
        simulate_gpus=2,
        extra=(
            "--metrics", f"127.0.0.1:{port}",
            "--kubelet-socket", str(kubelet.socket),
            "--simulate-foreign", f"0:{outsider}",
        ),
    )  # fmt: skip
    util = by_gpu(parse(scrape(f"http://127.0.0.1:{port}/metrics")), "DCGM_FI_DEV_GPU_UTIL")
    zero, one = util["0"][0], util["1"][0]
    assert (zero["pod"], zero["namespace"], zero["container"]) == ("trainer-0", "ml", "pytorch")
    # This host is no Kubernetes node: the outsider's cgroup names no pod.
    assert zero["pod_uid"] == ""
    assert one["pod"] == one["namespace"] == one["container"] == ""

    result = gpuctl("--node", daemon.address, "hw")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("0 "))
    assert row.endswith(f"pod ml/trainer-0 (pytorch): pid {outsider} (sleep)")
    result = gpuctl("--node", daemon.address, "--json", "hw")
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["gpus"][0]["pod"] == {
        "name": "trainer-0", "namespace": "ml", "container": "pytorch", "uid": None,
    }  # fmt: skip
    assert node["gpus"][1]["pod"] is None

    # The kubelet goes away (restarts, say): one warning, the last answer kept, and the
    # daemon goes on sampling and serving.
    calls = kubelet.calls
    assert calls >= 1
    kubelet.stop()
    with daemon.client() as client:
        first = client.node_hw().seq
        deadline = time.monotonic() + 30
        while "gpud.kube WARNING" not in daemon.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.node_hw().seq > first
    (warning,) = [line for line in daemon.log().splitlines() if "gpud.kube" in line]
    assert f"kubelet pod-resources socket at {kubelet.socket}" in warning
    util = by_gpu(parse(scrape(f"http://127.0.0.1:{port}/metrics")), "DCGM_FI_DEV_GPU_UTIL")
    assert util["0"][0]["pod"] == "trainer-0"


def test_a_node_off_kubernetes_has_no_pod_labels(daemons: Daemons, tmp_path: Path) -> None:
    port = free_port()
    daemons(
        simulate_gpus=1,
        extra=("--metrics", f"127.0.0.1:{port}", "--kubelet-socket", str(tmp_path / "none")),
    )
    util = by_gpu(parse(scrape(f"http://127.0.0.1:{port}/metrics")), "DCGM_FI_DEV_GPU_UTIL")
    assert not {"pod", "namespace", "container", "pod_uid"} & set(util["0"][0])
