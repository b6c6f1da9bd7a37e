"""The pod of a GPU process from its cgroup, in each spelling the kubelet's cgroup drivers
and runtimes write (v1 and v2, cgroupfs and systemd), and how the pod mapper joins that
to the kubelet's allocations, caches it and survives a kubelet that fails."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gpud.kube.podresources import Allocation, PodResourcesError
from gpud.kube.pods import REFRESH_S, RETRY_S, KubePods, on_kubernetes, pod_uid_in_cgroup
from gpud.model.snapshot import GpuProcess, GpuSample, PodRef

UID = "0e3f4a52-7b1c-4f7e-9a3d-2c1b5e6f7a80"
SYSTEMD_UID = UID.replace("-", "_")
CID = "5f2cb1d6c1e04a3f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f"
STATIC_UID = "8f2e4c1b9a7d6e5f4a3b2c1d0e9f8a7b"  # a static pod's: a hash, no dashes

SPELLINGS = {
    "v1, cgroupfs, docker": (
        f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n"
        f"11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
    ),
    "v1, cgroupfs, guaranteed": f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n",
    "v1, systemd, containerd": (
        "9:memory:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n"
    ),
    "v2, systemd, containerd": (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n"
    ),
    "v2, systemd, cri-o, guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n"
    ),
    "v2, cgroupfs": f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
    # gpud in a pod has a cgroup namespace of its own: others' paths are relative to it.
    "v2, seen from another pod's cgroup namespace": (
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n"
    ),
    "v2, kind (kubelet.slice)": (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n"
    ),
}


@pytest.mark.parametrize("text", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_the_pod_uid_comes_from_the_kubelets_cgroup(text: str) -> None:
    assert pod_uid_in_cgroup(text) == UID


def test_a_static_pods_uid_is_a_hash() -> None:
    text = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{CID}.scope\n"
    )
    assert pod_uid_in_cgroup(text) == STATIC_UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/containerd.service\n",
        "0::/kubepods.slice/kubepods-besteffort.slice\n",  # a QoS class, no pod
        "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n",
        f"0::/docker/{CID}\n",
        f"0::/system.slice/pod{UID}.scope\n",  # a pod UID outside kubepods
        "12:memory:/\n0::/\n",
        "",
    ],
)
def test_other_cgroups_are_no_pod(text: str) -> None:
    assert pod_uid_in_cgroup(text) == ""


def gpu(index: int, pids: list[int]) -> GpuSample:
    return GpuSample(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        processes=[GpuProcess(pid=p, name="python") for p in pids],
    )


class Kubelet:
    """The kubelet's answers, in order (a PodResourcesError is raised)."""

    def __init__(self, *answers: list[Allocation] | PodResourcesError) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, socket: Path) -> list[Allocation]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, PodResourcesError):
            raise answer
        return answer


def allocated(gpu_index: int, pod: str = "trainer-0") -> Allocation:
    uuid = gpu(gpu_index, []).uuid
    return Allocation(uuid, "nvidia.com/gpu", "ml", pod, "pytorch")


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """This process's cgroup file as a pod's container would have it."""
    (tmp_path / str(os.getpid())).mkdir()
    (tmp_path / str(os.getpid()) / "cgroup").write_text(SPELLINGS["v2, systemd, containerd"])
    return tmp_path


def test_a_gpu_gets_its_pod_from_the_kubelet_and_its_uid_from_its_process(
    tmp_path: Path, proc_root: Path
) -> None:
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    pods = KubePods(socket, proc_root=proc_root, lister=Kubelet([allocated(0)]))
    zero, one, two = pods.annotate([gpu(0, [os.getpid()]), gpu(1, []), gpu(2, [os.getpid()])])
    assert zero.pod == PodRef(name="trainer-0", namespace="ml", container="pytorch", uid=UID)
    assert zero.processes is not None and zero.processes[0].pod_uid == UID
    assert one.pod is None and one == gpu(1, [])  # no pod: the very same sample
    assert two.pod == PodRef(uid=UID)  # a pod's process on a GPU the kubelet did not give it
    assert zero.pod.describe() == "pod ml/trainer-0 (pytorch)"
    assert two.pod.describe() == f"pod uid {UID}"


def test_the_kubelet_is_asked_every_refresh_and_a_cgroup_read_once(
    tmp_path: Path, proc_root: Path
) -> None:
    now = [1000.0]
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    kubelet = Kubelet([allocated(0)], [allocated(0, "trainer-1")])
    pods = KubePods(socket, proc_root=proc_root, clock=lambda: now[0], lister=kubelet)
    for _ in range(5):
        pods.annotate([gpu(0, [os.getpid()])])
    assert kubelet.calls == 1
    (proc_root / str(os.getpid()) / "cgroup").write_text("0::/elsewhere\n")
    now[0] += REFRESH_S
    (zero,) = pods.annotate([gpu(0, [os.getpid()])])
    assert kubelet.calls == 2 and zero.pod is not None
    assert (zero.pod.name, zero.pod.uid) == ("trainer-1", UID)  # the same process: not reread


def test_a_failing_kubelet_is_named_once_retried_later_and_its_last_answer_kept(
    tmp_path: Path, proc_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    down = PodResourcesError("UNAVAILABLE: connection refused")
    kubelet = Kubelet([allocated(0)], down, down, [allocated(0)])
    pods = KubePods(socket, proc_root=proc_root, clock=lambda: now[0], lister=kubelet)
    pods.annotate([gpu(0, [])])
    with caplog.at_level(logging.INFO, logger="gpud.kube"):
        for step in (REFRESH_S, 1.0, RETRY_S, RETRY_S):
            now[0] += step
            (zero,) = pods.annotate([gpu(0, [])])
            assert zero.pod is not None and zero.pod.name == "trainer-0"
    assert kubelet.calls == 4  # not on the sample 1 s after the failure
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"the kubelet's pod-resources API at {socket}: UNAVAILABLE: connection refused;"
        " GPUs carry only the pod UID from their processes' cgroups"
    ]
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_without_the_socket_pods_come_from_cgroups_alone(tmp_path: Path, proc_root: Path) -> None:
    kubelet = Kubelet([allocated(0)])
    pods = KubePods(tmp_path / "absent.sock", proc_root=proc_root, lister=kubelet)
    (zero,) = pods.annotate([gpu(0, [os.getpid()])])
    assert zero.pod == PodRef(uid=UID) and kubelet.calls == 0


def test_kubernetes_is_the_socket_or_a_pod(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    assert not on_kubernetes(socket, {})
    assert on_kubernetes(socket, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    socket.touch()
    assert on_kubernetes(socket, {})
