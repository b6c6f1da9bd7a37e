"""The wire protocol: every message between gpud, gpuctl, gputop and trainers.

Control (ROUTER/DEALER) carries one request envelope and one reply envelope:

    request  {"v": 1, "id": "…", "type": "node.hw", "body": {…}}
    reply    {"v": 1, "id": "…", "ok": true,  "body": {…}}
             {"v": 1, "id": "…", "ok": false, "error": {"code": "forbidden", "message": "…"}}

Events (PUB/SUB) are two frames: the topic, then `{"v", "topic", "seq", "time", "body"}`.

Compatibility (docs/DESIGN.md, "Compatibility"): every message is read leniently: a field
the reader does not know is ignored, a field it knows that is missing takes its default,
and a kind it does not know (a node event's, a trainer message's) is skipped and counted.
Types, sizes and patterns stay checked, and so does what a person wrote (a run spec). A
sender leaves out every field at its default, so an older peer sees a field added since
only when it is used; a feature an older peer lacks is used only once its protocol
version says it has it. `PROTOCOL_VERSION` moves on its own, apart from the package
version; a daemon serves requests of `MIN_PROTOCOL` to `PROTOCOL_VERSION`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from gpud import __version__
from gpud.efficiency.goodput import Goodput
from gpud.efficiency.model import RunFlops
from gpud.model.run import (
    Attachment,
    AttemptRecord,
    CheckpointRef,
    FailureCause,
    GpuTrouble,
    HealthSummary,
    NodeRef,
    RankView,
    RunEvent,
    RunState,
    completed_steps,
)
from gpud.model.snapshot import Backend, Hold, NodeEvent, NodeSnapshot, Reading, known_node_events
from gpud.notify.targets import Format, Webhook, redact
from gpud.retention.usage import RunUsage
from gpud.security.roles import Role
from gpud.wire.brief import NodeBrief

#: The protocol this code speaks, and the oldest it still serves: a request whose `v` is
#: outside is refused with one line naming both. 1: gpud 0.1.0. 2: gpud 0.2.0 — lenient
#: request bodies; `run.start`, `LaunchRequest.start_by_call` and `JoinRequest.hold` (a
#: client checks the daemon speaks 2 before it sends them).
PROTOCOL_VERSION = 2
MIN_PROTOCOL = 1
#: The protocol that brought `run.start`, `start_by_call` and `hold`.
PROTOCOL_START_BY_CALL = 2
#: The largest request: a client refuses to send a larger one, and a daemon answers one a
#: little larger (up to READ_FRAME_BYTES) with an error naming this limit, and logs it.
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: What the control socket reads at most (ZMQ_MAXMSGSIZE): past it the socket itself drops
#: the connection, reading nothing.
READ_FRAME_BYTES = MAX_FRAME_BYTES + 1024 * 1024


def too_large(size: int, method: str | None = None) -> str:
    """The one line for a request over MAX_FRAME_BYTES (`method`: where it is known)."""
    what = f"the {method} request is" if method else "a request of"
    line = (
        f"{what} {size / 2**20:.1f} MiB; a gpud takes at most {MAX_FRAME_BYTES // 2**20}"
        " MiB a request"
    )
    if method in ("run.launch", "run.join"):
        line += ": make the spec smaller (a large DeepSpeed config, env or args belong in a"
        line += " file the script reads)"
    return line


class ErrorCode(str, Enum):
    BAD_FRAME = "bad_frame"  # not JSON, or not a request envelope
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_BODY = "invalid_body"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A request that cannot be served; becomes an error reply with `code`."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# --------------------------------------------------------------------------- envelopes


def speaks(low: int = MIN_PROTOCOL, high: int = PROTOCOL_VERSION) -> str:
    """A range of protocol versions as messages write it: `1–2`, or `2`."""
    return str(high) if low == high else f"{low}–{high}"


def unsupported_version(version: int, low: int = MIN_PROTOCOL, high: int = PROTOCOL_VERSION) -> str:
    """The one line a daemon refuses a request of another protocol with: both versions."""
    return (
        f"protocol version {version} is not supported: this daemon (gpud {__version__})"
        f" speaks {speaks(low, high)}"
    )


class Message(BaseModel):
    """Base of every request body. Lenient (unknown fields ignored), so a client or peer of
    a later version is served; what each field holds (type, size, pattern) stays checked."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    def audited(self) -> dict[str, Any]:
        """The body as the audit log keeps it: what holds a secret (a webhook URL) is
        shown as `redact` shows it."""
        return self.model_dump(mode="json")


def _redact_hook(hook: Any) -> Any:
    """One `notify:` entry as the audit log keeps it, whatever shape a person gave it."""
    if isinstance(hook, dict):
        return {**hook, "url": redact(str(hook["url"]))} if "url" in hook else hook
    return redact(hook) if isinstance(hook, str) else "…"


def _redact_spec(body: dict[str, Any]) -> dict[str, Any]:
    """A launch or join body with the spec's webhook URLs redacted (also in a spec the
    daemon refuses: the audit log keeps refusals too)."""
    spec = body.get("spec")
    if isinstance(spec, dict) and "notify" in spec:
        hooks = spec["notify"]
        shown = [_redact_hook(h) for h in hooks] if isinstance(hooks, list) else _redact_hook(hooks)
        body = {**body, "spec": {**spec, "notify": shown}}
    return body


class Request(Message):
    v: int
    id: str = Field(min_length=1, max_length=128)
    type: str = Field(min_length=1, max_length=64)
    body: dict[str, Any] = Field(default_factory=dict)


class ErrorInfo(Reading):
    code: str
    message: str


class Reply(Reading):
    v: int
    id: str | None
    ok: bool
    body: Any = None
    error: ErrorInfo | None = None


class Event(Reading):
    v: int
    topic: str
    seq: int
    time: float
    body: Any


# --------------------------------------------------------------------------- bodies


class Empty(Message):
    """A request or reply without fields."""


class NodeInfo(Reading):
    """Reply to `node.info`: who the daemon is and how to reach its events."""

    node: str
    version: str = Field(description="the daemon's gpud release (gpud.__version__)")
    protocol: int = Field(description="the newest protocol it speaks")
    min_protocol: int = Field(1, description="the oldest protocol it still serves")
    store_schema: int | None = Field(
        None, description="its store's schema version (PRAGMA user_version)"
    )
    skipped_messages: int = Field(
        0,
        description="trainer messages of a kind this daemon does not know (a newer trainers"
        " library), skipped since it started",
    )
    pid: int
    started_at: float
    uptime_s: float
    control: str
    events: str
    backend: Backend
    simulated: bool
    gpu_count: int
    gpu_name: str | None = Field(None, description="the GPU model, or 'mixed'")
    secure: bool = Field(description="false when started with --insecure")
    role: Role = Field(description="the role of the key that asked")
    cpu_seconds: float | None = Field(None, description="the daemon's CPU time since it started")
    cpu_by_component: dict[str, float] = Field(
        default_factory=dict,
        description="of that, what each periodic part of the daemon spent (gpud.node.ledger)",
    )


class NodeEventsRequest(Message):
    limit: int = Field(100, ge=1, le=1000)
    since: float | None = Field(None, description="only events after this unix time")


class NodeEventsReply(Reading):
    events: list[NodeEvent]
    skipped: int = Field(
        0, description="events of a kind this reader does not know (a newer daemon): left out"
    )

    @model_validator(mode="before")
    @classmethod
    def _skip_unknown_kinds(cls, data: Any) -> Any:
        # One event of a kind added later must not cost the reader the whole reply.
        if isinstance(data, dict) and isinstance(data.get("events"), list):
            known = known_node_events(data["events"])
            left_out = len(data["events"]) - len(known)
            if left_out:
                skipped = int(data.get("skipped") or 0) + left_out
                data = {**data, "events": known, "skipped": skipped}
        return data


class AckEventsRequest(Message):
    gpu_index: int | None = Field(None, ge=0, description="one GPU, or all when omitted")


class AckEventsReply(Reading):
    acknowledged: int = Field(description="how many unacknowledged XID events were cleared")


class DrainRequest(Message):
    gpus: list[int] | None = Field(
        None, max_length=64, description="GPU indices; omitted: the whole node"
    )
    reason: str = Field(min_length=1, max_length=300, description="why, for the people after")


class UndrainRequest(Message):
    gpus: list[int] | None = Field(
        None, max_length=64, description="GPU indices; omitted: the node's drain"
    )


class HeldGpu(Reading):
    index: int
    uuid: str
    hold: Hold


class DrainReply(Reading):
    """The node's holds after a drain or undrain, and what it touched."""

    node: str
    drained: Hold | None = Field(None, description="the node's own drain")
    gpus: list[HeldGpu] = Field(default_factory=list, description="every GPU still held")
    runs: list[str] = Field(
        default_factory=list, description="runs with a part on what was drained (not stopped)"
    )
    notes: list[str] = Field(default_factory=list)


class GcRequest(Message):
    """Apply retention now (`gpuctl gc`); with `dry_run`, only say what it would remove."""

    dry_run: bool = False


class UsageRequest(Message):
    """Every run's use of this node since `since` (unix time): `gpuctl usage`."""

    since: float = Field(0.0, ge=0, description="runs that ended before this are left out")


class UsageReply(Reading):
    node: str
    now: float = Field(description="the daemon's clock when it answered")
    runs: list[RunUsage] = Field(
        default_factory=list,
        description="runs with a part here, live or ended since `since`, and the rows"
        " retention left of removed ones",
    )


class GcRun(Reading):
    """A finished run retention removed (or, in a dry run, would remove)."""

    id: str
    name: str
    state: str
    ended_at: float
    why: str = Field(description="the bound it is over")
    bytes: int = Field(description="its run dir (checkpoints left out), its database rows")
    rows: int = Field(description="its metric points and events")
    kept: list[str] = Field(default_factory=list, description="checkpoints left in place")
    notes: list[str] = Field(default_factory=list)


class GcReply(Reading):
    """What one pass of retention did on a node (or, dry, would do)."""

    node: str
    dry_run: bool
    limits: str = Field(description="the bounds, in one line")
    removed: list[GcRun] = Field(default_factory=list)
    finished_kept: int = Field(0, description="finished runs kept")
    protected: int = Field(0, description="runs retention leaves alone now (active, queued...)")
    thinned_runs: int = Field(0, description="finished runs whose old metric points thinned")
    points_removed: int = 0
    node_events_removed: int = 0
    state_bytes: int = Field(0, description="the database and run dirs after the pass")
    checkpoint_bytes: int = Field(0, description="checkpoints in the state dir (never removed)")
    runs: int = Field(0, description="run records after the pass")
    vacuumed_pages: int = 0
    longest_block_ms: float = Field(0.0, description="the longest the pass held the loop")
    elapsed_s: float = 0.0
    notes: list[str] = Field(default_factory=list)


class NotifyTestRequest(Message):
    """Send a test alert to this webhook, or (omitted) to every webhook the daemon has."""

    webhook: Webhook | None = None

    def audited(self) -> dict[str, Any]:
        body = super().audited()
        if self.webhook is not None:
            body["webhook"] = {**body["webhook"], "url": self.webhook.shown}
        return body


class WebhookAnswer(Reading):
    """What one webhook answered a test alert."""

    target: str = Field(description="the URL as logs show it: scheme://host/…")
    format: Format
    ok: bool
    status: int | None = Field(None, description="the HTTP status, when one came")
    error: str | None = None
    elapsed_s: float


class NotifyTestReply(Reading):
    node: str
    answers: list[WebhookAnswer]


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


RequestT = TypeVar("RequestT", bound=Message)
ReplyT = TypeVar("ReplyT", bound=BaseModel)


@dataclass(frozen=True)
class Method(Generic[RequestT, ReplyT]):
    """One request type: its body, its reply and the role it needs.

    Declared once here (clients and the daemon share it); the daemon binds one handler to
    each (`gpud.methods`), and `Client.call(method, body)` returns the reply model.
    """

    name: str
    request: type[RequestT]
    reply: type[ReplyT]
    role: Role
    summary: str


NODE_INFO = Method("node.info", Empty, NodeInfo, Role.VIEWER, "who the daemon is")
NODE_HW = Method("node.hw", Empty, NodeSnapshot, Role.VIEWER, "the latest hardware snapshot")
NODE_EVENTS = Method(
    "node.events", NodeEventsRequest, NodeEventsReply, Role.VIEWER, "recent hw events"
)
NODE_EVENTS_ACK = Method(
    "node.events.ack",
    AckEventsRequest,
    AckEventsReply,
    Role.OPERATOR,
    "acknowledge XID events after they were handled",
)
NODE_DRAIN = Method(
    "node.drain", DrainRequest, DrainReply, Role.OPERATOR, "no new work on the node or GPUs"
)
NODE_UNDRAIN = Method("node.undrain", UndrainRequest, DrainReply, Role.OPERATOR, "new work again")
NOTIFY_TEST = Method(
    "node.notify.test",
    NotifyTestRequest,
    NotifyTestReply,
    Role.OPERATOR,
    "send a test alert to the webhooks and say what each answered",
)
NODE_GC = Method(
    "node.gc", GcRequest, GcReply, Role.OPERATOR, "apply retention now (or say what it would)"
)
NODE_USAGE = Method(
    "node.usage", UsageRequest, UsageReply, Role.VIEWER, "GPU-seconds of each run here"
)
RUN_LAUNCH = Method("run.launch", LaunchRequest, LaunchReply, Role.OPERATOR, "create, start a run")
RUN_JOIN = Method("run.join", JoinRequest, JoinReply, Role.OPERATOR, "start this node's part")
RUN_STOP = Method("run.stop", StopRequest, RunSummary, Role.OPERATOR, "stop a run")
RUN_RESUME = Method("run.resume", ResumeRequest, RunSummary, Role.OPERATOR, "new attempt")
RUN_START = Method(
    "run.start", RunStartRequest, LaunchReply, Role.OPERATOR, "first attempt, once all joined"
)
RUN_LIST = Method("run.list", ListRequest, RunList, Role.VIEWER, "runs with a part here")
RUN_STATUS = Method("run.status", RunRef, RunStatus, Role.VIEWER, "one run in detail")
RUN_LOGS = Method("run.logs", LogsRequest, LogChunk, Role.VIEWER, "captured output of a part")
RUN_METRICS = Method("run.metrics", MetricsRequest, MetricsReply, Role.VIEWER, "metric history")
RUN_HEALTH = Method("run.health", RunRef, HealthSummary, Role.VIEWER, "latest health summary")
PART_START = Method(
    "run.part.start", PartStartRequest, AttemptRecord, Role.PEER, "coordinator: new attempt"
)
PART_HEALTH = Method(
    "run.part.health", PartStatusRequest, PartHealth, Role.PEER, "coordinator: this part's ranks"
)
PART_RESERVE = Method(
    "run.part.reserve", PartReserveRequest, PartReservation, Role.PEER, "coordinator: GPUs"
)
PART_RELEASE = Method(
    "run.part.release", PartReleaseRequest, PartReservation, Role.PEER, "coordinator: GPUs"
)
PART_STOP = Method("run.part.stop", PartStopRequest, AttemptRecord, Role.PEER, "coordinator")
PART_STATUS = Method("run.part.status", PartStatusRequest, AttemptRecord, Role.PEER, "coordinator")
PART_PREFLIGHT = Method(
    "run.part.preflight", PartPreflightRequest, PartPreflight, Role.PEER, "coordinator: check"
)
GANG_STATUS = Method(
    "run.gang.status", PartStatusRequest, GangStatus, Role.PEER, "node N: the run as node 0 has it"
)

METHODS: dict[str, Method[Any, Any]] = {
    m.name: m
    for m in (
        NODE_INFO,
        NODE_HW,
        NODE_EVENTS,
        NODE_EVENTS_ACK,
        NODE_DRAIN,
        NODE_UNDRAIN,
        NOTIFY_TEST,
        NODE_GC,
        NODE_USAGE,
        RUN_LAUNCH,
        RUN_JOIN,
        RUN_STOP,
        RUN_RESUME,
        RUN_START,
        RUN_LIST,
        RUN_STATUS,
        RUN_LOGS,
        RUN_METRICS,
        RUN_HEALTH,
        PART_START,
        PART_HEALTH,
        PART_RESERVE,
        PART_RELEASE,
        PART_STOP,
        PART_STATUS,
        PART_PREFLIGHT,
        GANG_STATUS,
    )
}


# --------------------------------------------------------------------------- codec


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line naming the first offending field and what was expected."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    where = f"{prefix}.{where}" if prefix and where else (prefix or where)
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where or 'message'}: {first['msg']}{extra}"


def unexpected_error_line(exc: BaseException) -> str:
    """One line for an exception a validator raised that is not a validation error
    (a regex nested too deep, a number too large to convert): no traceback, no internals."""
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}"


def decode_request(frame: bytes) -> tuple[Request, Method[Any, Any], Message]:
    """Parse and validate one request frame, or raise ProtocolError.

    Whatever the validation raises becomes an error reply with one line: a ValidationError
    names the field; anything else (RecursionError, OverflowError, ...) names itself.
    """
    try:
        req = Request.model_validate_json(frame)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, describe_validation_error(exc)) from None
    except Exception as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, unexpected_error_line(exc)) from None
    if not MIN_PROTOCOL <= req.v <= PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, unsupported_version(req.v), req.id)
    method = METHODS.get(req.type)
    if method is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown request type {req.type!r}", req.id)
    try:
        body = method.request.model_validate(req.body)
    except ValidationError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_BODY, describe_validation_error(exc, "body"), req.id
        ) from None
    except Exception as exc:
        raise ProtocolError(
            ErrorCode.INVALID_BODY, f"body: {unexpected_error_line(exc)}", req.id
        ) from None
    return req, method, body


def encode_request(
    request_id: str, method: Method[Any, Any], body: Message, version: int = PROTOCOL_VERSION
) -> bytes:
    """A request frame at protocol `version`. Fields at their default are left out: the
    receiver fills them in, and an older one never sees a field it does not know unless it
    is used."""
    return (
        Request(
            v=version,
            id=request_id,
            type=method.name,
            body=body.model_dump(mode="json", exclude_defaults=True),
        )
        .model_dump_json()
        .encode()
    )


def encode_reply(request_id: str | None, body: BaseModel) -> bytes:
    return Reply(v=PROTOCOL_VERSION, id=request_id, ok=True, body=body).model_dump_json().encode()


def encode_error(request_id: str | None, code: ErrorCode, message: str) -> bytes:
    return (
        Reply(
            v=PROTOCOL_VERSION,
            id=request_id,
            ok=False,
            error=ErrorInfo(code=code.value, message=message),
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )


def decode_reply(frame: bytes) -> Reply:
    """Parse a reply envelope (tolerantly). Raises ValidationError on garbage."""
    return Reply.model_validate_json(frame)


# --------------------------------------------------------------------------- events


def hw_topic(node: str) -> str:
    return f"hw.{node}"


def node_event_topic(node: str) -> str:
    return f"node.{node}.event"


def run_topic(run_id: str, kind: str) -> str:
    """`run.<id>.state|metrics|health|log|event`."""
    return f"run.{run_id}.{kind}"


class RunLogEvent(Reading):
    """Body of `run.<id>.log`: new lines of one node's part."""

    node: str
    node_rank: int
    attempt: int
    offset: int
    lines: list[str]


class RunMetricsEvent(Reading):
    """Body of `run.<id>.metrics`: new metric points of a run."""

    run_id: str
    attempt: int
    points: list[dict[str, Any]]


def _event_body_model(topic: str) -> type[BaseModel] | None:
    if topic.startswith("hw."):
        return NodeSnapshot
    if topic.startswith("sum."):
        return NodeBrief
    if topic.startswith("node.") and topic.endswith(".event"):
        return NodeEvent
    if topic.startswith("run."):
        kind = topic.rsplit(".", 1)[-1]
        run_bodies: dict[str, type[BaseModel]] = {
            "state": RunSummary,
            "log": RunLogEvent,
            "metrics": RunMetricsEvent,
            "event": RunEvent,
            "health": HealthSummary,
        }
        return run_bodies.get(kind)
    return None


def encode_event(topic: str, seq: int, body: BaseModel, now: float | None = None) -> list[bytes]:
    event = Event(
        v=PROTOCOL_VERSION,
        topic=topic,
        seq=seq,
        time=time.time() if now is None else now,
        body=body,
    )
    return [topic.encode(), event.model_dump_json().encode()]


class UnknownKind(ValueError):
    """An event of a kind this reader does not know (a newer daemon's): skip it, count it."""


def decode_event(frames: list[bytes]) -> Event:
    """Parse a two-frame event; the body becomes its model when the topic is known. A node
    event of a kind this code does not know raises `UnknownKind`."""
    if len(frames) != 2:
        raise ValueError(f"an event has 2 frames, got {len(frames)}")
    event = Event.model_validate_json(frames[1])
    if event.topic != frames[0].decode(errors="replace"):
        raise ValueError("event topic frame and envelope disagree")
    model = _event_body_model(event.topic)
    if model is NodeEvent and not known_node_events([event.body]):
        raise UnknownKind(f"node event of unknown kind {event.body.get('kind')!r}")
    if model is not None:
        event = event.model_copy(update={"body": model.model_validate(event.body)})
    return event
