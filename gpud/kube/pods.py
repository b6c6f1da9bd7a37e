"""Which Kubernetes pod each GPU on this node belongs to, the way dcgm-exporter maps them:
the kubelet's pod-resources API names the pod, namespace and container a GPU is allocated
to; a process's cgroup names the UID of the pod it runs in (cgroup v1 and v2, the cgroupfs
and systemd drivers' spellings). For the snapshot, so `/metrics`' `pod`/`namespace`/
`container`/`pod_uid`, `gpuctl hw` and gputop all see the same.

It runs in the sampler thread. Each process's cgroup is read once (the Slurm-job lookup's
pattern); the API is asked at most every `REFRESH_S`, and after a failure not again for
`RETRY_S`, so a kubelet that hangs costs one timeout a minute, not one per sample.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from gpud.kube.podresources import (
    DEFAULT_SOCKET,
    Allocation,
    PodResourcesError,
    gpu_allocations,
    list_allocations,
)
from gpud.model.snapshot import GpuSample, PodRef

log = logging.getLogger("gpud.kube")

#: GPUs are allocated when a pod is admitted and kept until it ends: a new pod's name may
#: show this late, never a wrong one for long.
REFRESH_S = 10.0
RETRY_S = 60.0
#: Processes remembered at most (reading one again costs one small file read).
MAX_REMEMBERED = 4096
#: A pod's cgroup under the kubelet's `kubepods` hierarchy: `/kubepods/burstable/pod<UID>/…`
#: (cgroupfs) or `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID with
#: _ for ->.slice/…` (systemd). The UID is a UUID, or 32 hex digits for a static pod; a
#: daemon in a cgroup namespace of its own sees the path relative to its own (`/../..`).
POD_CGROUP = re.compile(
    r"kubepods\b.*?pod"
    r"([0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12})"
    r"(?:\.slice)?(?:/|$)"
)

Lister = Callable[[Path], list[Allocation]]


def pod_uid_in_cgroup(text: str) -> str:
    """The pod UID in a `/proc/PID/cgroup` file's text, else ""."""
    for line in text.splitlines():
        found = POD_CGROUP.search(line.split(":", 2)[-1])
        if found:
            return found[1].replace("_", "-")
    return ""


def on_kubernetes(socket: Path, environ: Mapping[str, str] = os.environ) -> bool:
    """A Kubernetes node: the kubelet's pod-resources socket is here, or gpud runs in a pod."""
    return socket.exists() or "KUBERNETES_SERVICE_HOST" in environ


class KubePods:
    """Annotates each sample's GPUs with their pod and processes with their pod UID."""

    def __init__(
        self,
        socket: Path = DEFAULT_SOCKET,
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
        lister: Lister = list_allocations,
    ) -> None:
        self._socket = socket
        self._proc = proc_root
        self._clock = clock
        self._lister = lister
        self._uids: dict[tuple[int, float], str] = {}
        self._allocated: dict[str, Allocation] = {}
        self._next_ask = 0.0
        self._last_error: str | None = None

    def uid_of(self, pid: int) -> str:
        try:
            key = (pid, psutil.Process(pid).create_time())
        except psutil.Error:  # gone
            return ""
        if key not in self._uids:
            if len(self._uids) >= MAX_REMEMBERED:
                self._uids.clear()  # a long-lived daemon sees many processes come and go
            uid = ""
            with contextlib.suppress(OSError):
                uid = pod_uid_in_cgroup((self._proc / str(pid) / "cgroup").read_text())
            self._uids[key] = uid
        return self._uids[key]

    def allocations(self) -> dict[str, Allocation]:
        """GPU UUID → the pod it is allocated to, as the kubelet last said."""
        now = self._clock()
        if now < self._next_ask:
            return self._allocated
        if not self._socket.exists():
            why = f"no kubelet pod-resources socket at {self._socket}"
            self._failed(now, why)
            return self._allocated
        try:
            self._allocated = gpu_allocations(self._lister(self._socket))
        except PodResourcesError as exc:
            self._failed(now, f"the kubelet's pod-resources API at {self._socket}: {exc}")
            return self._allocated
        if self._last_error is not None:
            log.info("the kubelet's pod-resources API answers again: pods named by it")
            self._last_error = None
        self._next_ask = now + REFRESH_S
        return self._allocated

    def _failed(self, now: float, why: str) -> None:
        self._next_ask = now + RETRY_S
        if why != self._last_error:  # once per cause, not once a minute
            log.warning("%s; GPUs carry only the pod UID from their processes' cgroups", why)
            self._last_error = why
        # What the kubelet said before stays: allocations outlive a kubelet restart.

    def annotate(self, gpus: list[GpuSample]) -> list[GpuSample]:
        allocated = self.allocations()
        live: set[int] = set()
        annotated = []
        for gpu in gpus:
            processes = gpu.processes
            first_uid = ""
            if processes:
                updated = []
                for proc in processes:
                    live.add(proc.pid)
                    uid = self.uid_of(proc.pid)
                    first_uid = first_uid or uid
                    updated.append(proc.model_copy(update={"pod_uid": uid}) if uid else proc)
                processes = updated
            where = allocated.get(gpu.uuid)
            if where is None and not first_uid:
                annotated.append(gpu)
                continue
            pod = PodRef(
                name=where.pod if where else None,
                namespace=where.namespace if where else None,
                container=where.container if where else None,
                uid=first_uid or None,
            )
            annotated.append(gpu.model_copy(update={"processes": processes, "pod": pod}))
        self._uids = {k: v for k, v in self._uids.items() if k[0] in live}
        return annotated
