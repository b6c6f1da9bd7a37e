"""A node in brief: what a fleet view shows of it, published as `sum.<node>` each interval.

A full `hw.<node>` snapshot is ~30 kB of JSON for 8 GPUs (every NVML field, NVLinks,
processes); a view of 256 nodes needs per GPU only its activity, memory and trouble, and
per node its health and its runs. The brief is ~1 kB, built from the snapshot and this
node's runs (pure: no I/O; `gpud.wire.briefing` builds it), so gputop's fleet and runs
screens subscribe to briefs only and ask for a full snapshot or a run's every event only
for what is on screen.

The trouble counts are computed here once, by the same functions gputop uses on a full
snapshot (`node_health`), so both views agree.
"""

from __future__ import annotations

from pydantic import Field

from gpud.model.run import (
    SAMPLES_PER_S_NAMES,
    TOKENS_PER_S_NAMES,
    RunState,
)
from gpud.model.snapshot import Backend, GpuSample, NodeSnapshot, Reading

#: Clock-event reasons that mean the GPU is being slowed down (not idle, not app clocks).
SLOWDOWN_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)
#: The run values a brief carries: what the runs table shows, and the rate.
BRIEF_VALUES = ("loss", "lr", *SAMPLES_PER_S_NAMES, *TOKENS_PER_S_NAMES)
#: An ended run stays in its nodes' briefs this long, so every view sees how it ended.
ENDED_KEPT_S = 300.0
#: ...the newest this many of them: a node that ended hundreds of short runs in those
#: minutes (a sweep, a soak) would otherwise build and send all of them every second.
ENDED_KEPT_MAX = 32


class GpuBrief(Reading):
    """One GPU, as a fleet row draws it."""

    index: int
    activity_pct: float | None = Field(None, description="SM activity (GPM), else utilization")
    memory_pct: float | None = None
    lost: bool = False
    throttled: bool = False


class NodeHealthBrief(Reading):
    """A node's hardware trouble, as counts a fleet row can show."""

    xid: int = Field(0, description="unacknowledged XID events")
    throttled: list[int] = Field(default_factory=list, description="GPUs being slowed down")
    link_errors: int = Field(0, description="NVLink CRC/replay/recovery, PCIe replays, IB")
    ecc_uncorrected: int = 0
    lost: list[int] = Field(default_factory=list)
    quarantined: list[int] = Field(default_factory=list, description="GPUs gpud found unsafe")
    drained: list[int] = Field(default_factory=list, description="GPUs an operator drained")
    node_drained: str | None = Field(None, description="the node's drain: by whom, and why")

    @property
    def ok(self) -> bool:
        return not (
            self.xid
            or self.throttled
            or self.link_errors
            or self.ecc_uncorrected
            or self.lost
            or self.quarantined
            or self.drained
            or self.node_drained
        )


class RunBrief(Reading):
    """A run this node has a part of; node 0's brief speaks for the gang."""

    id: str
    name: str
    state: RunState
    attempt: int
    node_rank: int
    last_step: int | None = None
    max_steps: int | None = None
    values: dict[str, float] = Field(default_factory=dict, description="of BRIEF_VALUES")
    verdict: str | None = Field(None, description="the health verdict (node 0 only)")
    judged_from_output: bool = Field(
        False, description="health is judged from the output: `HealthSummary.judged_from_output`"
    )
    flops_per_second: float | None = Field(
        None, description="achieved FLOP/s while it trains (node 0 only: `RunFlops`)"
    )
    mfu: float | None = Field(None, description="MFU, 0 to 1 (node 0 only; None: n/a)")


class NodeBrief(Reading):
    """Body of `sum.<node>`."""

    node: str
    seq: int
    time: float
    interval_s: float
    backend: Backend
    simulated: bool
    gpus: list[GpuBrief]
    health: NodeHealthBrief
    runs: list[RunBrief] = Field(default_factory=list)


def sum_topic(node: str) -> str:
    return f"sum.{node}"


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


def node_health(snapshot: NodeSnapshot | None) -> NodeHealthBrief:
    if snapshot is None:
        return NodeHealthBrief()
    links = sum(gpu_link_errors(g) for g in snapshot.gpus)
    for port in snapshot.host.infiniband:
        links += (port.symbol_errors or 0) + (port.link_downed or 0) + (port.rx_errors or 0)
    return NodeHealthBrief(
        xid=sum(g.xid.unacknowledged for g in snapshot.gpus),
        throttled=[g.index for g in snapshot.gpus if throttle_reasons(g)],
        link_errors=links,
        ecc_uncorrected=sum(g.ecc_uncorrected_volatile or 0 for g in snapshot.gpus),
        lost=[g.index for g in snapshot.gpus if g.lost],
        quarantined=[g.index for g in snapshot.gpus if g.hold and g.hold.kind == "quarantine"],
        drained=[g.index for g in snapshot.gpus if g.hold and g.hold.kind == "drain"],
        node_drained=(
            f"{snapshot.drained.by or 'an operator'}: {snapshot.drained.reason}"
            if snapshot.drained
            else None
        ),
    )


def gpu_brief(gpu: GpuSample) -> GpuBrief:
    if gpu.lost:
        return GpuBrief(index=gpu.index, lost=True)
    return GpuBrief(
        index=gpu.index,
        activity_pct=activity_pct(gpu),
        memory_pct=memory_pct(gpu),
        throttled=bool(throttle_reasons(gpu)),
    )
