"""Runs as data: states, records, events and the messages trainers send.

Pure models (no I/O), shared by the store, the supervisor, the protocol and the front ends.
Records are read tolerantly (stored rows and replies of newer daemons); messages from
trainers are validated strictly, since they arrive on a socket.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, Literal, TypedDict

from pydantic import Field, computed_field, field_validator

from gpud.efficiency.goodput import Goodput
from gpud.efficiency.model import RunFlops
from gpud.model.snapshot import Reading
from gpud.model.trainer_messages import (
    NODE_FROM,
)


class RunState(str, Enum):
    """The state of a run, and of one node's part of it (`lost`: parts only)."""

    PENDING = "pending"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        return self in ACTIVE


_ENDINGS = frozenset({RunState.STOPPED, RunState.SUCCEEDED, RunState.FAILED, RunState.LOST})

#: Which state may follow which within one attempt. The one table: `terminal` and
#: `active` are derived from it, and every move of a run goes through `RunBook.move`,
#: which enforces it. `lost` is a part's state: its node stopped answering for longer
#: than the spec's `lost_after_s`; a run with a lost part ends `failed`.
WITHIN: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset(
        {
            RunState.QUEUED,
            RunState.STARTING,
            RunState.STOPPING,
            RunState.STOPPED,
            RunState.FAILED,
        }
    ),
    # Waiting for its GPUs (issue 9): no part, no lease; it starts, or is cancelled.
    RunState.QUEUED: frozenset({RunState.STARTING, RunState.STOPPED, RunState.FAILED}),
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.STOPPING, *_ENDINGS}),
    RunState.RUNNING: frozenset({RunState.STOPPING, *_ENDINGS}),
    RunState.STOPPING: _ENDINGS,
    RunState.STOPPED: frozenset(),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.LOST: frozenset(),
}

#: States with no way on within their attempt.
TERMINAL = frozenset(state for state, after in WITHIN.items() if not after)
ACTIVE = frozenset(WITHIN) - TERMINAL

#: Moves that open the next attempt: a resume (stopped or failed → starting, or → queued
#: when its GPUs are busy), and an automatic restart (the failed attempt ends in `pending`
#: until its backoff is over).
NEXT_ATTEMPT: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.PENDING}),
    RunState.RUNNING: frozenset({RunState.PENDING}),
    RunState.STOPPING: frozenset({RunState.PENDING}),
    RunState.STOPPED: frozenset({RunState.PENDING, RunState.QUEUED, RunState.STARTING}),
    RunState.FAILED: frozenset({RunState.PENDING, RunState.QUEUED, RunState.STARTING}),
    RunState.PENDING: frozenset({RunState.STARTING}),
}


def can_move(old: RunState, new: RunState, next_attempt: bool = False) -> bool:
    """Whether a run in `old` may go to `new` (opening the next attempt, or not)."""
    if new == old or new in WITHIN[old]:
        return True
    return next_attempt and new in NEXT_ATTEMPT.get(old, frozenset())


#: The states in which a run trains, so has a throughput and a FLOP rate (a stopped run's
#: last rate is not a rate).
TRAINING = frozenset({RunState.RUNNING, RunState.STOPPING})


class CauseKind(str, Enum):
    """What kind of failure ended an attempt; `restart.on` lists the kinds worth a restart."""

    USER = "user"  # an exception in the training code
    IMPORT = "import"  # ImportError / ModuleNotFoundError: the environment, not the data
    # torch, CUDA, NCCL or the driver do not fit the script or each other (a CPU build of
    # torch running a CUDA script, no NCCL, a driver older than torch's CUDA): no restart
    # gets past it, a change to the environment does
    ENVIRONMENT = "environment"
    OOM = "oom"  # CUDA out of memory, or the kernel's OOM killer
    NCCL = "nccl"  # NCCL errors and collective timeouts
    NETWORK = "network"  # gloo connection errors, address in use, a node lost
    SIGNAL = "signal"  # a rank killed by a signal (SIGKILL, SIGSEGV, SIGABRT...)
    HARDWARE = "hardware"  # an XID or a lost GPU on one of the run's GPUs
    HANG = "hang"  # stalled for restart.hang_timeout_s
    LAUNCH = "launch"  # the launcher could not start, or died without a word
    UNKNOWN = "unknown"  # a non-zero exit and nothing that says why

    @property
    def label(self) -> str:
        return _CAUSE_LABELS[self]


_CAUSE_LABELS = {
    CauseKind.USER: "user code",
    CauseKind.IMPORT: "import error",
    CauseKind.ENVIRONMENT: "environment",
    CauseKind.OOM: "out of memory",
    CauseKind.NCCL: "NCCL",
    CauseKind.NETWORK: "network",
    CauseKind.SIGNAL: "signal",
    CauseKind.HARDWARE: "hardware",
    CauseKind.HANG: "hang",
    CauseKind.LAUNCH: "launcher",
    CauseKind.UNKNOWN: "unknown",
}

#: restart.on when the spec does not say: failures a fresh attempt can get past.
DEFAULT_RESTART_ON = (
    CauseKind.NCCL,
    CauseKind.NETWORK,
    CauseKind.HARDWARE,
    CauseKind.HANG,
    CauseKind.SIGNAL,
)


#: What a part or rank whose script ended early did (node 0 puts the step in).
EARLY_EXIT = "exited 0 while the others were training (the script ended early on one rank)"
#: `FailureCause.source` of such a part's cause, as its node found it.
EARLY_EXIT_SOURCE = "exit barrier"

#: Kinds that are often an echo: a rank whose peer died sees a connection error.
ECHO_KINDS = frozenset({CauseKind.NETWORK, CauseKind.NCCL})


def cause_precedence(cause: FailureCause) -> tuple[bool, float]:
    """Which of several failures is the run's cause (the smallest): one that is not a
    connection error first (those are most often a dead peer's echo), then the earliest."""
    return cause.kind in ECHO_KINDS, cause.time or float("inf")


class FailureCause(Reading):
    """Why an attempt failed: found on the node where it started, chosen by node 0."""

    kind: CauseKind
    summary: str = Field(description="one line, e.g. 'ValueError: bad shard 17'")
    rank: int | None = Field(None, description="the global rank where it started")
    node_rank: int | None = None
    node: str | None = Field(None, description="that node's name")
    step: int | None = Field(
        None, description="the last step reported before it (0-based index, as last_step)"
    )
    attempt: int | None = None
    time: float | None = Field(None, description="when it happened, as far as known")
    source: str = Field(
        "", description="where it was read: error file, traceback, signal, log, nvml, health"
    )
    lines: list[str] = Field(default_factory=list, description="log lines around it")
    flight_recorder: list[str] = Field(
        default_factory=list,
        description="what torch's analyzer found in the ranks' flight-recorder dumps",
    )
    hint: str | None = Field(
        None,
        description=(
            "what to do about it, for a known failure (gpud.runs.diagnosis.hints); one line"
        ),
    )

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, value: object) -> object:
        # A newer daemon's class this code does not know is still a failure: `unknown`.
        known = {kind.value for kind in CauseKind}
        return value if not isinstance(value, str) or value in known else CauseKind.UNKNOWN

    def one_line(self) -> str:
        """`rank 1 on node B: ValueError: bad shard 17 (user code, step 40 of attempt 1)`."""
        node = self.node if self.node is not None else self.node_rank
        if self.rank is not None:
            head = f"rank {self.rank}" + (f" on node {node}" if node is not None else "")
        elif self.node_rank is not None and self.node not in (None, str(self.node_rank)):
            head = f"node {self.node_rank} ({self.node})"
        else:
            head = f"node {node}" if node is not None else ""
        when = [self.kind.label]
        if self.step is not None and self.attempt is not None:
            # The step as the script numbers it, the last one gpud saw (issue 33 §4: the
            # count of steps done read as one step more than the log's last).
            when.append(f"step {self.step} of attempt {self.attempt}")
        elif self.attempt is not None:
            when.append(f"attempt {self.attempt}")
        return f"{head + ': ' if head else ''}{self.summary} ({', '.join(when)})"

    def same_failure(self, other: FailureCause) -> bool:
        """The same error, on the same rank, at the same step: another attempt would fail
        the same way. A connection error's wording is not compared (gloo's text differs
        between attempts for the same failure: `Read error`, then `Connection closed`)."""
        where = (self.kind, self.rank, self.node_rank, self.step)
        if where != (other.kind, other.rank, other.node_rank, other.step):
            return False
        return self.kind in ECHO_KINDS or self.summary == other.summary


class NodeRef(Reading):
    """A daemon as a peer sees it: where it is and which key to pin."""

    control: str
    server_key: str | None = Field(None, description="None: the daemon runs --insecure")
    name: str | None = None


class ExitInfo(Reading):
    """How one attempt's launcher ended, as the shim recorded it."""

    exit_code: int | None = None
    signal: int | None = None
    failed_rank: int | None = Field(None, description="first rank to fail (torchrun)")
    failed_local_rank: int | None = None
    failed_exit: str | None = Field(None, description="e.g. 'SIGKILL' or 'exit 1'")
    teardown_abort: bool = Field(
        False, description="a rank aborted at interpreter exit after training finished"
    )
    leftovers_killed: list[int] = Field(default_factory=list)
    output_dropped_bytes: int = Field(
        0, description="output the shim could not write to the log: its disk was full"
    )
    cause: FailureCause | None = Field(None, description="why it failed, when it did")
    flight_recorder: list[str] = Field(
        default_factory=list, description="the analyzer's findings in this part's dumps"
    )


class CheckpointRef(Reading):
    path: str
    step: int | None = None
    time: float | None = None


class AttemptRecord(Reading):
    """One node's part of one attempt."""

    run_id: str
    attempt: int
    node_rank: int
    state: RunState
    state_since: float
    reason: str | None = None
    master_addr: str
    master_port: int
    nproc: int
    attempt_dir: str
    gpus: list[int] = Field(
        default_factory=list, description="GPU indices leased to this part (none on CPU)"
    )
    gpu_uuids: list[str] = Field(default_factory=list, description="the same GPUs by UUID")
    resume_from: str | None = None
    resume_step: int | None = Field(None, description="the step of resume_from, when known")
    start: str | None = Field(
        None,
        description="what it started from, in words: 'from PATH (step N)', 'from scratch: why'",
    )
    started_at: float | None = None
    ended_at: float | None = None
    shim_pid: int | None = None
    shim_started: float | None = Field(None, description="shim create time (pid-reuse check)")
    exit: ExitInfo | None = None
    library: bool = Field(False, description="its trainers use the trainers library")
    finished: bool = Field(False, description="the trainers reported training finished")
    stop_requested: bool = False
    stop_failed: str | None = Field(
        None, description="stopped because another part failed or was lost: why"
    )
    log_offset: int = 0
    members: list[int] | None = Field(
        None, description="the run's nodes in this attempt (indices; None: all of them)"
    )
    world_size: int | None = Field(None, description="ranks in this attempt, all nodes")
    grad_accum: int | None = Field(
        None,
        description="gradient accumulation this attempt was given (elastic: raised as"
        " the world shrank)",
    )

    @property
    def held_gpus(self) -> list[int]:
        """The GPUs the part holds now: its lease, given back when it ended."""
        return [] if self.state.terminal else list(self.gpus)


class AttemptChanges(TypedDict, total=False):
    """What may change in an `AttemptRecord` after it is created (see `Part.update`)."""

    state: RunState
    state_since: float
    reason: str | None
    started_at: float | None
    ended_at: float | None
    shim_pid: int | None
    shim_started: float | None
    exit: ExitInfo | None
    library: bool
    finished: bool
    stop_requested: bool
    stop_failed: str | None
    log_offset: int
    resume_step: int | None
    start: str | None


class Attachment(Reading):
    """A run gpud did not start (a Slurm job's part, a pod) that reports to this daemon
    through its attach socket; who attached it, as the kernel said (SO_PEERCRED)."""

    scheduler: str = Field(description="slurm, kubernetes or manual")
    job_id: str | None = Field(None, description="the Slurm job of the attached part")
    pod_uid: str | None = Field(None, description="the pod of the attached part")
    uid: int = Field(description="the user the part runs as: only they may attach it again")
    user: str | None = Field(None, description="that user's name, where known")
    host: str


class RunRecord(Reading):
    """A run as one daemon knows it: its part, and for node 0 the whole gang."""

    id: str
    name: str
    created_at: float
    spec: dict[str, Any]
    nodes: list[NodeRef]
    node_rank: int
    coordinator: NodeRef | None = Field(None, description="None on node 0 itself")
    state: RunState
    state_since: float
    reason: str | None = None
    attempt: int = 1
    restarts: int = 0
    run_dir: str
    checkpoint_dir: str
    last_checkpoint: CheckpointRef | None = None
    last_step: int | None = None
    stop_requested: bool = False
    next_restart_at: float | None = None
    queued_at: float | None = Field(
        None, description="when node 0 queued it: the run's place in every node's queue"
    )
    queued_restart: bool = Field(
        False, description="it waits in the queue for an automatic restart (counts as one)"
    )
    cause: FailureCause | None = Field(None, description="why its latest failed attempt failed")
    resume_next: str | None = Field(
        None, description="the checkpoint the next attempt starts from (gpuctl resume --from)"
    )
    attached: Attachment | None = Field(
        None, description="a run gpud did not start: it only watches it (see gpud.attach)"
    )
    members: list[int] | None = Field(
        None,
        description="its nodes (indices into `nodes`) in the current attempt, node 0 first;"
        " None: every node. Elastic runs change it (gpud.runs.multinode.elastic)",
    )
    grad_accum: int | None = Field(
        None, description="gradient accumulation for the current attempt, when elastic set it"
    )
    bandwidth: dict[int, list[float]] = Field(
        default_factory=dict,
        description="node rank → its preflight all-reduces with node 0 (GB/s), the last few"
        " attempts': the node's baseline in this run",
    )
    awaiting_start: bool = Field(
        False,
        description="launched: node 0 starts its first attempt once gpuctl says every"
        " node joined (run.start), after the preflight",
    )
    goodput: Goodput | None = Field(
        None, description="node 0's account of its wall time by bucket (gpud.efficiency.goodput)"
    )

    @property
    def queue_key(self) -> tuple[float, str]:
        """Its place in a node's queue: node 0's time, then the id (the same on every node)."""
        return (self.queued_at or self.created_at, self.id)

    @property
    def is_coordinator(self) -> bool:
        return self.node_rank == 0


class RunChanges(TypedDict, total=False):
    """What may change in a `RunRecord` besides its state (see `RunBook.update`)."""

    attempt: int
    restarts: int
    last_checkpoint: CheckpointRef | None
    last_step: int | None
    stop_requested: bool
    next_restart_at: float | None
    queued_at: float | None
    queued_restart: bool
    cause: FailureCause | None
    resume_next: str | None
    nodes: list[NodeRef]
    coordinator: NodeRef | None
    attached: Attachment | None
    members: list[int] | None
    grad_accum: int | None
    bandwidth: dict[int, list[float]]
    awaiting_start: bool
    goodput: Goodput | None


class RunEvent(Reading):
    """Something that happened to a run: state changes, NCCL lines, stops, restarts."""

    run_id: str
    attempt: int
    time: float
    node: str
    kind: str
    severity: Literal["info", "warning", "critical"] = "info"
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class MetricPoint(Reading):
    run_id: str
    attempt: int
    step: int
    time: float
    values: dict[str, float]


# --------------------------------------------------------------------------- steps

#: What every view calls "step", and its one definition: `step` on the wire (metrics,
#: heartbeats, checkpoints, a spec's metrics regex) is the trainer's 0-based loop index
#: of the step it just finished; views show the steps done, that index + 1, as done/total
#: against `training.max_steps`. A finished run of N steps shows N/N everywhere.
STEP_DEFINITION = "steps done: the 0-based index of the last completed step + 1"


def completed_steps(last_index: int | None) -> int | None:
    """Steps done, from the 0-based index of the last completed step (None: none yet)."""
    return None if last_index is None else last_index + 1


def steps_text(done: int | None, total: int | None, missing: str = "-") -> str:
    """How every view writes progress: `done/total`, `done` without a total."""
    if done is None:
        return missing
    return f"{done}/{total}" if total else str(done)


# --------------------------------------------------------------------------- health


class RankView(Reading):
    """One rank as the health check sees it."""

    rank: int
    node_rank: int
    local_rank: int
    node: str | None = Field(None, description=NODE_FROM)
    host: str | None = Field(None, description="the rank's host name (on Kubernetes, its pod's)")
    pid: int | None = None
    last_step: int | None = Field(
        None, description="0-based index of the last step the rank finished (its heartbeat's)"
    )
    step_time_s: float | None = None
    collective_s: float | None = None
    compute_s: float | None = Field(
        None, description="median compute time per step (step time − collectives), last ~5 s"
    )
    phase: Literal["compute", "collective"] = "compute"
    phase_for_s: float = 0.0
    heartbeat_age_s: float | None = Field(None, description="None: never heard from")
    progress_age_s: float | None = Field(None, description="time since its step last moved")
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    outside_lease: bool = Field(
        False, description="its GPU is not one its part leases (CUDA_VISIBLE_DEVICES ignored?)"
    )
    straggler: bool = False
    stalled: bool = False
    flops_per_step: float | None = Field(
        None, description="FLOPs of one of its steps, as the trainers library counted them"
    )

    @computed_field(description=STEP_DEFINITION)  # type: ignore[prop-decorator]
    @property
    def steps_done(self) -> int | None:
        return completed_steps(self.last_step)


class Straggler(Reading):
    rank: int
    step_time_s: float
    median_step_time_s: float
    ratio: float


class Stall(Reading):
    """No progress while the others wait: in a hang, the likely culprit."""

    rank: int | None = Field(description="the rank holding the others up; None: all stuck")
    stuck_for_s: float
    timeout_s: float = Field(description="the collective timeout that will end the wait")
    countdown_s: float = Field(description="time left until that timeout fires")
    why: str


class BandwidthView(Reading):
    busbw_gbps: float
    algbw_gbps: float
    size_bytes: int
    step: int
    time: float
    baseline_gbps: float | None = Field(None, description="expected for the topology, if known")
    baseline: str | None = Field(None, description="what the baseline is for")


class GpuTrouble(Reading):
    """Hardware trouble on a GPU a rank of the run uses."""

    node: str
    gpu_index: int
    xid: int = 0
    nvlink_errors: int = 0
    pcie_replays: int = 0
    ecc_uncorrected: int = 0
    throttle: list[str] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list, description="recent messages")

    def describe(self) -> str:
        """One line for a person, e.g. "2 XID; 14 NVLink errors; slowed down: thermal"."""
        parts = []
        if self.xid:
            parts.append(f"{self.xid} XID")
        if self.nvlink_errors:
            parts.append(f"{self.nvlink_errors} NVLink errors")
        if self.pcie_replays:
            parts.append(f"{self.pcie_replays} PCIe replays")
        if self.ecc_uncorrected:
            parts.append(f"{self.ecc_uncorrected} uncorrectable ECC errors")
        if self.throttle:
            parts.append("slowed down: " + ", ".join(self.throttle))
        return "; ".join(parts) or "trouble"


Verdict = Literal["ok", "degraded", "stalled", "failed", "idle"]
#: What the views say in place of `ok` for a run whose health is judged from its output (no
#: rank sends heartbeats): gpud cannot see the ranks of such a script, so it does not vouch
#: for them. A stall it sees in the output still reads `stalled`.
NO_HEARTBEATS = "no heartbeats (script does not use the trainers library): judged from its output"
#: The same in a table's one-word HEALTH column (gputop's runs table).
NO_HEARTBEATS_WORD = "no beats"


def verdict_word(verdict: str, judged_from_output: bool) -> str:
    """A verdict in one word for a table: `ok` judged from output alone is `no beats`."""
    return NO_HEARTBEATS_WORD if judged_from_output and verdict == "ok" else verdict


def new_run_id(name: str) -> str:
    """A fresh run id: the run's name and 6 hex digits (`cpu-ddp-3f9a2c`)."""
    return f"{name}-{secrets.token_hex(3)}"


#: Metric names a trainer may log its throughput under, best first: gputop's RATE,
#: /metrics' gpud_run_samples_per_second and gpud_run_tokens_per_second, and gpuctl
#: scaling read them.
SAMPLES_PER_S_NAMES = ("samples_per_s", "samples/s", "samples_per_sec", "throughput")
TOKENS_PER_S_NAMES = ("tokens_per_s", "tokens/s", "tokens_per_sec")
#: Metric names a script's pattern may capture its step time under, with their unit in s.
STEP_TIME_NAMES = {"step_time_s": 1.0, "step_time_ms": 1e-3}


def logged_step_time(values: Mapping[str, float]) -> float | None:
    """The step time, in seconds, a script logged (a pattern's `step_time_ms`...)."""
    for name, unit in STEP_TIME_NAMES.items():
        if values.get(name, 0) > 0:
            return values[name] * unit
    return None


def logged_rate(values: Mapping[str, float], names: Sequence[str]) -> tuple[str, float] | None:
    """The first of `names` a trainer logged, with its value (None: it logs none)."""
    return next(((name, values[name]) for name in names if name in values), None)


def samples_per_rank_step(training: Mapping[str, Any]) -> int | None:
    """Samples one process trains per optimizer step, from a spec's `training` section:
    batch_size_per_gpu × gradient_accumulation (None without a batch size)."""
    batch = training.get("batch_size_per_gpu")
    if not batch:
        return None
    return int(batch) * int(training.get("gradient_accumulation") or 1)


def step_rate_samples(
    step_time_s: float | None, world_size: int | None, per_rank_step: int | None
) -> float | None:
    """Samples/s when the trainer logs none: every process trains `per_rank_step` samples
    per step of `step_time_s` (the global batch grows with the world, as DDP's does)."""
    if not (step_time_s and world_size and per_rank_step):
        return None
    return per_rank_step * world_size / step_time_s


def throughput(
    logged: Mapping[str, float],
    step_times: Sequence[float],
    world_size: int | None,
    per_rank_step: int | None,
    tokens_per_sample: int | None,
) -> tuple[float | None, float | None]:
    """(samples/s, tokens/s) of a training run: what the trainer logs under a throughput
    name, else the step rate (the ranks' median step time) × the global batch (×
    `tokens_per_sample`, the spec's seq_len)."""
    found = logged_rate(logged, SAMPLES_PER_S_NAMES)
    samples = found[1] if found else None
    found = logged_rate(logged, TOKENS_PER_S_NAMES)
    tokens = found[1] if found else None
    if samples is None:
        times = [t for t in step_times if t]
        step_time = statistics.median(times) if times else None
        samples = step_rate_samples(step_time, world_size, per_rank_step)
    if tokens is None and samples is not None and tokens_per_sample:
        tokens = samples * tokens_per_sample
    return samples, tokens


class HealthSummary(Reading):
    """Published on `run.<id>.health` about once a second while a run runs."""

    run_id: str
    attempt: int
    time: float
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list, description="why the verdict, in words")
    backend: str | None = None
    world_size: int | None = None
    ranks: list[RankView] = Field(default_factory=list)
    straggler: Straggler | None = None
    stall: Stall | None = None
    bandwidth: BandwidthView | None = None
    nccl_warnings: int = 0
    last_nccl_warning: str | None = None
    gpu_trouble: list[GpuTrouble] = Field(default_factory=list)
    flight_recorder: list[str] = Field(
        default_factory=list, description="the analyzer's findings when the attempt failed"
    )
    flops: RunFlops | None = Field(
        None, description="achieved FLOP/s and MFU (gpud.efficiency); None from an older daemon"
    )
    judged_from_output: bool = Field(
        False,
        description="no rank sends heartbeats (the script does not use the trainers library),"
        " so health is judged from its output; the views show its `ok` as NO_HEARTBEATS. A"
        " flag beside `verdict`, not a verdict of its own: a reader that knows only the five"
        " verdicts still reads the summary",
    )

    @property
    def ok_from_output(self) -> bool:
        """An `ok` judged from output alone: the views show NO_HEARTBEATS in its place."""
        return self.judged_from_output and self.verdict == "ok"


def gpus_text(gpus: list[int]) -> str:
    """GPU indices for people: `0-3`, `0,2,5`, `0-3,6` ("-" for none)."""
    if not gpus:
        return "-"
    parts: list[str] = []
    ordered = sorted(set(gpus))
    start = prev = ordered[0]
    for index in [*ordered[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def gpus_by_node_text(by_node: dict[int, list[int]]) -> str:
    """The GPUs a run holds: `0-3` on one node, `n0:0-3 n1:4-7` on several ("-": none)."""
    held = {rank: gpus for rank, gpus in by_node.items() if gpus}
    if len(held) <= 1:
        return gpus_text(next(iter(held.values()), []))
    return " ".join(f"n{rank}:{gpus_text(g)}" for rank, g in sorted(held.items()))
