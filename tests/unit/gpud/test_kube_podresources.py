"""Reading the kubelet's List reply: protobuf's own encoding of it (the API's messages,
the fields gpud skips included) decodes to each GPU's pod; a broken one is one clear
error, never a traceback from deep in a decoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.kube.podresources import (
    Allocation,
    PodResourcesError,
    decode_list_reply,
    gpu_allocations,
)
from tests.support.kubelet import Container, FakeKubelet

GPU_A = "GPU-5a1b2c3d-0000-4000-8000-000000000001"
GPU_B = "GPU-5a1b2c3d-0000-4000-8000-000000000002"
CONTAINERS = [
    Container("trainer-0", "ml", "pytorch", {"nvidia.com/gpu": [GPU_A]}),
    Container("trainer-0", "ml", "sidecar", {"example.com/nic": ["eth1"]}),
    Container("shared-1", "team-b", "main", {"nvidia.com/gpu": [f"{GPU_B}::3"]}),
    Container("shared-2", "team-b", "main", {"nvidia.com/gpu": [f"{GPU_B}::4"]}),
    Container("mig-user", "team-c", "main", {"nvidia.com/mig-1g.10gb": ["MIG-7f1e"]}),
    Container("no-devices", "kube-system", "coredns", {}),
]


def reply() -> bytes:
    return FakeKubelet(Path("unused"), CONTAINERS).reply()


def test_every_device_comes_back_with_its_pod_and_container() -> None:
    found = decode_list_reply(reply())
    assert Allocation(GPU_A, "nvidia.com/gpu", "ml", "trainer-0", "pytorch") in found
    assert Allocation("eth1", "example.com/nic", "ml", "trainer-0", "sidecar") in found
    assert len(found) == 5  # the container without devices has none


def test_gpus_by_uuid_time_sliced_ones_by_their_gpu_and_first_pod() -> None:
    gpus = gpu_allocations(decode_list_reply(reply()))
    assert set(gpus) == {GPU_A, GPU_B}  # no NIC, no MIG slice
    assert gpus[GPU_B].pod == "shared-1"


def test_an_empty_reply_is_no_pods() -> None:
    assert decode_list_reply(b"") == []


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_truncated_reply_is_one_clear_error(cut: int) -> None:
    with pytest.raises(PodResourcesError, match=r"truncated|malformed"):
        decode_list_reply(reply()[:-cut])


def test_a_reply_of_the_wrong_shape_is_one_clear_error() -> None:
    # Field 1 of the reply as a number, where PodResources belongs.
    with pytest.raises(PodResourcesError, match="a number where a message belongs"):
        decode_list_reply(bytes([0x08, 0x01]))
    with pytest.raises(PodResourcesError, match="wire type 3"):
        decode_list_reply(bytes([0x0B]))
