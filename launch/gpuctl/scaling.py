"""`gpuctl scaling CONFIG --procs 1,2,4,8`: how a user's own job scales.

The spec runs at each count in turn, one short run per count through gpud, launched as
`gpuctl launch` launches (so GPU leases, the queue and gpud's cleanup apply): warm-up +
timed steps (`training.max_steps`), automatic restarts off. Throughput comes from each
run's own metrics and time per step from its heartbeats (`gpud.scaling.arithmetic` has the
arithmetic); the table or --json shows speedup and efficiency against the smallest
count, beside the speedup the training guides print. The result is saved as the spec's
baseline (`gpud.scaling.baselines`), which gputop's Run screen compares live runs with.

- A count whose launch is refused, or whose run fails before its last timed step, is
  reported in its row and the next count runs; the exit code is then 1 (2 for a spec a
  node cannot run, 3 for an unreachable node). What was measured is still saved.
- A script that ignores `training.max_steps` is stopped once it has logged the last timed
  step; a run still going after `--run-timeout` is stopped and reported.
- Ctrl-C stops the run in flight (`stop --force`: gpud kills every rank and checks that
  none is left), saves nothing and exits 130.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

import click

from gpud.commands.frontend import EXIT_INTERRUPTED
from gpud.efficiency.model import flops_text
from gpud.model.run import HealthSummary, RunState, gpus_by_node_text, samples_per_rank_step
from gpud.model.snapshot import NodeSnapshot
from gpud.scaling.arithmetic import (
    NodeHardware,
    ScalingPoint,
    ScalingResult,
    flops_mean,
    heartbeat_split,
    throughput,
    timed_window,
    with_ratios,
)
from gpud.scaling.baselines import BaselineFileError, save_baseline
from gpud.wire.client import Client, ClientError
from gpud.wire.node_messages import Empty
from gpud.wire.protocol import NODE_HW, RUN_HEALTH, RUN_METRICS
from gpud.wire.run_messages import MetricRow, MetricsReply, MetricsRequest, RunRef, RunStatus
from launch.gpuctl.context import (
    DEFAULT_NODE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Ctl,
    exit_code_for,
    fail,
    json_option,
)
from launch.gpuctl.follow import follow
from launch.gpuctl.launching import JoinFailed, overrides_option, start
from launch.gpuctl.output import emit_json, table
from launch.gpuctl.runref import FoundRun, find_run
from launch.sections import SpecError
from launch.spec import RunSpec, load_spec, parse_spec

#: A run still going this long after it logged its last timed step is stopped: its script
#: ignores training.max_steps (or its teardown hangs); the measurement is complete.
OVERRUN_S = 10.0
#: How long the metrics of a run that ended may take to reach node 0's store.
METRICS_SETTLE_S = 5.0


@dataclass(frozen=True)
class Count:
    """One point of the measurement: `nodes` nodes × `procs` processes each."""

    nodes: int
    procs: int

    @property
    def world(self) -> int:
        return self.nodes * self.procs

    def describe(self) -> str:
        procs = f"{self.world} process{'es' if self.world > 1 else ''}"
        return procs if self.nodes == 1 else f"{procs} ({self.nodes} nodes × {self.procs})"


def parse_counts(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """`1,2,4,8` → [1, 2, 4, 8] (sorted, each once)."""
    if value is None:
        return None
    try:
        counts = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected counts like 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise click.BadParameter(f"{value!r}: counts are whole numbers from 1")
    return counts


def powers_of_two(top: int) -> list[int]:
    """1, 2, 4, ... up to `top`, and `top` itself."""
    counts = [1]
    while counts[-1] * 2 <= top:
        counts.append(counts[-1] * 2)
    return sorted({*counts, top})


def plan(
    spec: RunSpec, addresses: list[str], procs: list[int] | None, nodes: list[int] | None
) -> list[Count]:
    """The counts to measure, smallest world first. An axis not named stays as the spec
    has it (all its nodes; its nproc_per_node), except that with neither named the
    processes go in powers of two up to the spec's nproc_per_node."""
    if procs is None:
        if spec.nproc_per_node == "auto":
            raise SpecError(f"{spec.name}: nproc_per_node is auto; give --procs (e.g. 1,2,4,8)")
        procs = [spec.nproc_per_node] if nodes is not None else powers_of_two(spec.nproc_per_node)
    nodes = nodes or [len(addresses)]
    if nodes[-1] > len(addresses):
        raise SpecError(
            f"--nodes {nodes[-1]}: the run has {len(addresses)} node(s) "
            "(the spec's `nodes`, or --node)"
        )
    counts = [Count(n, p) for n in nodes for p in procs]
    return sorted(counts, key=lambda c: (c.world, c.nodes))


def point_spec(spec: RunSpec, addresses: list[str], procs: int, max_steps: int) -> RunSpec:
    """The spec at one count: its first nodes, `procs` per node (and as many GPUs: a list
    is cut to its first `procs`), `max_steps` steps, no automatic restart."""
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["nodes"] = addresses
    data["nproc_per_node"] = procs
    if isinstance(spec.gpus, list):
        if len(spec.gpus) < procs:
            raise SpecError(
                f"{spec.name}: gpus lists {len(spec.gpus)} GPU(s), too few for {procs} processes"
            )
        data["gpus"] = spec.gpus[:procs]
    elif spec.gpus is not None:
        data["gpus"] = procs
    data.setdefault("training", {})["max_steps"] = max_steps
    data.setdefault("restart", {})["max_attempts"] = 0
    data.pop("elastic", None)  # a point measures its own count: it never shrinks
    return parse_spec(data, f"{spec.name} at {procs} process(es) per node")


# --------------------------------------------------------------------------- one run


@dataclass
class Settings:
    steps: int
    warmup: int
    queue: bool
    run_timeout_s: float

    @property
    def total(self) -> int:
        return self.warmup + self.steps


@dataclass
class InFlight:
    """The run being measured, for Ctrl-C to stop."""

    run: FoundRun | None = None


class Watch:
    """Sees each status while a run is followed: keeps health summaries once the run is
    past its warm-up, and stops a run that goes on past its last step or its time."""

    def __init__(self, ctl: Ctl, found: FoundRun, settings: Settings) -> None:
        self.ctl = ctl
        self.found = found
        self.settings = settings
        self.healths: list[HealthSummary] = []
        self.running_since: float | None = None  # a queued run's wait is not its time
        self.done_at: float | None = None
        self.stopped: str | None = None
        self.gpus: dict[int, list[int]] = {}  # node rank → GPUs, seen while it ran

    def __call__(self, status: RunStatus) -> None:
        run = status.run
        if run.state.terminal or self.stopped is not None:
            return
        self.gpus = {p.node_rank: p.gpus for p in status.parts if p.gpus} or self.gpus
        done = run.steps_done or 0
        if run.state is RunState.RUNNING and done > self.settings.warmup:
            try:
                with Client(self.found.coordinator, timeout_s=self.ctl.timeout) as client:
                    health = client.call(RUN_HEALTH, RunRef(run=run.id))
                if isinstance(health, HealthSummary) and health.attempt == run.attempt:
                    self.healths.append(health)
            except ClientError:
                pass  # one summary fewer; the follow loop deals with a lost node
        now = time.monotonic()
        if run.state is not RunState.QUEUED:
            self.running_since = self.running_since or now
        if done >= self.settings.total:
            self.done_at = self.done_at or now
            if now - self.done_at > OVERRUN_S:
                self._stop(f"still running {OVERRUN_S:.0f}s after its last timed step")
        elif self.running_since and now - self.running_since > self.settings.run_timeout_s:
            self._stop(f"not done after {self.settings.run_timeout_s:.0f}s (--run-timeout)")

    def _stop(self, why: str) -> None:
        self.stopped = why
        stop_run(self.ctl, self.found)


def stop_run(ctl: Ctl, found: FoundRun) -> None:
    try:
        with Client(found.coordinator, timeout_s=ctl.timeout) as client:
            client.stop_run(found.id, force=True)
    except ClientError as exc:
        click.echo(f"gpuctl: warning: could not stop {found.id}: {exc}", err=True)


#: Signals that stop the measurement as Ctrl-C does: a closed terminal or a `kill` must
#: not leave a run going that nobody waits for.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A stop signal waits until the block is done: a launch is either not sent, or its
    run is known and can be stopped."""
    pending: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            raise KeyboardInterrupt


def measure(
    ctl: Ctl,
    spec: RunSpec,
    count: Count,
    settings: Settings,
    in_flight: InFlight,
) -> tuple[ScalingPoint, int]:
    """One count: launch, follow, read its metrics; the point and its exit code."""
    point = ScalingPoint(
        nodes=count.nodes, procs_per_node=count.procs, world=count.world, state="refused"
    )
    targets = ctl.targets()
    try:
        with interrupts_deferred():
            reply, _ = start(ctl, spec, targets, queue=settings.queue or spec.queue)
            in_flight.run = find_run(ctl, reply.run.id)
    except ClientError as exc:
        return point.model_copy(update={"error": f"{targets[0].label}: {exc}"}), exit_code_for(exc)
    except JoinFailed as exc:
        return point.model_copy(update={"error": str(exc)}), exc.code
    found = in_flight.run
    if not ctl.json:
        click.echo(f"{spec.name}: {count.describe()}: {found.id}", err=True)
    watch = Watch(ctl, found, settings)
    follow(ctl, found, watch=watch)
    in_flight.run = None
    status = found.status
    point = point.model_copy(
        update={
            "run_id": found.id,
            "state": status.run.state.value,
            "gpus": gpus_by_node_text(watch.gpus),
        }
    )
    if not status.run.state.terminal:
        return point.model_copy(update={"error": "lost the run's nodes"}), EXIT_UNREACHABLE
    ran = status.attempts[-1].world_size if status.attempts else None
    if ran is not None and ran != count.world:  # never a slower run: another shape
        why = f"ran with {ran} process(es), not {count.world}"
        return point.model_copy(update={"error": why}), EXIT_FAILED
    window = timed_window(_rows(ctl, found, settings), settings.warmup, settings.total - 1)
    if window is None or window.steps < settings.steps:
        why = watch.stopped or status.run.reason or f"ended {status.run.state.value}"
        return point.model_copy(update={"error": why}), EXIT_FAILED
    value, unit, source = throughput(
        window, count.world, samples_per_rank_step(spec.training.model_dump())
    )
    split = heartbeat_split(watch.healths, settings.warmup)
    flops = flops_mean(watch.healths, settings.warmup)
    measured = {
        "steps": window.steps,
        "seconds": window.seconds,
        "steps_per_s": window.steps_per_s,
        "throughput": value,
        "unit": unit,
        "source": source,
        "heartbeats": split.samples if split else 0,
        "step_time_s": split.step_time_s if split else None,
        "collective_s": split.collective_s if split else None,
        "compute_s": split.compute_s if split else None,
        "flops_per_second": flops.flops_per_second,
        "mfu": flops.mfu,
        "mfu_why_not": flops.why_not,
    }
    if status.run.state is RunState.FAILED:
        measured["error"] = f"after its last timed step: {status.run.reason}"
    return point.model_copy(update=measured), EXIT_OK


def _rows(ctl: Ctl, found: FoundRun, settings: Settings) -> list[MetricRow]:
    """The run's metric rows, once node 0 holds its last timed step (or after a while)."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    rows: list[MetricRow] = []
    while True:
        try:
            with Client(found.coordinator, timeout_s=max(ctl.timeout, 15.0)) as client:
                reply = client.call(RUN_METRICS, MetricsRequest(run=found.id, limit=1_000_000))
            assert isinstance(reply, MetricsReply)
            rows = list(reply.rows)
            if any(r.step >= settings.total - 1 for r in reply.rows):
                return rows
        except ClientError:
            pass
        if time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


# --------------------------------------------------------------------------- the command


def hardware(ctl: Ctl) -> list[NodeHardware]:
    """What each node is, from its daemon; an unreachable node ends the command here,
    before anything started."""
    found = []
    for target in ctl.targets():
        try:
            with Client(target, timeout_s=ctl.timeout) as client:
                info = client.node_info()
                snapshot = client.call(NODE_HW, Empty())
        except ClientError as exc:
            fail(f"{target.label}: {exc}", exit_code_for(exc))
        assert isinstance(snapshot, NodeSnapshot)
        found.append(
            NodeHardware(
                node=info.node,
                control=target.label,
                gpu_name=info.gpu_name if info.gpu_count else None,
                gpu_count=info.gpu_count,
                simulated=info.simulated,
                cpu_count=snapshot.host.cpu_count_logical,
            )
        )
    return found


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _mfu(point: ScalingPoint) -> str:
    """`41.2%`; `n/a` (the reason is above the table) where the count has FLOP/s only."""
    if point.mfu is not None:
        return f"{point.mfu * 100:.1f}%"
    return "n/a" if point.mfu_why_not else "-"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def render(result: ScalingResult) -> list[str]:
    """The table, with what it was measured on and how throughput was read above it."""
    where = "; ".join(h.describe() for h in result.hardware)
    lines = [f"{result.name}: {result.steps} steps timed after {result.warmup} warm-up, on {where}"]
    base = result.base
    if base is not None:
        lines.append(f"throughput: {base.source}")
    why = next((p.mfu_why_not for p in result.points if p.mfu_why_not), None)
    if why is not None:
        lines.append(f"MFU n/a: {why}")
    rows = []
    for p in result.points:
        guide = p.guide_speedup
        if p.run_id is None:
            run = f"refused: {p.error}"
        elif p.error:
            run = f"{p.run_id} {p.state}: {p.error}"
        else:
            run = p.run_id
        rows.append(
            [
                str(p.world),
                str(p.nodes),
                "-" if p.throughput is None else f"{_number(p.throughput)} {p.unit}",
                "-" if p.speedup is None else f"{p.speedup:.2f}×",
                "-" if p.efficiency is None else f"{p.efficiency * 100:.0f}%",
                "-" if guide is None else f"{guide[0]:.1f}–{guide[1]:.1f}×",
                flops_text(p.flops_per_second),
                _mfu(p),
                _ms(p.step_time_s),
                _ms(p.compute_s),
                _ms(p.collective_s),
                run,
            ]
        )
    headers = [
        "PROCS",
        "NODES",
        "THROUGHPUT",
        "SPEEDUP",
        "EFFICIENCY",
        "GUIDES",
        "FLOP/S",
        "MFU",
        "STEP TIME",
        "COMPUTE",
        "COLLECTIVES",
        "RUN",
    ]
    return [*lines, "", table(headers, rows)]


@click.command("scaling")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--procs",
    callback=parse_counts,
    metavar="N,N,...",
    help="Processes per node to measure, e.g. 1,2,4,8 [powers of two up to the spec's "
    "nproc_per_node; with --nodes, the spec's nproc_per_node].",
)
@click.option(
    "--nodes",
    "node_counts",
    callback=parse_counts,
    metavar="N,N,...",
    help="Node counts to measure, e.g. 1,2: the first N of the spec's nodes (or of --node) "
    "[all of them].",
)
@click.option(
    "--steps",
    default=100,
    show_default=True,
    type=click.IntRange(min=2),
    help="Steps timed per run, after the warm-up.",
)
@click.option(
    "--warmup",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Steps left out first (compilation, NCCL set-up, caches).",
)
@overrides_option
@click.option("--queue", is_flag=True, help="Wait for busy GPUs instead of being refused.")
@click.option(
    "--run-timeout",
    default=1800.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds one run may take (not counting a wait in the queue) before it is stopped"
    " and reported.",
)
@click.option("--no-save", is_flag=True, help="Do not keep the result as the spec's baseline.")
@json_option
@click.pass_obj
def scaling_command(
    ctl: Ctl,
    config: Path,
    procs: list[int] | None,
    node_counts: list[int] | None,
    steps: int,
    warmup: int,
    overrides: tuple[str, ...],
    queue: bool,
    run_timeout: float,
    no_save: bool,
) -> None:
    """Run CONFIG at each process count in turn; throughput, speedup and efficiency.

    \b
    Saved as the spec's baseline ($GPUD_CONFIG_DIR/scaling.json) for gputop.
    Exit codes: 0 every count measured, 1 a run failed or was refused,
    2 usage or spec error, 3 a node is unreachable, 130 interrupted.
    """
    try:
        spec = load_spec(config, list(overrides))
        if spec.slurm is not None:
            raise SpecError(f"{config}: scaling runs through gpud; drop the spec's slurm: section")
        addresses = list(ctl.nodes or spec.nodes or [DEFAULT_NODE])
        counts = plan(spec, addresses, procs, node_counts)
        settings = Settings(steps, warmup, queue, run_timeout)
        specs = {c: point_spec(spec, addresses[: c.nodes], c.procs, settings.total) for c in counts}
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    for sig in STOP_SIGNALS[1:]:
        signal.signal(sig, _interrupt)
    used = replace(ctl, nodes=addresses[: max(c.nodes for c in counts)])
    nodes = hardware(used)
    in_flight = InFlight()
    points: list[ScalingPoint] = []
    codes: list[int] = []
    try:
        for count in counts:
            point_ctl = replace(ctl, nodes=addresses[: count.nodes])
            point, code = measure(point_ctl, specs[count], count, settings, in_flight)
            points.append(point)
            codes.append(code)
    except KeyboardInterrupt:
        interrupted(ctl, in_flight)
    result = ScalingResult(
        name=spec.name,
        measured_at=time.time(),
        steps=steps,
        warmup=warmup,
        samples_per_rank_step=samples_per_rank_step(spec.training.model_dump()),
        hardware=nodes,
        points=with_ratios(points),
    )
    saved: Path | None = None
    save_error: str | None = None
    if result.base is not None and not no_save:
        try:
            saved = save_baseline(result)
        except (BaselineFileError, OSError) as exc:
            save_error = str(exc)
    if ctl.json:
        emit_json({"scaling": result, "saved_to": str(saved) if saved else None})
    else:
        click.echo("\n".join(render(result)))
        if saved is not None:
            click.echo(f"saved as the baseline of {spec.name} in {saved}")
        elif result.base is None:
            click.echo("nothing was measured; no baseline saved")
    if save_error is not None:
        fail(f"the baseline was not saved: {save_error}", EXIT_USAGE)
    sys.exit(EXIT_UNREACHABLE if EXIT_UNREACHABLE in codes else max(codes, default=EXIT_OK))


def interrupted(ctl: Ctl, in_flight: InFlight) -> NoReturn:
    """Ctrl-C (or SIGTERM, SIGHUP): stop the run in flight and wait until it has ended;
    nothing is saved."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not leave the run going
    found = in_flight.run
    if found is not None:
        click.echo(f"gpuctl: interrupted; stopping {found.id}", err=True)
        stop_run(ctl, found)
        follow(replace(ctl, json=True), found)
        click.echo(f"gpuctl: {found.id} {found.status.run.state.value}", err=True)
    click.echo("gpuctl: interrupted; nothing saved", err=True)
    sys.exit(EXIT_INTERRUPTED)
