"""What a part runner and its node's daemon say on the attach socket (pure models).

A run that gpud did not start — a Slurm job's part, a pod, a hand-started torchrun — can
still report to the daemon of its node. Its part runner connects to the daemon's attach
socket (a unix socket: the daemon reads who connected from the kernel, SO_PEERCRED), sends
one `AttachRequest` line, and gets an `AttachReply` line back: the shared ingest endpoint
its ranks send to, with the token they must send with every message. The connection then
stays open for the part's life: `NodesUpdate` and `CoordinatorUpdate` lines as the part
runner learns where its run's other daemons are, and one `EndReport` when the part ends.
A connection that closes without one means the part runner is gone.

Each line is one JSON object, at most `MAX_LINE` bytes. Lines are read leniently, as every
wire message is (a field the reader does not know is ignored: a part runner and its daemon
may be of different releases); a first line that does not validate is answered with an
error and a close, a later one (a kind this daemon does not know) is skipped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gpud.model.run import FailureCause, RunState
from gpud.wire.run_messages import RUN_ID_PATTERN, NodeRefIn

#: The longest line either side may send: a run spec fits many times over.
MAX_LINE = 1 << 20
#: A token: 32 hex digits or more (the part runner draws 128 bits).
TOKEN_PATTERN = r"^[0-9a-f]{32,128}$"
#: A pod's UID: a UUID, or 32 hex digits (a static pod).
POD_UID_PATTERN = r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"
#: A Slurm job id, array jobs (`1234_7`) and het jobs (`1234+1`) included.
JOB_ID_PATTERN = r"^[0-9]+([_+][0-9]+)?$"

Scheduler = Literal["slurm", "kubernetes", "manual"]


class _Line(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class AttachRequest(_Line):
    """Part runner → daemon, first line: this node's part of a run that gpud did not start."""

    type: Literal["attach"] = "attach"
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    name: str = Field(min_length=1, max_length=128)
    attempt: int = Field(ge=1, le=1_000_000)
    node_rank: int = Field(ge=0, le=4095)
    nnodes: int = Field(ge=1, le=4096)
    nproc: int = Field(ge=1, le=1024)
    host: str = Field(min_length=1, max_length=255)
    scheduler: Scheduler
    job_id: str | None = Field(
        None, pattern=JOB_ID_PATTERN, max_length=64, description="the Slurm job (scheduler slurm)"
    )
    pod_uid: str | None = Field(
        None, pattern=POD_UID_PATTERN, description="the pod (scheduler kubernetes)"
    )
    run_dir: str = Field(min_length=1, max_length=4096)
    attempt_dir: str = Field(min_length=1, max_length=4096)
    created_at: float
    spec: dict[str, Any] = Field(description="the run spec, as submitted")
    token: str = Field(pattern=TOKEN_PATTERN, description="what the ranks send with each message")
    resume_from: str | None = Field(None, max_length=4096)


class NodesUpdate(_Line):
    """Node 0's part runner → its daemon: the run's daemons by node rank (None: none known)."""

    type: Literal["nodes"] = "nodes"
    nodes: list[NodeRefIn | None] = Field(max_length=4096)


class CoordinatorUpdate(_Line):
    """Another node's part runner → its daemon: node 0's daemon, which may poll this part."""

    type: Literal["coordinator"] = "coordinator"
    coordinator: NodeRefIn


class EndReport(_Line):
    """Part runner → daemon, last line: how this node's part ended."""

    type: Literal["ended"] = "ended"
    state: Literal[RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED]
    reason: str = Field(max_length=2000)
    exit_code: int | None = None
    signal: int | None = None
    cause: FailureCause | None = None


Update = Annotated[NodesUpdate | CoordinatorUpdate | EndReport, Field(discriminator="type")]
UPDATE: TypeAdapter[NodesUpdate | CoordinatorUpdate | EndReport] = TypeAdapter(Update)


class AttachError(_Line):
    code: str
    message: str


class AttachReply(_Line):
    """Daemon → part runner: where the ranks send, and who this daemon is."""

    ok: bool
    error: AttachError | None = None
    ingest: str | None = Field(None, description="the shared ingest endpoint (zmq ipc)")
    attempt: int | None = Field(
        None, description="the attempt the part is: a rerun of an ended run is the next one"
    )
    node: str | None = Field(None, description="the daemon's node name")
    control: str | None = Field(None, description="its control endpoint, for node 0's peers")
    server_key: str | None = Field(None, description="its server key (None: --insecure)")


def refusal(code: str, message: str) -> AttachReply:
    return AttachReply(ok=False, error=AttachError(code=code, message=message))
