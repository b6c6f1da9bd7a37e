"""Where one node's part of a run sits: its place in the gang and the paths gpud chose.

A record of its own because both halves of a part's start read it: `launch.environment`
(the variables its processes get) and `launch.backends` (the launcher command line).
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.sections import TrainingHints


@dataclass(frozen=True)
class Placement:
    """Where one node's part of a run sits in the gang, and the paths gpud chose for it."""

    run_id: str
    attempt: int  # 1, 2, ...
    node_name: str
    node_rank: int  # 0 = coordinator
    nnodes: int
    nproc_per_node: int  # already resolved (never "auto")
    master_addr: str
    master_port: int
    gpu_count: int  # REAL GPUs on this node (0 on CPU-only or simulated nodes)
    python: str  # interpreter to run launchers with
    run_dir: str  # absolute
    attempt_dir: str  # absolute, inside run_dir
    checkpoint_dir: str  # absolute
    ingest: str  # zmq endpoint for GPUD_INGEST
    control: str  # zmq endpoint for GPUD_CONTROL
    resume_from: str | None  # checkpoint path when this attempt resumes, else None
    hints: TrainingHints  # spec.training after resolve_hints (auto already applied)
    gpus: tuple[int, ...] = ()  # the GPU indices leased to this part (NVML order), if any

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is outside a gang of {self.nnodes}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be at least 1, not {self.nproc_per_node}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node
