"""Hand-made, deterministic model states for screen tests and SVG snapshots.

Everything is built from the real wire models (NodeSnapshot, RunSummary, HealthSummary,
...) and applied through the model's own `apply_*` methods, with a fixed clock, so a
snapshot only changes when the UI does.
"""

from __future__ import annotations

import math

from gpud.efficiency.model import RunFlops
from gpud.model.run import (
    BandwidthView,
    CheckpointRef,
    GpuTrouble,
    HealthSummary,
    NodeRef,
    RankView,
    RunState,
    Straggler,
)
from gpud.model.snapshot import (
    GpuProcess,
    GpuSample,
    HostSample,
    NodeEvent,
    NodeSnapshot,
    NvLinkSample,
    XidRecord,
    XidSummary,
)
from gpud.wire.client import NodeTarget
from gpud.wire.envelope import Event
from gpud.wire.protocol import RunLogEvent, RunMetricsEvent
from gpud.wire.run_messages import LogChunk, MetricRow, MetricsReply, RunSummary
from tui.model.fleet import FleetModel
from tui.model.targets import Target

T0 = 1_700_000_000.0
GIB = 2**30
KEY_A = "A" * 40


class FixedClock:
    """A clock that moves only when a test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def target(i: int, name: str | None = None, group: str | None = None) -> Target:
    return Target(
        NodeTarget(f"tcp://10.0.0.{i}:7711", KEY_A.encode(), f"tcp://10.0.0.{i}:7712", name),
        group,
    )


def host(name: str) -> HostSample:
    return HostSample(
        hostname=name,
        cpu_count_logical=64,
        cpu_count_physical=32,
        cpu_percent=23.0,
        load_1m=7.5,
        memory_total_bytes=512 * GIB,
        memory_used_bytes=96 * GIB,
        memory_available_bytes=416 * GIB,
    )


def gpu(
    i: int,
    util: float | None,
    mem_gib: float,
    *,
    simulated: bool = False,
    sm: float | None = None,
    throttle: list[str] | None = None,
    xid: int = 0,
    procs: list[GpuProcess] | None = None,
    lost: bool = False,
) -> GpuSample:
    if lost:
        return GpuSample(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{i}", lost=True)
    return GpuSample(
        index=i,
        simulated=simulated,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-0000-{i:04d}",
        pci_bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0",
        compute_capability=(9, 0),
        utilization_gpu_pct=util,
        utilization_memory_pct=None if util is None else util * 0.4,
        sm_activity_pct=sm,
        memory_used_bytes=int(mem_gib * GIB),
        memory_total_bytes=80 * GIB,
        temperature_c=None if util is None else 35 + util * 0.4,
        power_w=None if util is None else 90 + util * 5,
        power_limit_w=700.0,
        clock_sm_mhz=None if util is None else int(345 + util * 15),
        clock_sm_max_mhz=1980,
        clock_event_reasons=throttle if throttle is not None else [],
        ecc_uncorrected_volatile=0,
        pcie_link_gen=5,
        pcie_link_width=16,
        pcie_replay_count=0,
        nvlinks=[NvLinkSample(link=k, active=True, crc_errors=0) for k in range(2)],
        xid=XidSummary(
            total=xid,
            counts={79: xid} if xid else {},
            recent=[XidRecord(code=79, time=T0)] if xid else [],
            unacknowledged=xid,
        ),
        processes=procs if procs is not None else [],
    )


def snapshot(
    node: str, gpus: list[GpuSample], seq: int = 1, simulated: bool = False
) -> NodeSnapshot:
    return NodeSnapshot(
        node=node,
        seq=seq,
        time=T0 + seq,
        interval_s=1.0,
        backend="simulated" if simulated else "nvml",
        simulated=simulated,
        driver_version="simulated" if simulated else "550.54.15",
        cuda_driver_version=None if simulated else "12.4",
        gpus=gpus,
        host=host(node),
    )


def event(topic: str, body: object, seq: int = 1) -> Event:
    return Event(v=1, topic=topic, seq=seq, time=T0 + seq, body=body)


def summary(
    run_id: str,
    nodes: list[str],
    node_rank: int = 0,
    state: RunState = RunState.RUNNING,
    attempt: int = 2,
    step: int | None = 1180,
    nproc: int = 2,
    created: float = T0 - 600,
    queue_position: int | None = None,
) -> RunSummary:
    held = list(range(nproc)) if state is RunState.RUNNING else []
    return RunSummary(
        id=run_id,
        name=run_id.rsplit("-", 1)[0],
        state=state,
        state_since=T0 - 60,
        reason=f"attempt {attempt}",
        attempt=attempt,
        created_at=created,
        node_rank=node_rank,
        nodes=[NodeRef(control=n, server_key=KEY_A) for n in nodes],
        nproc=nproc,
        gpus=held,
        queue_position=queue_position,
        launcher="torchrun",
        last_step=step,
        max_steps=1800,
        last_values={"loss": 0.05},
        last_checkpoint=CheckpointRef(path="/ckpt/step-1100", step=1100),
    )


def loss_at(step: int) -> float:
    return 0.04 + 1.2 * math.exp(-step / 250) + 0.01 * math.sin(step / 7)


def metric_rows(last: int = 1180, resume: int = 700) -> list[MetricRow]:
    rows = []
    for step in range(0, 760):  # attempt 1 ran to 759; attempt 2 resumed at 700
        rows.append(MetricRow(attempt=1, step=step, time=T0 + step / 30, values=values(step)))
    for step in range(resume, last + 1):
        rows.append(MetricRow(attempt=2, step=step, time=T0 + 100 + step / 30, values=values(step)))
    return rows


def values(step: int) -> dict[str, float]:
    return {
        "loss": loss_at(step),
        "lr": 1e-3 * min(1.0, (step + 1) / 90) * max(0.05, 1 - step / 1800),
        "grad_norm": 0.5 + 0.3 * math.cos(step / 40),
    }


def flops(mfu: float) -> RunFlops:
    """4 H100s at bf16, the first step's FLOPs counted."""
    peak = 989.4e12
    return RunFlops(
        flops_per_second=mfu * peak * 4, source="counted", gpu_model="H100 SXM", dtype="bf16",
        gpus=4, peak_flops_per_gpu=peak, mfu=mfu, sm_active=0.86,
    )  # fmt: skip


def health(run_id: str, mfu: float = 0.412, time: float = T0) -> HealthSummary:
    ranks = [
        RankView(
            rank=r,
            node_rank=r // 2,
            local_rank=r % 2,
            host=f"gpu-a0{r // 2 + 1}",
            pid=4100 + r,
            last_step=1180 if r != 3 else 1171,
            step_time_s=0.031 if r != 3 else 0.094,
            heartbeat_age_s=0.4,
            progress_age_s=0.5,
            gpu_index=r % 2,
            straggler=r == 3,
        )
        for r in range(4)
    ]
    return HealthSummary(
        run_id=run_id,
        attempt=2,
        time=time,
        verdict="degraded",
        reasons=["rank 3 is a straggler (3.0× the median step time)"],
        backend="nccl",
        world_size=4,
        ranks=ranks,
        straggler=Straggler(rank=3, step_time_s=0.094, median_step_time_s=0.031, ratio=3.0),
        bandwidth=BandwidthView(
            busbw_gbps=142.5,
            algbw_gbps=95.0,
            size_bytes=64 * 2**20,
            step=1100,
            time=T0,
            baseline_gbps=180.0,
            baseline="NVLink 4",
        ),
        nccl_warnings=1,
        last_nccl_warning="NCCL WARN NET/IB : Got completion with error 12",
        gpu_trouble=[GpuTrouble(node="gpu-a02", gpu_index=1, xid=1, events=["XID 79"])],
        flops=flops(mfu),
    )


def fleet(clock: FixedClock | None = None, wall: FixedClock | None = None) -> FleetModel:
    """Three nodes (one real with trouble, one simulated, one offline) and two runs."""
    clock = clock or FixedClock()
    wall = wall or FixedClock(T0)
    targets = [target(1, "gpu-a01"), target(2, "gpu-a02"), target(3, "gpu-b01")]
    model = FleetModel(targets, clock=clock, wall=wall)
    a1, a2, b1 = (t.node.control for t in targets)
    # gpu-b01 was heard from once, 10 s ago: offline now.
    sim_gpus = [gpu(i, 40.0, 20.0, simulated=True) for i in range(4)]
    model.apply_event(b1, event("hw.gpu-b01", snapshot("gpu-b01", sim_gpus, simulated=True)))
    done = "cpu-ddp-0a1b2c"
    model.apply_event(
        b1,
        event(
            f"run.{done}.state",
            summary(done, [b1], 0, RunState.STOPPED, attempt=1, step=420, created=T0 - 3600),
        ),
    )
    clock.now += 10
    run = "pretrain-7b-3f9a2c"
    procs = [GpuProcess(pid=4100 + i, name="python", used_memory_bytes=60 * GIB) for i in range(2)]
    for seq in range(1, 31):  # thirty samples, so the sparklines have a history
        ramp = min(1.0, seq / 12)
        gpus = [
            gpu(i, (97.0 - i) * ramp, 1 + 60.0 * ramp, sm=(88.0 - i) * ramp, procs=[procs[i]])
            if i < 2
            else gpu(i, 2.0 + i, 0.5)
            for i in range(8)
        ]
        model.apply_event(a1, event("hw.gpu-a01", snapshot("gpu-a01", gpus, seq=seq), seq))
    model.apply_event(
        a2,
        event(
            "hw.gpu-a02",
            snapshot(
                "gpu-a02",
                [
                    gpu(0, 95.0, 60.0, throttle=["hw_thermal_slowdown"]),
                    gpu(1, 93.0, 60.0, xid=1),
                    *[gpu(i, 0.0, 0.5) for i in range(2, 7)],
                    gpu(7, None, 0, lost=True),
                ],
            ),
        ),
    )
    model.apply_event(
        a2,
        event(
            "node.gpu-a02.event",
            NodeEvent(
                node="gpu-a02",
                time=T0,
                kind="xid",
                severity="critical",
                gpu_index=1,
                message="GPU 1: XID 79 (GPU has fallen off the bus)",
            ),
        ),
    )
    nodes = [a1, a2]
    model.apply_event(a1, event(f"run.{run}.state", summary(run, nodes, 0)))
    model.apply_event(a2, event(f"run.{run}.state", summary(run, nodes, 1)))
    model.apply_metrics_history(run, MetricsReply(run_id=run, rows=metric_rows(), resumed_at=[700]))
    model.apply_event(
        a1,
        event(
            f"run.{run}.metrics",
            RunMetricsEvent(
                run_id=run,
                attempt=2,
                points=[{"step": 1181, "time": T0 + 140, "values": values(1181)}],
            ),
        ),
    )
    for i in range(12):  # node 0's health rounds: the MFU sparkline's history
        model.apply_health(health(run, 0.30 + 0.01 * i, T0 - 12 + i))
    model.apply_health(health(run))
    model.apply_log_chunk(
        LogChunk(
            run_id=run,
            node="gpu-a01",
            node_rank=0,
            attempt=2,
            offset=0,
            next_offset=400,
            size=400,
            lines=[
                "[default0]:resumed from /ckpt/step-699 at step 700",
                "[default0]:step 1170 loss 0.04512 lr 0.00035",
                "[default1]:NCCL WARN NET/IB : Got completion with error 12",
            ],
            ended=False,
        )
    )
    model.apply_event(
        a2,
        event(
            f"run.{run}.log",
            RunLogEvent(
                node="gpu-a02",
                node_rank=1,
                attempt=2,
                offset=900,
                lines=["[default1]:step 1171 slow data loader (rank 3)"],
            ),
        ),
    )
    model.apply_event(
        a1,
        event(
            f"run.{run}.log",
            RunLogEvent(
                node="gpu-a01",
                node_rank=0,
                attempt=2,
                offset=500,
                lines=["[default0]:step 1180 loss 0.04431 lr 0.00034"],
            ),
        ),
    )
    clock.now += 0.5
    return model
