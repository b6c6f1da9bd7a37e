"""What gputop knows about one node: its latest snapshot, GPU histories, events, liveness.

A node is online while its events keep coming. Every event counts (hardware snapshots
arrive each interval), so a node whose events stop for `offline_after_s` — 2.5 s at the
default 1 s interval — is shown offline, within the 3 s the UI promises, and shows online
again with the first event after it comes back.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from gpud.client import NodeTarget
from gpud.protocol import NodeInfo
from gpud.snapshot import GpuSample, NodeEvent, NodeSnapshot
from tui.model.series import Recent

#: Silence after which a node is offline, at the default 1 s interval.
OFFLINE_AFTER_S = 2.5
#: Clock-event reasons that mean the GPU is being slowed down (not idle, not app clocks).
SLOWDOWN_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)
NODE_EVENTS_KEPT = 200
_TRAILING_NUMBER = re.compile(r"[-_.]?\d+$")


@dataclass
class GpuHistory:
    """Recent readings of one GPU, for its sparklines."""

    util: Recent = field(default_factory=Recent)
    memory: Recent = field(default_factory=Recent)  # percent of total
    power: Recent = field(default_factory=Recent)
    temperature: Recent = field(default_factory=Recent)

    def add(self, gpu: GpuSample) -> None:
        self.util.add(activity_pct(gpu))
        self.memory.add(memory_pct(gpu))
        self.power.add(gpu.power_w)
        self.temperature.add(gpu.temperature_c)


@dataclass(frozen=True)
class NodeLoad:
    """Sums over a node's GPUs, for fleet-wide averages without a pass over every GPU."""

    gpus: int = 0
    util_sum: float = 0.0
    util_count: int = 0
    memory_sum: float = 0.0
    memory_count: int = 0


def node_load(snapshot: NodeSnapshot | None) -> NodeLoad:
    if snapshot is None:
        return NodeLoad()
    utils = [u for g in snapshot.gpus if (u := activity_pct(g)) is not None]
    mems = [m for g in snapshot.gpus if (m := memory_pct(g)) is not None]
    return NodeLoad(len(snapshot.gpus), sum(utils), len(utils), sum(mems), len(mems))


@dataclass(frozen=True)
class NodeHealth:
    """Hardware trouble of a node, as counts a fleet row can show."""

    xid: int = 0  # unacknowledged XID events
    throttled: tuple[int, ...] = ()  # GPUs with a slowdown reason active
    link_errors: int = 0  # NVLink CRC/replay/recovery + PCIe replays + IB errors
    ecc_uncorrected: int = 0
    lost: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not (
            self.xid or self.throttled or self.link_errors or self.ecc_uncorrected or self.lost
        )


def activity_pct(gpu: GpuSample) -> float | None:
    """SM activity where the GPU reports it (GPM), else NVML utilization."""
    return gpu.sm_activity_pct if gpu.sm_activity_pct is not None else gpu.utilization_gpu_pct


def memory_pct(gpu: GpuSample) -> float | None:
    if gpu.memory_used_bytes is None or not gpu.memory_total_bytes:
        return None
    return 100.0 * gpu.memory_used_bytes / gpu.memory_total_bytes


def gpu_link_errors(gpu: GpuSample) -> int:
    total = gpu.pcie_replay_count or 0
    for link in gpu.nvlinks or ():
        total += (link.crc_errors or 0) + (link.replay_errors or 0) + (link.recovery_errors or 0)
    return total


def throttle_reasons(gpu: GpuSample) -> list[str]:
    return sorted(SLOWDOWN_REASONS.intersection(gpu.clock_event_reasons or ()))


def node_health(snapshot: NodeSnapshot | None) -> NodeHealth:
    if snapshot is None:
        return NodeHealth()
    links = sum(gpu_link_errors(g) for g in snapshot.gpus)
    for port in snapshot.host.infiniband:
        links += (port.symbol_errors or 0) + (port.link_downed or 0) + (port.rx_errors or 0)
    return NodeHealth(
        xid=sum(g.xid.unacknowledged for g in snapshot.gpus),
        throttled=tuple(g.index for g in snapshot.gpus if throttle_reasons(g)),
        link_errors=links,
        ecc_uncorrected=sum(g.ecc_uncorrected_volatile or 0 for g in snapshot.gpus),
        lost=tuple(g.index for g in snapshot.gpus if g.lost),
    )


def group_of(name: str) -> str:
    """`rack1-node07` → `rack1-node`: nodes numbered in a series group together."""
    stem = _TRAILING_NUMBER.sub("", name)
    return stem or name


class NodeView:
    """One node. Mutated by its feed thread under the model's lock; read by the UI."""

    def __init__(self, target: NodeTarget, group: str | None = None) -> None:
        self.target = target
        self.key = target.control
        self.label = target.label
        self.configured_name = target.name
        self.configured_group = group
        self.info: NodeInfo | None = None
        self.snapshot: NodeSnapshot | None = None
        self.last_seen: float | None = None  # monotonic time of the last event
        self.interval_s = 1.0
        self.error: str | None = None
        self.histories: dict[int, GpuHistory] = {}
        self.events: deque[NodeEvent] = deque(maxlen=NODE_EVENTS_KEPT)
        self.run_ids: set[str] = set()
        self.version = 0
        self._health: tuple[NodeSnapshot | None, NodeHealth] = (None, NodeHealth())
        self._load: tuple[NodeSnapshot | None, NodeLoad] = (None, NodeLoad())

    @property
    def name(self) -> str:
        if self.configured_name:
            return self.configured_name
        if self.snapshot is not None:
            return self.snapshot.node
        if self.info is not None:
            return self.info.node
        return self.label

    @property
    def group(self) -> str:
        return self.configured_group or group_of(self.name)

    @property
    def simulated(self) -> bool:
        if self.snapshot is not None:
            return self.snapshot.simulated
        return bool(self.info and self.info.simulated)

    def offline_after_s(self) -> float:
        # At the default 1 s interval: 2.5 s. A daemon sampling slower gets its interval
        # plus the same margin, so it does not flap between samples.
        return max(OFFLINE_AFTER_S, self.interval_s + 1.5)

    def online(self, now: float) -> bool:
        return self.last_seen is not None and now - self.last_seen <= self.offline_after_s()

    def seen(self, now: float) -> None:
        self.last_seen = now
        self.error = None

    def add_snapshot(self, snapshot: NodeSnapshot) -> None:
        if (
            self.snapshot is not None
            and snapshot.seq == self.snapshot.seq
            and (snapshot.time == self.snapshot.time)
        ):
            return  # the same sample again (node.hw after the event)
        self.snapshot = snapshot
        self.interval_s = snapshot.interval_s or 1.0
        for gpu in snapshot.gpus:
            self.histories.setdefault(gpu.index, GpuHistory()).add(gpu)
        self.version += 1

    def health(self) -> NodeHealth:
        """Computed once per snapshot: every screen asks for it on every frame."""
        snapshot, health = self._health
        if snapshot is not self.snapshot:
            health = node_health(self.snapshot)
            self._health = (self.snapshot, health)
        return health

    def load(self) -> NodeLoad:
        snapshot, load = self._load
        if snapshot is not self.snapshot:
            load = node_load(self.snapshot)
            self._load = (self.snapshot, load)
        return load
