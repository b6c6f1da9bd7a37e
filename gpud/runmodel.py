"""Runs as data: states, records, events and the messages trainers send.

Pure models (no I/O), shared by the store, the supervisor, the protocol and the front ends.
Records are read tolerantly (stored rows and replies of newer daemons); messages from
trainers are validated strictly, since they arrive on a socket.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpud.snapshot import Reading


class RunState(str, Enum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunState.STOPPED, RunState.SUCCEEDED, RunState.FAILED})

#: Which state may follow which. A restart goes failed → pending on a new attempt.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset(
        {RunState.STARTING, RunState.STOPPING, RunState.STOPPED, RunState.FAILED}
    ),
    RunState.STARTING: frozenset(
        {RunState.RUNNING, RunState.STOPPING, RunState.SUCCEEDED, RunState.FAILED}
    ),
    RunState.RUNNING: frozenset({RunState.STOPPING, RunState.SUCCEEDED, RunState.FAILED}),
    RunState.STOPPING: frozenset({RunState.STOPPED, RunState.FAILED, RunState.SUCCEEDED}),
    RunState.STOPPED: frozenset({RunState.PENDING}),
    RunState.FAILED: frozenset({RunState.PENDING}),
    RunState.SUCCEEDED: frozenset(),
}


def can_move(old: RunState, new: RunState) -> bool:
    return new == old or new in TRANSITIONS[old]


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
    resume_from: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    shim_pid: int | None = None
    shim_started: float | None = Field(None, description="shim create time (pid-reuse check)")
    exit: ExitInfo | None = None
    library: bool = Field(False, description="its trainers use the trainers library")
    finished: bool = Field(False, description="the trainers reported training finished")
    stop_requested: bool = False
    log_offset: int = 0


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

    @property
    def is_coordinator(self) -> bool:
        return self.node_rank == 0


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


# --------------------------------------------------------------------------- from trainers


class TrainerMessage(BaseModel):
    """Base of what ranks send on the ingest socket: validated strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    run: str = Field(max_length=128)
    attempt: int = Field(ge=1)
    time: float


class HelloMessage(TrainerMessage):
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    local_rank: int = Field(ge=0)
    host: str
    pid: int
    library: str


class MetricsMessage(TrainerMessage):
    step: int = Field(ge=0)
    values: dict[str, float]


class CheckpointMessage(TrainerMessage):
    rank: int = Field(ge=0)
    path: str
    step: int = Field(ge=0)


class StoppedMessage(TrainerMessage):
    rank: int = Field(ge=0)
    checkpoint: str | None
    step: int = Field(ge=0)


class FinishedMessage(TrainerMessage):
    rank: int = Field(ge=0)
    exit_code: int


TRAINER_MESSAGES: dict[str, type[TrainerMessage]] = {
    "hello": HelloMessage,
    "metrics": MetricsMessage,
    "checkpoint": CheckpointMessage,
    "stopped": StoppedMessage,
    "finished": FinishedMessage,
}
