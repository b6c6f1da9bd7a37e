"""A fake kubelet: the pod-resources API (v1 `PodResourcesLister.List`) on a unix socket,
served by real gRPC with replies encoded by protobuf itself from the API's own message
definitions (kubelet/pkg/apis/podresources/v1/api.proto, declared here field by field:
no protoc at test time). The outermost edge of a Kubernetes node, and nothing more."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

STRING, INT64, UINT64, MESSAGE = 9, 3, 4, 11
OPTIONAL, REPEATED = 1, 3

#: The v1 messages the List reply is made of, with the fields gpud does not read too (CPU
#: ids, memory, topology, dynamic resources), so a reply is as a real kubelet's.
MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, REPEATED, ".v1.PodResources")],
    "PodResources": [
        ("name", 1, STRING, OPTIONAL, ""),
        ("namespace", 2, STRING, OPTIONAL, ""),
        ("containers", 3, MESSAGE, REPEATED, ".v1.ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, STRING, OPTIONAL, ""),
        ("devices", 2, MESSAGE, REPEATED, ".v1.ContainerDevices"),
        ("cpu_ids", 3, INT64, REPEATED, ""),
        ("memory", 4, MESSAGE, REPEATED, ".v1.ContainerMemory"),
        ("dynamic_resources", 5, MESSAGE, REPEATED, ".v1.DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, STRING, OPTIONAL, ""),
        ("size", 2, UINT64, OPTIONAL, ""),
        ("topology", 3, MESSAGE, OPTIONAL, ".v1.TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, STRING, OPTIONAL, ""),
        ("device_ids", 2, STRING, REPEATED, ""),
        ("topology", 3, MESSAGE, OPTIONAL, ".v1.TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, MESSAGE, REPEATED, ".v1.NUMANode")],
    "NUMANode": [("ID", 1, INT64, OPTIONAL, "")],
    "DynamicResource": [
        ("claim_name", 2, STRING, OPTIONAL, ""),
        ("claim_namespace", 3, STRING, OPTIONAL, ""),
    ],
}


def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tests/kubelet_podresources_v1.proto", package="v1", syntax="proto3"
    )
    for name, fields in MESSAGES.items():
        message = proto.message_type.add(name=name)
        for fname, number, kind, label, type_name in fields:
            f = message.field.add(name=fname, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}"))
            for n in MESSAGES}  # fmt: skip


PB = _classes()


@dataclass(frozen=True)
class Container:
    pod: str
    namespace: str
    name: str
    devices: dict[str, list[str]]  # resource name → device ids


@dataclass
class FakeKubelet:
    socket: Path
    containers: list[Container] = field(default_factory=list)
    calls: int = 0
    status: grpc.StatusCode | None = None  # answer with this error instead
    _server: Any = None

    def reply(self) -> bytes:
        reply = PB["ListPodResourcesResponse"]()
        pods: dict[tuple[str, str], Any] = {}
        for c in self.containers:
            pod = pods.get((c.namespace, c.pod))
            if pod is None:
                pod = pods[(c.namespace, c.pod)] = reply.pod_resources.add(
                    name=c.pod, namespace=c.namespace
                )
            container = pod.containers.add(name=c.name, cpu_ids=[2, 3])
            container.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            for resource, ids in c.devices.items():
                device = container.devices.add(resource_name=resource, device_ids=ids)
                device.topology.nodes.add(ID=0)
        return bytes(reply.SerializeToString())

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        PB["ListPodResourcesRequest"].FromString(request)  # what gpud sends must parse
        self.calls += 1
        if self.status is not None:
            context.abort(self.status, "the fake kubelet was told to fail")
        return self.reply()

    def start(self) -> FakeKubelet:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=lambda b: b,
                    response_serializer=lambda b: b,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
