"""What trainers send the daemon: the messages ranks PUSH on the ingest socket.

Each message is two frames, `[kind, json]`; `TRAINER_MESSAGES` maps a kind to its model
(hello, metrics, checkpoint, stopped, finished, heartbeat, probe). A kind this code does
not know is skipped and counted (docs/DESIGN.md, "Compatibility"). Pure models: the
trainers library writes these without importing gpud.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# --------------------------------------------------------------------------- from trainers


NODE_RANK_FROM = (
    "the rank's node rank as it knows it: gpud's, else torchrun's, else a Kubernetes"
    " operator's (trainers.placement); None from a library older than this field"
)
NODE_FROM = "the node the rank runs on (on Kubernetes its pod's node, not the pod)"


class TrainerMessage(BaseModel):
    """Base of what ranks send on the ingest socket. Lenient, as every wire message is (the
    trainers library in a rank may be a release ahead of or behind its daemon): unknown
    fields are ignored; types and sizes are checked."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    run: str = Field(max_length=128)
    attempt: int = Field(ge=1)
    time: float


class HelloMessage(TrainerMessage):
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    local_rank: int = Field(ge=0)
    node_rank: int | None = Field(None, ge=0, description=NODE_RANK_FROM)
    node: str | None = Field(None, max_length=253, description=NODE_FROM)
    nnodes: int | None = Field(None, ge=1, description="nodes in the job, where known")
    host: str
    pid: int
    library: str


class MetricsMessage(TrainerMessage):
    step: int = Field(ge=0, description="0-based index of the step these values are from")
    values: dict[str, float]


class CheckpointMessage(TrainerMessage):
    rank: int = Field(ge=0)
    path: str
    step: int = Field(ge=0)
    seconds: float | None = Field(None, ge=0, description="what the save took (goodput)")


class StoppedMessage(TrainerMessage):
    rank: int = Field(ge=0)
    checkpoint: str | None
    step: int = Field(ge=0)


class FinishedMessage(TrainerMessage):
    rank: int = Field(ge=0)
    exit_code: int


class HeartbeatMessage(TrainerMessage):
    """Every rank, about twice a second, from the library's background thread."""

    rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    step: int | None = Field(
        None, ge=0, description="0-based index of the last step the rank finished"
    )
    step_time_s: float | None = Field(None, ge=0, description="recent time per step")
    collective_s: float | None = Field(
        None, ge=0, description="time per step spent waiting in measured collectives"
    )
    phase: Literal["compute", "collective"] = "compute"
    phase_since: float = Field(description="unix time the rank entered its phase")
    gpu_uuid: str | None = None
    gpu_bus_id: str | None = None
    node_rank: int | None = Field(None, ge=0, description=NODE_RANK_FROM)
    node: str | None = Field(None, max_length=253, description=NODE_FROM)
    host: str
    pid: int
    dropped: int = Field(0, ge=0, description="messages lost so far (queue full, gpud down)")
    flops_per_step: float | None = Field(
        None, ge=0, description="FLOPs of one of the rank's steps, counted once (count_flops)"
    )


class ProbeMessage(TrainerMessage):
    """A timed all-reduce (rank 0 reports): the collective bandwidth of the run."""

    rank: int = Field(ge=0)
    step: int = Field(ge=0)
    backend: str
    world_size: int = Field(ge=1)
    size_bytes: int = Field(ge=1)
    seconds: float = Field(gt=0)
    algbw_gbps: float = Field(ge=0, description="size / time, GB/s")
    busbw_gbps: float = Field(ge=0, description="algbw · 2(n−1)/n, GB/s")


TRAINER_MESSAGES: dict[str, type[TrainerMessage]] = {
    "hello": HelloMessage,
    "metrics": MetricsMessage,
    "checkpoint": CheckpointMessage,
    "stopped": StoppedMessage,
    "finished": FinishedMessage,
    "heartbeat": HeartbeatMessage,
    "probe": ProbeMessage,
}
