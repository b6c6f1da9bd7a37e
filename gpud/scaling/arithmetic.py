"""Scaling as data: what `gpuctl scaling` measured at each process count, and the
arithmetic that turns runs' own records into throughput, speedup and efficiency.

Pure (no I/O): the front end hands in the metric rows and health summaries its runs
produced; `gpud.scaling.baselines` stores the result; gputop compares a live run with it.

- **Throughput** comes from the run's own metrics, after the warm-up steps: the mean of a
  throughput the trainer logs (samples/s, else tokens/s), else the step rate × the
  samples every process trains per step (the spec's batch size × accumulation, as
  /metrics derives it), else the step rate × the processes (`rank-steps/s`: each
  process's step counted once). The step rate is the steps from the end of the last
  warm-up step to the end of the last step, over the time between them, as rank 0 logged
  them.
- **Speedup** is throughput over the smallest measured count's; **efficiency** is
  throughput(n) / ((n / n0) · throughput(n0)), that is throughput(n) / (n · throughput(1))
  when the smallest count is 1.
- **Time per step** is the heartbeats' (every rank's, about twice a second, over the steps
  after the warm-up): step time, time waiting in collectives, and compute as the rest.
- **MFU** (and achieved FLOP/s) is the mean of node 0's health rounds over the same steps
  (`gpud.efficiency`): at each count against that count's GPUs, so a falling MFU is the
  scaling loss in the hardware's terms.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import Field

from gpud.model.run import (
    SAMPLES_PER_S_NAMES,
    TOKENS_PER_S_NAMES,
    HealthSummary,
    logged_rate,
    step_rate_samples,
)
from gpud.model.snapshot import Reading
from gpud.wire.run_messages import MetricRow

#: The speedup the training guides print for 2, 4 and 8 GPUs against 1 (low, high).
#: Other counts have none: the guides give no figure, and none is made up between them.
GUIDE_SPEEDUP: dict[int, tuple[float, float]] = {2: (1.8, 1.9), 4: (3.2, 3.5), 8: (6.0, 6.5)}

SAMPLES = "samples/s"
TOKENS = "tokens/s"
#: Steps per second × processes: samples/s if every process took one sample per step.
RANK_STEPS = "rank-steps/s"


class NodeHardware(Reading):
    """A node a scaling run used, as its daemon described itself."""

    node: str = Field(description="the daemon's node name")
    control: str
    gpu_name: str | None = Field(None, description="the GPU model (None: no GPU)")
    gpu_count: int = 0
    simulated: bool = False
    cpu_count: int | None = None

    def describe(self) -> str:
        """`node0: 8× NVIDIA H100 80GB HBM3` or `node0: no GPU, 2 CPUs`."""
        cpus = f", {self.cpu_count} CPUs" if self.cpu_count else ""
        if not self.gpu_count:
            return f"{self.node}: no GPU{cpus}"
        simulated = " (simulated)" if self.simulated else ""
        return f"{self.node}: {self.gpu_count}× {self.gpu_name or 'GPU'}{simulated}"

    def same_kind(self, gpu_name: str | None, simulated: bool) -> bool:
        return (self.gpu_name, self.simulated) == (gpu_name, simulated)


class ScalingPoint(Reading):
    """One process count: the run that measured it, and what it measured."""

    nodes: int = Field(description="nodes the run used")
    procs_per_node: int
    world: int = Field(description="processes in all")
    run_id: str | None = Field(None, description="None: the launch was refused")
    state: str = Field(description="how the run ended: succeeded, failed, stopped, refused")
    error: str | None = Field(None, description="why this count has no measurement")
    gpus: str = Field("-", description="the GPUs the run held (`0-3`, `n0:0-3 n1:0-3`)")
    steps: int | None = Field(None, description="steps timed, after the warm-up")
    seconds: float | None = Field(None, description="the time they took")
    steps_per_s: float | None = None
    throughput: float | None = None
    unit: str | None = Field(None, description="samples/s, tokens/s or rank-steps/s")
    source: str | None = Field(None, description="where the throughput comes from")
    speedup: float | None = Field(None, description="throughput over the smallest count's")
    efficiency: float | None = Field(None, description="speedup over the linear one")
    guide_speedup: tuple[float, float] | None = Field(
        None, description="what the training guides expect (low, high), against 1 process"
    )
    step_time_s: float | None = Field(None, description="heartbeats' mean time per step")
    compute_s: float | None = Field(None, description="step time less collectives")
    collective_s: float | None = Field(None, description="time per step in collectives")
    heartbeats: int = Field(0, description="health summaries the step times come from")
    flops_per_second: float | None = Field(
        None, description="achieved FLOP/s, mean of node 0's rounds after the warm-up"
    )
    mfu: float | None = Field(None, description="MFU, 0 to 1, mean of the same rounds")
    mfu_why_not: str | None = Field(None, description="why MFU is n/a at this count")

    @property
    def measured(self) -> bool:
        return self.throughput is not None


class ScalingResult(Reading):
    """What `gpuctl scaling` prints with --json, and keeps as the spec's baseline."""

    name: str = Field(description="the spec's name: the baseline's key")
    measured_at: float
    steps: int = Field(description="steps timed per run, after the warm-up")
    warmup: int
    samples_per_rank_step: int | None = Field(
        None, description="batch size per process × gradient accumulation, from the spec"
    )
    hardware: list[NodeHardware] = Field(default_factory=list)
    points: list[ScalingPoint] = Field(default_factory=list)

    @property
    def base(self) -> ScalingPoint | None:
        """The smallest count that was measured: what speedups are against."""
        return next((p for p in self.points if p.measured), None)


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Window:
    """The timed steps of one run, from its metric rows."""

    steps: int
    seconds: float
    logged: dict[str, float]  # mean of each throughput metric over those steps

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds


def timed_window(rows: Sequence[MetricRow], warmup: int, last_step: int) -> Window | None:
    """The steps after the first `warmup` ones, up to the step of index `last_step`: from
    the end of the last warm-up step (the first step logged at or after it) to the end of
    the last step logged. Rows of the latest attempt only. None when fewer than two such
    steps were logged."""
    if not rows:
        return None
    attempt = max(r.attempt for r in rows)
    timed = sorted(
        (r for r in rows if r.attempt == attempt and warmup - 1 <= r.step <= last_step),
        key=lambda r: r.step,
    )
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    steps, seconds = last.step - first.step, last.time - first.time
    if steps <= 0 or seconds <= 0:
        return None
    after = [r for r in timed if r.step > first.step]
    names = [
        n for n in (*SAMPLES_PER_S_NAMES, *TOKENS_PER_S_NAMES) if any(n in r.values for r in after)
    ]
    logged = {n: statistics.fmean(r.values[n] for r in after if n in r.values) for n in names}
    return Window(steps, seconds, logged)


def throughput(window: Window, world: int, per_rank_step: int | None) -> tuple[float, str, str]:
    """(value, unit, where it comes from): a logged samples/s, else a logged tokens/s, else
    the step rate × the batch, else the step rate × the processes."""
    for names, unit in ((SAMPLES_PER_S_NAMES, SAMPLES), (TOKENS_PER_S_NAMES, TOKENS)):
        found = logged_rate(window.logged, names)
        if found is not None:
            return found[1], unit, f"{found[0]} logged by the trainer (mean)"
    derived = step_rate_samples(1.0 / window.steps_per_s, world, per_rank_step)
    if derived is not None:
        return derived, SAMPLES, f"step rate × {per_rank_step} samples per process per step"
    return window.steps_per_s * world, RANK_STEPS, "step rate × processes (no batch size)"


@dataclass(frozen=True)
class Split:
    """Time per step from the heartbeats, averaged per step (see `heartbeat_split`)."""

    samples: int
    step_time_s: float
    collective_s: float

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_time_s - self.collective_s)


def heartbeat_split(healths: Iterable[HealthSummary], warmup: int) -> Split | None:
    """From health summaries taken while the run trained: those where every rank is past
    the warm-up (the first such one left out when there are more: its heartbeats may
    still hold warm-up steps), each summary once, the ranks' mean in each.

    Each summary holds the latest heartbeat interval (about 0.5 s of wall time) and its
    time per step. Intervals of equal length hold fewer slow steps than fast ones, so the
    plain mean of their step times counts a slow stretch too much (on a busy machine, 2×
    what the steps took); each is weighted by the steps it holds (1 / its step time)."""
    seen: set[float] = set()
    kept: list[tuple[float, float]] = []
    for health in sorted(healths, key=lambda h: h.time):
        ranks = [r for r in health.ranks if r.step_time_s is not None]
        if health.time in seen or not ranks:
            continue
        if any(r.last_step is None or r.last_step < warmup for r in ranks):
            continue
        seen.add(health.time)
        kept.append(
            (
                statistics.fmean(r.step_time_s or 0.0 for r in ranks),
                statistics.fmean(r.collective_s or 0.0 for r in ranks),
            )
        )
    if len(kept) > 1:
        kept = kept[1:]
    if not kept:
        return None
    kept = [k for k in kept if k[0] > 0]
    if not kept:
        return None
    weights = [1.0 / step for step, _ in kept]
    return Split(
        samples=len(kept),
        step_time_s=len(kept) / sum(weights),
        collective_s=sum(w * c for w, (_, c) in zip(weights, kept, strict=True)) / sum(weights),
    )


@dataclass(frozen=True)
class FlopsMean:
    """Achieved FLOP/s and MFU over the timed steps (see `flops_mean`)."""

    flops_per_second: float | None
    mfu: float | None
    why_not: str | None


def flops_mean(healths: Iterable[HealthSummary], warmup: int) -> FlopsMean:
    """The mean FLOP rate and MFU of node 0's rounds (`HealthSummary.flops`) once every
    rank is past the warm-up, each round once; why MFU is n/a when it is (the latest
    round's reason)."""
    seen: set[float] = set()
    rounds = []
    for health in sorted(healths, key=lambda h: h.time):
        ranks = health.ranks
        if health.time in seen or health.flops is None or not ranks:
            continue
        if any(r.last_step is None or r.last_step < warmup for r in ranks):
            continue
        seen.add(health.time)
        rounds.append(health.flops)
    rates = [f.flops_per_second for f in rounds if f.flops_per_second is not None]
    mfus = [f.mfu for f in rounds if f.mfu is not None]
    return FlopsMean(
        flops_per_second=statistics.fmean(rates) if rates else None,
        mfu=statistics.fmean(mfus) if mfus else None,
        why_not=None if mfus or not rounds else rounds[-1].why_not,
    )


# --------------------------------------------------------------------------- across runs


def with_ratios(points: Sequence[ScalingPoint]) -> list[ScalingPoint]:
    """Speedup and efficiency against the smallest measured count (the points in order of
    world size), and the guides' speedup where that count is 1 process."""
    ordered = sorted(points, key=lambda p: (p.world, p.nodes))
    base = next((p for p in ordered if p.measured), None)
    out = []
    for point in ordered:
        if base is None or base.throughput is None or point.throughput is None:
            out.append(point)
            continue
        changes: dict[str, object] = {}
        if point.unit == base.unit:
            linear = point.world / base.world
            changes["speedup"] = point.throughput / base.throughput
            changes["efficiency"] = point.throughput / (linear * base.throughput)
        if base.world == 1:
            changes["guide_speedup"] = GUIDE_SPEEDUP.get(point.world)
        out.append(point.model_copy(update=changes))
    return out


# --------------------------------------------------------------------------- a live run


@dataclass(frozen=True)
class LiveEfficiency:
    """A live run's throughput against its spec's baseline."""

    efficiency: float
    world: int
    baseline: ScalingResult
    #: Set when the baseline was measured on other hardware: what it was measured on.
    other_hardware: str | None = None


def live_efficiency(baseline: ScalingResult, rate: float, unit: str, world: int) -> float | None:
    """Efficiency against linear of a live run: its throughput over (world / n0) × the
    baseline's throughput at its smallest count n0. gputop's rate is the trainer's
    samples/s or tokens/s, compared with a baseline in the same unit; or steps/s, which
    holds the same ratio as long as each process trains as many samples per step as in
    the baseline (the global batch grows with the world): then throughput(n) / (n/n0 ·
    throughput(n0)) = steps/s(n) / steps/s(n0)."""
    base = baseline.base
    if base is None or base.throughput is None or world < 1 or rate <= 0:
        return None
    if unit == "steps/s":
        return rate / base.steps_per_s if base.steps_per_s else None
    if unit != base.unit:
        return None
    return rate / (world / base.world * base.throughput)
