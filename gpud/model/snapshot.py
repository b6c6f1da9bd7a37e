"""Hardware readings: what one sample of a node's GPUs and host looks like.

These are the records the samplers produce, the daemon publishes on `hw.<node>`, and
gpuctl/gputop read. Units are in the field names. `None` always means *not available*
(the GPU or driver does not offer the field, or it could not be read) and is never a
stand-in for zero. Readers are tolerant (unknown fields are ignored) so an older gputop can
read a newer daemon's snapshots.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["nvml", "simulated", "none"]


class Reading(BaseModel):
    """Base of every hardware record: immutable, tolerant of unknown fields."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class GpuProcess(Reading):
    """A process with a context on a GPU."""

    pid: int
    name: str | None = Field(None, description="process name from the OS, if visible")
    used_memory_bytes: int | None = Field(None, description="GPU memory held by the process")
    pod_uid: str | None = Field(
        None, description="the Kubernetes pod it runs in, from its cgroup (on Kubernetes only)"
    )


class PodRef(Reading):
    """The Kubernetes pod a GPU belongs to, as dcgm-exporter labels it: name, namespace and
    container from the kubelet's pod-resources API (the pod the GPU is allocated to), the
    UID from the cgroup of a process on it. Either half may be missing."""

    name: str | None = None
    namespace: str | None = None
    container: str | None = None
    uid: str | None = None

    def describe(self) -> str:
        """ "pod ml/trainer-0 (pytorch)", or "pod uid 1f0c…" when only the cgroup told."""
        if self.name is None:
            return f"pod uid {self.uid}"
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"pod {where}" + (f" ({self.container})" if self.container else "")


class NvLinkSample(Reading):
    """One NVLink of one GPU. Error counters are cumulative since driver load."""

    link: int
    active: bool | None = None
    version: int | None = None
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    crc_errors: int | None = Field(None, description="flit + data CRC errors")
    replay_errors: int | None = None
    recovery_errors: int | None = None


class XidRecord(Reading):
    """One XID event as the driver reported it."""

    code: int
    time: float = Field(description="unix time the daemon received the event")


class XidSummary(Reading):
    """XID events of one GPU since the daemon started: counters, not a last-value gauge."""

    total: int = 0
    counts: dict[int, int] = Field(default_factory=dict, description="XID code → count")
    recent: list[XidRecord] = Field(default_factory=list, description="newest last, bounded")
    unacknowledged: int = Field(0, description="events since an operator last acknowledged")
    acknowledged_at: float | None = Field(
        None,
        description="when an operator last acknowledged them (or undrained the GPU): a"
        " preflight looks only at XIDs since",
    )


class Hold(Reading):
    """Why a GPU, or the whole node, takes no new work: a quarantine gpud put on a GPU it
    found unsafe, or an operator's drain (`gpuctl drain`)."""

    kind: Literal["quarantine", "drain"]
    reason: str = Field(description="one line: the XID, the ECC error, the operator's words")
    since: float = Field(description="unix time it began")
    by: str | None = Field(None, description="the operator's key for a drain; None: gpud")


class GpuSample(Reading):
    """Everything sampled from one GPU at one instant."""

    index: int
    simulated: bool = False
    lost: bool = Field(False, description="the driver reports the GPU lost; readings are None")
    # identity
    name: str
    uuid: str
    pci_bus_id: str | None = None
    serial: str | None = None
    compute_capability: tuple[int, int] | None = None
    # activity
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    sm_activity_pct: float | None = Field(None, description="GPM SM utilization (Hopper+)")
    sm_occupancy_pct: float | None = Field(None, description="GPM SM occupancy (Hopper+)")
    tensor_activity_pct: float | None = Field(None, description="GPM tensor-core activity")
    graphics_activity_pct: float | None = Field(
        None, description="GPM graphics engine activity: time any compute/graphics work ran"
    )
    dram_activity_pct: float | None = Field(
        None, description="GPM DRAM bandwidth in use, of the theoretical maximum"
    )
    encoder_utilization_pct: float | None = Field(None, description="video encoder (NVENC)")
    decoder_utilization_pct: float | None = Field(None, description="video decoder (NVDEC)")
    # memory
    memory_used_bytes: int | None = Field(
        None, description="in use, not counting what the driver reserves (as nvidia-smi)"
    )
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = Field(
        None, description="reserved by the driver (NVML v2 memory info; None before it)"
    )
    # thermals and power
    temperature_c: float | None = None
    memory_temperature_c: float | None = Field(None, description="HBM temperature")
    power_w: float | None = None
    energy_mj: int | None = Field(
        None, description="energy used since the driver was loaded (simulated: since start)"
    )
    power_limit_w: float | None = None
    fan_pct: float | None = None
    # clocks
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    clock_event_reasons: list[str] | None = Field(
        None, description="active clock-event (throttle) reasons, e.g. hw_thermal_slowdown"
    )
    # modes
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    # memory health
    ecc_mode: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    # PCIe
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replay_count: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    # NVLink (None: the GPU has no NVLink or it could not be read; [] is never used for that)
    nvlinks: list[NvLinkSample] | None = None
    peer_distance: dict[int, int] | None = Field(
        None,
        description="how far each other GPU (by index) is: 0 NVLink peer-to-peer, else NVML's"
        " common ancestor (10 same board, 20 PCIe switches, 30 host bridge, 40 NUMA node,"
        " 50 across sockets); None: unknown. GPU leases for a count pick the closest set",
    )
    # events and processes
    xid: XidSummary = Field(default_factory=XidSummary)
    processes: list[GpuProcess] | None = None
    pod: PodRef | None = Field(None, description="the Kubernetes pod on it (gpud.kube.pods)")
    hold: Hold | None = Field(None, description="quarantined or drained: no new work (gpud.heal)")


class IbPortSample(Reading):
    """One InfiniBand (or RoCE) port from sysfs. Error counters are cumulative."""

    device: str
    port: int
    state: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None
    rx_bytes_per_s: float | None = None
    tx_bytes_per_s: float | None = None
    symbol_errors: int | None = None
    link_downed: int | None = None
    rx_errors: int | None = None
    link_error_recovery: int | None = None


class HostSample(Reading):
    """The host side of a node (psutil and sysfs)."""

    hostname: str
    cpu_count_logical: int
    cpu_count_physical: int | None = None
    cpu_percent: float | None = None
    cpu_per_core_pct: list[float] = Field(default_factory=list)
    load_1m: float | None = None
    load_5m: float | None = None
    load_15m: float | None = None
    memory_total_bytes: int
    memory_used_bytes: int
    memory_available_bytes: int
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    disk_read_bytes_per_s: float | None = Field(None, description="None on the first sample")
    disk_write_bytes_per_s: float | None = None
    net_rx_bytes_per_s: float | None = None
    net_tx_bytes_per_s: float | None = None
    infiniband: list[IbPortSample] = Field(default_factory=list)


class NodeSnapshot(Reading):
    """One sample of a whole node: published every interval on `hw.<node>`."""

    node: str
    seq: int = Field(description="increases by one per snapshot from this daemon")
    time: float = Field(description="unix time the sample was taken")
    interval_s: float
    backend: Backend
    simulated: bool = Field(description="true when the GPUs are simulated, not real hardware")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    sample_ms: float | None = Field(None, description="how long taking this sample took")
    gpus: list[GpuSample] = Field(default_factory=list)
    host: HostSample
    drained: Hold | None = Field(None, description="the node takes no new runs (gpuctl drain)")
    state_dir_full: str | None = Field(
        None, description="why the state dir has no room: new launches are refused meanwhile"
    )


NodeEventKind = Literal[
    "xid",
    "throttle",
    "nvlink_errors",
    "pcie_replays",
    "ecc_errors",
    "remapped_rows",
    "gpu_lost",
    "quarantine",
    "drain",
    "state_dir",
]
Severity = Literal["info", "warning", "critical"]
NODE_EVENT_KINDS: frozenset[str] = frozenset(get_args(NodeEventKind))


def known_node_events(raw: list[Any]) -> list[Any]:
    """The node events (as read off the wire) of a kind this code knows: a newer daemon's
    new kind is left out (and counted by the caller), not fatal to the rest."""
    return [e for e in raw if not isinstance(e, dict) or e.get("kind") in NODE_EVENT_KINDS]


class NodeEvent(Reading):
    """A notable hardware change, published on `node.<node>.event` and kept in the store."""

    node: str
    time: float
    kind: NodeEventKind
    severity: Severity
    gpu_index: int | None = None
    message: str = Field(description="one line a person can act on")
    data: dict[str, int | float | str | None] = Field(default_factory=dict)
