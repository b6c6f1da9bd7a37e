"""What trainers tell gpud beyond their state: heartbeats, probes, metrics history, health.

Owned by the supervisor and driven by its tick. Per run and node it tracks the ranks
(from heartbeats), the latest collective probe, NCCL trouble seen in the logs, and the
metrics file rank 0 writes (`metrics.jsonl`, tailed so nothing the ingest missed — gpud
was down, a queue overflowed — is lost). On node 0 it folds every node's ranks into the
run's health summary, published on `run.<id>.health` about once a second.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpud.efficiency.of_run import run_flops, run_gpus
from gpud.model.run import (
    TRAINING,
    BandwidthView,
    GpuTrouble,
    HealthSummary,
    MetricPoint,
    RankView,
    RunRecord,
    RunState,
)
from gpud.model.snapshot import NodeSnapshot
from gpud.model.trainer_messages import HeartbeatMessage, MetricsMessage, ProbeMessage
from gpud.runs.diagnosis.logparse import TROUBLE
from gpud.runs.health.stragglers import StragglerWatch
from gpud.runs.health.verdict import assess, assess_by_output, baseline_for
from gpud.wire.protocol import run_topic
from gpud.wire.run_messages import PartHealth
from launch.backends import resolve_backend
from launch.spec import RunSpec

if TYPE_CHECKING:
    from gpud.runs.state.book import RunBook
    from gpud.runs.state.part import Part

log = logging.getLogger("gpud.runs")

HEALTH_EVERY_S = 1.0
DUMPS_EVERY_S = 2.0
NCCL_KINDS = frozenset(p.kind for p in TROUBLE if p.kind != "gloo_error")
SLOWDOWN = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)


#: A script's pace (seconds per step) is taken over the steps it printed in this window.
PACE_WINDOW_S = 30.0
PACE_STEPS = 64
#: Heartbeats whose compute times make up a rank's window (about 5 s of them).
WINDOW = 10
#: A heartbeat this long after the rank's previous one (three intervals) ends a pause
#: (SIGSTOP, a frozen host): what it measured spans the pause, so it is no sample.
PAUSE_GAP_S = 1.5


@dataclass
class _Rank:
    beat: HeartbeatMessage
    received: float
    progress_at: float  # when its step last moved, on the daemon's clock
    computes: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))


@dataclass
class _RunTelemetry:
    attempt: int
    ranks: dict[int, _Rank] = field(default_factory=dict)
    probe: BandwidthView | None = None
    nccl_warnings: int = 0
    last_nccl_warning: str | None = None
    jsonl_offset: int = 0
    jsonl_partial: bytes = b""
    dumps: set[str] = field(default_factory=set)
    next_health: float = 0.0
    next_dumps: float = 0.0
    world_size: int | None = None
    stragglers: StragglerWatch = field(default_factory=StragglerWatch)
    output_at: float | None = None  # when this node's part last printed a line
    step: tuple[int, float] | None = None  # the newest metric step, and when it came
    #: The steps seen lately, and when: a script's pace where nothing beats.
    seen: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=PACE_STEPS))

    def pace(self, now: float) -> float | None:
        """Seconds per step over the steps seen in the last PACE_WINDOW_S (None: fewer
        than two, or none lately: a run that stopped stepping has no rate)."""
        recent = [(step, at) for step, at in self.seen if now - at <= PACE_WINDOW_S]
        if len(recent) < 2:
            return None
        (first, began), (last, ended) = recent[0], recent[-1]
        return (ended - began) / (last - first) if last > first and ended > began else None


class Telemetry:
    def __init__(self, book: RunBook, hardware: Callable[[], NodeSnapshot]) -> None:
        self.book = book
        self.hardware = hardware
        self.runs: dict[str, _RunTelemetry] = {}
        self.peer_health: dict[str, dict[int, PartHealth]] = {}
        self.health: dict[str, HealthSummary] = {}
        #: Called with each health summary node 0 makes of a running run (about once a
        #: second): gpud.notify's stall alerts.
        self.on_health: list[Callable[[RunRecord, HealthSummary], None]] = []

    def forget(self, run_id: str) -> None:
        """Let go of an ended run retention removed."""
        self.runs.pop(run_id, None)
        self.peer_health.pop(run_id, None)
        self.health.pop(run_id, None)

    def _of(self, run_id: str, attempt: int) -> _RunTelemetry:
        current = self.runs.get(run_id)
        if current is None or current.attempt != attempt:
            offset = current.jsonl_offset if current else 0
            current = self.runs[run_id] = _RunTelemetry(attempt=attempt, jsonl_offset=offset)
            self.peer_health.pop(run_id, None)
        return current

    # ------------------------------------------------------------------ inputs

    def heartbeat(self, run: RunRecord, message: HeartbeatMessage) -> None:
        now = self.book.clock()
        state = self._of(run.id, message.attempt)
        state.world_size = max(state.world_size or 0, message.world_size)
        old = state.ranks.get(message.rank)
        progress_at = now if old is None or old.beat.step != message.step else old.progress_at
        rank = _Rank(beat=message, received=now, progress_at=progress_at)
        if old is not None:
            rank.computes = old.computes
        moved = old is None or old.beat.step != message.step
        after_pause = old is not None and now - old.received > PAUSE_GAP_S
        if message.step_time_s is not None and moved and not after_pause:
            # One sample per heartbeat that saw progress (the trainer measures each interval
            # between heartbeats afresh): the median of a window over the last seconds, so
            # one noisy interval (a busy machine, a step that held a pause) makes no
            # straggler, while a rank slow in every interval is one within a few beats.
            rank.computes.append(max(0.0, message.step_time_s - (message.collective_s or 0.0)))
        state.ranks[message.rank] = rank

    def output(self, run: RunRecord, attempt: int) -> None:
        """This node's part printed: for the health of a script without heartbeats."""
        self._of(run.id, attempt).output_at = self.book.clock()

    def stepped(self, run: RunRecord, attempt: int, step: int) -> None:
        """A metric step (a pattern's or the library's): progress, where nothing beats."""
        state = self._of(run.id, attempt)
        if state.step is None or step > state.step[0]:
            state.step = (step, self.book.clock())
            state.seen.append(state.step)

    def probe(self, run: RunRecord, message: ProbeMessage) -> None:
        state = self._of(run.id, message.attempt)
        baseline = self._baseline(message.backend)
        state.probe = BandwidthView(
            busbw_gbps=round(message.busbw_gbps, 3),
            algbw_gbps=round(message.algbw_gbps, 3),
            size_bytes=message.size_bytes,
            step=message.step,
            time=message.time,
            baseline_gbps=baseline[0] if baseline else None,
            baseline=baseline[1] if baseline else None,
        )
        self.book.store.add_metrics(
            [
                MetricPoint(
                    run_id=run.id, attempt=message.attempt, step=message.step,
                    time=message.time,
                    values={"busbw_gbps": message.busbw_gbps, "algbw_gbps": message.algbw_gbps},
                )
            ]
        )  # fmt: skip

    def trouble(self, run: RunRecord, attempt: int, kind: str, text: str) -> None:
        if kind in NCCL_KINDS:
            state = self._of(run.id, attempt)
            state.nccl_warnings += 1
            state.last_nccl_warning = text[:300]

    def _baseline(self, backend: str) -> tuple[float, str] | None:
        if backend != "nccl":
            return None
        snapshot = self.hardware()
        if snapshot.backend != "nvml" or not snapshot.gpus:
            return None
        gpu = snapshot.gpus[0]
        nvlink = any(link.active for link in gpu.nvlinks or [])
        return baseline_for(gpu.name, nvlink, gpu.pcie_link_gen_max)

    # ------------------------------------------------------------------ this node

    def part_health(self, run: RunRecord, part: Part | None) -> PartHealth:
        """This node's ranks and GPU trouble for the run's current attempt."""
        attempt = part.record.attempt if part else run.attempt
        state = self._of(run.id, attempt)
        now = self.book.clock()
        snapshot = self.hardware()
        lease = set(part.record.gpu_uuids) if part else set()
        views = [self._view(run, rank, now, snapshot, lease) for rank in sorted(
                 state.ranks.values(), key=lambda r: r.beat.rank)]  # fmt: skip
        started = part.record.started_at if part and part.record.started_at else run.created_at
        return PartHealth(
            attempt=attempt,
            node_rank=run.node_rank,
            ranks=views,
            gpu_trouble=self._gpu_trouble(views, snapshot, started),
            nccl_warnings=state.nccl_warnings,
            last_nccl_warning=state.last_nccl_warning,
            output_age_s=round(now - (state.output_at or started), 2),
            library=part.record.library if part else None,
        )

    def _view(
        self, run: RunRecord, rank: _Rank, now: float, snapshot: NodeSnapshot, lease: set[str]
    ) -> RankView:
        beat = rank.beat
        return RankView(
            rank=beat.rank,
            # The rank's own word where it sends one: the same as this part's for a rank
            # gpud launched, and the only one for a rank it did not (a Kubernetes pod).
            node_rank=run.node_rank if beat.node_rank is None else beat.node_rank,
            local_rank=beat.local_rank,
            node=beat.node,
            host=beat.host,
            pid=beat.pid,
            last_step=beat.step,
            step_time_s=beat.step_time_s,
            collective_s=beat.collective_s,
            compute_s=round(statistics.median(rank.computes), 6) if rank.computes else None,
            phase=beat.phase,
            phase_for_s=round(max(0.0, beat.time - beat.phase_since) + (now - rank.received), 2),
            heartbeat_age_s=round(now - rank.received, 2),
            progress_age_s=round(now - rank.progress_at, 2) if beat.step is not None else None,
            gpu_uuid=beat.gpu_uuid,
            gpu_index=_gpu_index(beat, snapshot),
            outside_lease=bool(lease and beat.gpu_uuid and beat.gpu_uuid not in lease),
            flops_per_step=beat.flops_per_step,
        )

    def _gpu_trouble(
        self, views: list[RankView], snapshot: NodeSnapshot, since: float
    ) -> list[GpuTrouble]:
        indexes = sorted({v.gpu_index for v in views if v.gpu_index is not None})
        if not indexes:
            return []
        recent = self.book.store.node_events(500, since=since)
        events = [e for e in recent if e.gpu_index in indexes]
        by_index = {g.index: g for g in snapshot.gpus}
        troubles = []
        for index in indexes:
            mine = [e for e in events if e.gpu_index == index]
            gpu = by_index.get(index)
            slowed = sorted(SLOWDOWN.intersection(gpu.clock_event_reasons or ())) if gpu else []
            counts = {kind: sum(1 for e in mine if e.kind == kind) for kind in
                      ("xid", "nvlink_errors", "pcie_replays", "ecc_errors")}  # fmt: skip
            if not any(counts.values()) and not slowed:
                continue
            troubles.append(
                GpuTrouble(
                    node=self.book.node,
                    gpu_index=index,
                    xid=counts["xid"],
                    nvlink_errors=counts["nvlink_errors"],
                    pcie_replays=counts["pcie_replays"],
                    ecc_uncorrected=counts["ecc_errors"],
                    throttle=slowed,
                    events=[e.message for e in mine[-5:]],
                )
            )
        return troubles

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float) -> None:
        # Metrics the store had to drop while its disk was full: read rank 0's file again.
        reread = self.book.store.take_metrics_lost()
        for run_id in reread:
            lost = self.book.part(run_id)
            if lost is not None:
                lost.metrics_done = False
                self.book.part_busy_again()
        for run, part in self.book.busy_parts():
            run_id = run.id
            state = self._of(run_id, part.record.attempt)
            if run_id in reread:
                state.jsonl_offset, state.jsonl_partial = 0, b""
            if not part.metrics_done:
                read = self._backfill(run, state) if run.is_coordinator else 0
                part.metrics_done = part.record.state.terminal and not read
            if now >= state.next_dumps and not part.record.state.terminal:
                state.next_dumps = now + DUMPS_EVERY_S
                self._find_dumps(run, part, state)
            if run.is_coordinator and now >= state.next_health and not run.state.terminal:
                state.next_health = now + HEALTH_EVERY_S
                summary = self.assess(run, part)
                self.health[run_id] = summary
                self.book.publish(run_topic(run_id, "health"), summary)
                for hook in self.on_health:
                    try:
                        hook(run, summary)
                    except Exception:  # an alert about the health must not stop the tick
                        log.exception("run %s: a health hook failed", run_id)

    def set_peer_health(self, run_id: str, healths: dict[int, PartHealth]) -> None:
        """The other nodes' ranks, as node 0's gang last polled them."""
        self.peer_health[run_id] = healths

    def final(self, run: RunRecord) -> None:
        """Publish the run's final health once it ended: no stale "stalled" stays behind."""
        if not run.is_coordinator:
            return
        summary = self.assess(run, self.book.part(run.id))
        self.health[run.id] = summary
        self.book.publish(run_topic(run.id, "health"), summary)

    def assess(self, run: RunRecord, part: Part | None) -> HealthSummary:
        """The run's health now: every node's ranks on node 0, this node's elsewhere; while
        it trains, with its achieved FLOP/s and MFU (gpud.efficiency)."""
        summary = self._assess(run, part)
        if run.state not in TRAINING or not run.is_coordinator:
            return summary
        latest = self.book.store.latest_metrics(run.id)
        lease = part.record.gpu_uuids if part is not None else []
        state = self.runs.get(run.id)
        found = run_flops(
            self.book.spec(run),
            summary.ranks,
            summary.world_size,
            latest[1] if latest else {},
            run_gpus(run, lease, self.hardware()),
            state.pace(self.book.clock()) if state and state.attempt == summary.attempt else None,
        )
        return summary.model_copy(update={"flops": found})

    def _assess(self, run: RunRecord, part: Part | None) -> HealthSummary:
        local = self.part_health(run, part)
        parts = [local]
        if run.is_coordinator:
            parts += [
                p for p in self.peer_health.get(run.id, {}).values() if p.attempt == local.attempt
            ]
        ranks = sorted((r for p in parts for r in p.ranks), key=lambda r: r.rank)
        spec = self.book.spec(run)
        snapshot = self.hardware()
        real = len(snapshot.gpus) if snapshot.backend == "nvml" else 0
        state = self._of(run.id, local.attempt)
        world = state.world_size or len(ranks) or None
        heard = {r.rank for r in ranks}
        # Ranks never heard from still belong in the grid (and keep a stall from being
        # called during start-up).
        ranks += [
            RankView(rank=r, node_rank=-1, local_rank=-1)
            for r in range(world or 0)
            if r not in heard
        ]
        ranks.sort(key=lambda r: r.rank)
        warnings = sum(p.nccl_warnings for p in parts)
        last = next((p.last_nccl_warning for p in parts if p.last_nccl_warning), None)
        if not heard and run.state is RunState.RUNNING and not any(p.library for p in parts):
            # No rank beats: a script without the trainers library. Judge its output.
            now = self.book.clock()
            ages = [p.output_age_s for p in parts if p.output_age_s is not None]
            return assess_by_output(
                run_id=run.id,
                attempt=local.attempt,
                now=now,
                world_size=_world_of(spec, len(run.nodes)),
                quiet_s=min(ages) if ages else 0.0,
                step=(state.step[0], now - state.step[1]) if state.step else None,
                hang_timeout_s=spec.restart.hang_timeout_s,
                backend=resolve_backend(spec, real),
                timeout_s=float(spec.nccl.timeout_s) if spec.nccl.timeout_s else None,
                nccl_warnings=warnings,
                last_nccl_warning=last,
                gpu_trouble=[t for p in parts for t in p.gpu_trouble],
            )
        return assess(
            run_id=run.id,
            attempt=local.attempt,
            now=self.book.clock(),
            state=run.state,
            ranks=ranks,
            backend=resolve_backend(spec, real),
            world_size=world,
            timeout_s=float(spec.nccl.timeout_s) if spec.nccl.timeout_s else None,
            bandwidth=state.probe,
            nccl_warnings=warnings,
            last_nccl_warning=last,
            gpu_trouble=[t for p in parts for t in p.gpu_trouble],
            watch=state.stragglers,
        ).model_copy(update={"flight_recorder": _findings(run, local.attempt)})

    def _backfill(self, run: RunRecord, state: _RunTelemetry) -> int:
        """Read what rank 0 appended to metrics.jsonl since the last tick into the store;
        returns how many bytes that was."""
        path = os.path.join(run.run_dir, "metrics.jsonl")
        try:
            with open(path, "rb") as f:
                f.seek(state.jsonl_offset)
                data = f.read(1 << 20)
        except OSError:
            return 0
        if not data:
            return 0
        state.jsonl_offset += len(data)
        lines = (state.jsonl_partial + data).split(b"\n")
        state.jsonl_partial = lines.pop()
        points = []
        for line in lines:
            try:
                message = MetricsMessage.model_validate(json.loads(line))
            except (ValueError, ValidationError):
                continue  # a torn or foreign line: skip it, never stop reading
            points.append(
                MetricPoint(run_id=run.id, attempt=message.attempt, step=message.step,
                            time=message.time, values=message.values)
            )  # fmt: skip
        if points:
            self.book.store.add_metrics(points)
        return len(data)

    def _find_dumps(self, run: RunRecord, part: Part, state: _RunTelemetry) -> None:
        for path in glob.glob(os.path.join(part.record.attempt_dir, "nccl_trace_rank_*")):
            if path not in state.dumps:
                state.dumps.add(path)
                self.book.event(run, "flight_recorder_dump", f"NCCL flight recorder dump: {path}",
                               "warning", path=path)  # fmt: skip


def _world_of(spec: RunSpec, nodes: int) -> int | None:
    """The run's world size from its spec (None while `auto` is unresolved)."""
    if spec.launcher == "python":
        return nodes
    return spec.nproc_per_node * nodes if isinstance(spec.nproc_per_node, int) else None


def _gpu_index(beat: HeartbeatMessage, snapshot: NodeSnapshot) -> int | None:
    """The GPU a rank uses: by uuid on real GPUs; by local rank on simulated ones."""
    if beat.gpu_uuid:
        for gpu in snapshot.gpus:
            if gpu.uuid == beat.gpu_uuid:
                return gpu.index
    if snapshot.simulated and snapshot.gpus:
        return beat.local_rank % len(snapshot.gpus)
    return None


def _findings(run: RunRecord, attempt: int) -> list[str]:
    """What the flight recorder showed when this attempt failed (its final health)."""
    cause = run.cause
    return list(cause.flight_recorder) if cause and cause.attempt == attempt else []
