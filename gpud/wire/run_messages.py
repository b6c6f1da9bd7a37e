"""The bodies of the run methods: launch, join, stop, resume and start; the peer methods
node 0 sends a part (start, reserve, release, stop, status, preflight); and what comes
back (`RunSummary`, `RunStatus`, `LaunchReply`, logs, metrics, a part's health).

Pure models; `gpud.wire.protocol` pairs each with its method and role.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, computed_field

from gpud.efficiency.goodput import Goodput
from gpud.efficiency.model import RunFlops
from gpud.model.run import (
    Attachment,
    AttemptRecord,
    CheckpointRef,
    FailureCause,
    GpuTrouble,
    NodeRef,
    RankView,
    RunEvent,
    RunState,
    completed_steps,
)
from gpud.model.snapshot import Reading
from gpud.wire.envelope import Message, _redact_spec

# --------------------------------------------------------------------------- runs

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"


class NodeRefIn(Message):
    """A node of a run, as gpuctl names it in a launch."""

    control: str = Field(max_length=300)
    server_key: str | None = Field(None, min_length=40, max_length=40)
    name: str | None = Field(None, max_length=128)


class LaunchRequest(Message):
    """gpuctl → node 0: create a run, lease its MASTER_PORT, start node 0's part."""

    spec: dict[str, Any] = Field(description="the run spec, resolved by gpuctl")
    nodes: list[NodeRefIn] = Field(min_length=1, max_length=4096)
    dry_run: bool = False
    queue: bool = Field(False, description="wait in the queue when the GPUs are busy")
    start_by_call: bool = Field(
        False,
        description="a run of several nodes starts when gpuctl says every node joined"
        " (run.start), after its preflight; without it node 0's part starts at once",
    )

    def audited(self) -> dict[str, Any]:
        return _redact_spec(super().audited())


class JoinRequest(Message):
    """gpuctl → node N: start this node's part of a run node 0 created."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    spec: dict[str, Any]
    nodes: list[NodeRefIn] = Field(min_length=2, max_length=4096)
    node_rank: int = Field(ge=1)
    master_addr: str = Field(min_length=1, max_length=255)
    master_port: int | None = Field(None, ge=1, le=65535, description="None: queued")
    attempt: int = Field(1, ge=1)
    dry_run: bool = False
    queued_at: float | None = Field(
        None, description="the run is queued on node 0 since then: join its queue, start nothing"
    )
    standby: bool = Field(
        False, description="a spare (elastic.spares): join, and start nothing until node 0 asks"
    )
    hold: bool = Field(
        False,
        description="with queued_at: its GPUs must be free now (not queued), but node 0"
        " starts its part (run.start, after the preflight)",
    )

    def audited(self) -> dict[str, Any]:
        return _redact_spec(super().audited())


class PartStartRequest(Message):
    """node 0 → node N: start a new attempt of a run already joined (resume, restart)."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    attempt: int = Field(ge=1)
    master_addr: str = Field(min_length=1, max_length=255)
    master_port: int = Field(ge=1, le=65535)
    resume_from: str | None = Field(None, max_length=4096)
    members: list[int] | None = Field(
        None, max_length=4096, description="the run's nodes in this attempt (None: all)"
    )
    grad_accum: int | None = Field(None, ge=1, description="elastic: accumulation to use")


class PartReserveRequest(Message):
    """node 0 → node N: lease this part's GPUs for the attempt, or say why not (all or
    none: node 0 releases what the other nodes gave when one cannot)."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    attempt: int = Field(ge=1)
    queued_at: float = Field(description="the run's place in every node's queue")
    queue: bool = Field(False, description="the run waits in the queue if this fails")


class PartReleaseRequest(Message):
    """node 0 → node N: give back the attempt's reservation; `cancel`: the queued run was
    stopped, so it leaves this node's queue too."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    attempt: int = Field(ge=1)
    cancel: str | None = Field(None, max_length=500, description="why the run was cancelled")


class PartReservation(Reading):
    node: str
    gpus: list[int] = Field(default_factory=list, description="GPU indices leased (or freed)")


class PartStopRequest(Message):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    force: bool = False
    reason: str = Field("stopped by the coordinator", max_length=500)
    failed: bool = Field(
        False, description="another part failed or was lost: the part ends `failed`, fast"
    )
    dump: bool = Field(
        False, description="a hang: ask the trainers for a flight-recorder dump first"
    )


class PartStatusRequest(Message):
    run_id: str = Field(pattern=RUN_ID_PATTERN)


class PartPreflightRequest(Message):
    """node 0 → node N: run the attempt's collective check (`trainers.preflight`), meeting
    the others at `master`, as rank `rank` of `world`."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    attempt: int = Field(ge=1)
    master: str = Field(max_length=300, description="HOST:PORT of node 0's check")
    world: int = Field(ge=2, le=4096)
    rank: int = Field(ge=0, le=4095)


class PartPreflight(Reading):
    """What one node's part of the collective check found."""

    node_rank: int
    ok: bool
    error: str | None = Field(None, description="why it failed, or could not run")
    seconds: float | None = None
    pairs: dict[int, float] = Field(
        default_factory=dict, description="node 0's: each check rank's all-reduce, GB/s"
    )
    gpu_failures: list[str] = Field(default_factory=list, description="matmul or memory test")
    failed_gpus: list[int] = Field(
        default_factory=list, description="the GPUs (this node's indices) that failed it"
    )


class GangStatus(Reading):
    """node 0's answer to one of the run's other nodes (`run.gang.status`): where node 0
    has the run, and the stop it wants of the other parts, if any. A node that was frozen
    or cut off while node 0 stopped the run learns from it to stop its part itself."""

    run_id: str
    state: RunState
    attempt: int
    reason: str | None = None
    stop: PartStopRequest | None = Field(
        None, description="what node 0 asked of the other parts of this attempt"
    )
    members: list[int] | None = Field(
        None, description="the nodes of node 0's attempt (indices; None: all, or an older node 0)"
    )


class RunRef(Message):
    """A run by id or by name (the newest run of that name)."""

    run: str = Field(min_length=1, max_length=128)


class StopRequest(RunRef):
    force: bool = Field(False, description="no handshake or grace: SIGKILL at once")


class ResumeRequest(RunRef):
    queue: bool = Field(False, description="wait in the queue when the GPUs are busy")
    checkpoint: str | None = Field(
        None,
        max_length=4096,
        description="start from this checkpoint (absolute path), not the run's latest",
    )


class RunStartRequest(RunRef):
    """gpuctl → node 0: every node joined the run launched with `start_by_call`: start its
    first attempt (the preflight first), or queue it with `queue`."""

    queue: bool = Field(False, description="wait in the queue when the GPUs are busy")


class ListRequest(Message):
    active_only: bool = False
    limit: int = Field(200, ge=1, le=1000)


class LogsRequest(RunRef):
    attempt: int | None = Field(None, ge=1, description="default: the latest")
    offset: int | None = Field(None, ge=0, description="byte offset to read from")
    tail_lines: int | None = Field(
        None, ge=1, le=100_000, description="start at the last N lines (of `rank`, if given)"
    )
    max_bytes: int = Field(256 * 1024, ge=1, le=4 * 1024 * 1024)
    rank: int | None = Field(None, ge=0, description="global rank to keep")


class PartView(Reading):
    """One node's part of the current attempt, as node 0 last saw it."""

    node_rank: int
    node: NodeRef
    state: RunState | None = Field(None, description="None: not heard from yet")
    reason: str | None = None
    seen_at: float | None = None
    error: str | None = Field(None, description="why the node could not be asked")
    gpus: list[int] = Field(default_factory=list, description="GPU indices the part holds")
    cause: FailureCause | None = Field(None, description="why it failed, as its node found")
    flight_recorder: list[str] = Field(
        default_factory=list, description="what its flight-recorder dumps showed"
    )
    left_out: str | None = Field(
        None,
        description="why the current attempt goes on without this node (an elastic run);"
        " None: it is in the attempt",
    )


class RunSummary(Reading):
    id: str
    name: str
    state: RunState
    state_since: float
    reason: str | None = None
    attempt: int
    restarts: int = 0
    created_at: float
    node_rank: int
    nodes: list[NodeRef]
    nproc: int | None = Field(None, description="processes on this node (current attempt)")
    gpus: list[int] = Field(
        default_factory=list, description="GPU indices leased on this node (current attempt)"
    )
    launcher: str
    last_step: int | None = Field(
        None, description="0-based index of the last completed step (the trainer's loop index)"
    )
    max_steps: int | None = Field(None, description="training.max_steps: the total to reach")
    last_values: dict[str, float] = Field(default_factory=dict)
    last_checkpoint: CheckpointRef | None = None
    next_restart_at: float | None = None
    queued_at: float | None = None
    queue_position: int | None = Field(None, description="1: next in this node's queue")
    cause: FailureCause | None = Field(None, description="why the latest failed attempt failed")
    start: str | None = Field(
        None, description="what the current attempt started from: a checkpoint and step, or scratch"
    )
    attached: Attachment | None = Field(
        None, description="a run gpud did not start (a Slurm job, a pod): gpud watches it only"
    )
    members: list[int] | None = Field(
        None, description="its nodes (indices into `nodes`) in the current attempt; None: all"
    )
    world_size: int | None = Field(None, description="ranks in the current attempt")
    elastic: bool = Field(False, description="its spec has `elastic:`")
    planned_nodes: int | None = Field(
        None, description="the nodes it was launched on (its spares not counted)"
    )
    goodput: Goodput | None = Field(
        None,
        description="node 0's account of its wall time by bucket, as last stored (every"
        " 10 s while it runs; `run.status` has it up to now)",
    )

    @property
    def state_label(self) -> str:
        """The state as every view writes it: `queued #2` is second in this node's queue."""
        if self.state is RunState.QUEUED and self.queue_position:
            return f"queued #{self.queue_position}"
        return self.state.value

    @computed_field(  # type: ignore[prop-decorator]
        description="steps done: last_step + 1; every view shows steps_done/max_steps"
    )
    @property
    def steps_done(self) -> int | None:
        return completed_steps(self.last_step)


class PartPlan(Reading):
    """What a node would run (dry run) or runs: the exact command and what gpud adds."""

    node_rank: int
    node: str
    gpus: list[int] = Field(
        default_factory=list, description="GPU indices the part gets here (none on CPU)"
    )
    argv: list[str]
    env: dict[str, str]
    cwd: str
    files: dict[str, str] = Field(default_factory=dict)
    unset: list[str] = Field(default_factory=list, description="variables removed (env -u)")


class LaunchReply(Reading):
    run: RunSummary
    master_addr: str
    master_port: int | None = Field(None, description="None: queued, chosen when it starts")
    plan: PartPlan | None = None
    warnings: list[str] = Field(
        default_factory=list, description="what in the spec will not work as meant: one line each"
    )
    start_by_call: bool = Field(
        False, description="node 0 waits for run.start once every node joined"
    )


class JoinReply(Reading):
    run: RunSummary
    plan: PartPlan | None = None


class RunList(Reading):
    runs: list[RunSummary]
    total: int | None = Field(
        None,
        description="runs of the kind asked for (active, or all) the node holds; `runs` is"
        " the newest `limit` of them. None from an older daemon",
    )


class RunStatus(Reading):
    run: RunSummary
    attempts: list[AttemptRecord]
    parts: list[PartView]
    events: list[RunEvent]
    flops: RunFlops | None = Field(
        None,
        description="node 0's latest: achieved FLOP/s and MFU while the run trains (None:"
        " it does not train now, or an older daemon)",
    )
    goodput: Goodput | None = Field(
        None,
        description="node 0's account of the run's wall time by bucket, up to now (None:"
        " not node 0, or an older daemon)",
    )


#: How a line starts that stands where a bounded log (`logs.max_bytes`) dropped lines, in
#: `LogChunk` and `run.<id>.log` lines alike; it says how many, how much and when. Views
#: keep it whatever their rank filter.
LOG_MARK_PREFIX = "[gpud] ---- "


def is_log_mark(line: str) -> bool:
    return line.startswith(LOG_MARK_PREFIX)


class LogChunk(Reading):
    run_id: str
    node: str
    node_rank: int
    attempt: int
    offset: int
    next_offset: int
    size: int
    lines: list[str]
    ended: bool = Field(description="the attempt is over: nothing more will be written")


class MetricsRequest(RunRef):
    name: str | None = Field(None, max_length=128, description="one metric, or all")
    attempt: int | None = Field(None, ge=1, description="one attempt, or all")
    limit: int = Field(100_000, ge=1, le=1_000_000)


class MetricRow(Reading):
    attempt: int
    step: int
    time: float
    values: dict[str, float]


class MetricsReply(Reading):
    run_id: str
    rows: list[MetricRow] = Field(description="in attempt and step order")
    resumed_at: list[int] = Field(
        default_factory=list, description="first step of each attempt after the first"
    )


def metrics_reply(run_id: str, rows: dict[tuple[int, int], MetricRow]) -> MetricsReply:
    """Rows keyed by (attempt, step), in order, with the first step of each later attempt."""
    ordered = [rows[key] for key in sorted(rows)]
    starts: dict[int, int] = {}
    for row in ordered:
        starts.setdefault(row.attempt, row.step)
    return MetricsReply(
        run_id=run_id,
        rows=ordered,
        resumed_at=[step for attempt, step in sorted(starts.items()) if attempt > 1],
    )


class PartHealth(Reading):
    """node N → node 0: this node's ranks and GPU trouble, for the run's health."""

    attempt: int
    node_rank: int
    ranks: list[RankView]
    gpu_trouble: list[GpuTrouble]
    nccl_warnings: int = 0
    last_nccl_warning: str | None = None
    output_age_s: float | None = Field(
        None, description="since this part last printed a line (or started, if never)"
    )
    library: bool | None = Field(None, description="whether its ranks use the trainers library")
