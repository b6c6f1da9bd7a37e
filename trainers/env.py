"""The GPUD_* environment a launched rank receives, parsed once (stdlib only).

Where gpud did not launch the process, its node rank and node come from torchrun and the
Kubernetes operators instead (`trainers.placement`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainers.placement import Source, placement_from


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int | None:
    value = env.get(key)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _float(env: Mapping[str, str], key: str) -> float | None:
    value = env.get(key)
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Hints:
    """Training hints from the run spec; None when the spec left them unset."""

    batch_size_per_gpu: int | None = None
    gradient_accumulation: int | None = None
    mixed_precision: str | None = None
    gradient_checkpointing: bool | None = None
    lr: float | None = None  # already scaled by world size
    lr_base: float | None = None
    max_steps: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class RunEnv:
    """Where this rank belongs. `run_id` is None when gpud did not launch the process."""

    run_id: str | None
    run_dir: str | None
    ingest: str | None
    ingest_token: str | None  # a run gpud did not start: what each message carries
    control: str | None
    node: str
    node_rank: int
    nnodes: int | None
    #: Who told the node rank: gpud, torchrun, a Kubernetes operator, or nobody.
    placed_by: Source
    attempt: int
    resume_from: str | None
    checkpoint_dir: str | None
    checkpoint_keep: int
    checkpoint_every: int | None
    backend: str | None
    collective_timeout_s: float | None
    wandb: bool
    rank: int
    local_rank: int
    world_size: int
    hints: Hints

    @property
    def launched(self) -> bool:
        return self.run_id is not None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> RunEnv:
        env = os.environ if env is None else env
        checkpointing = env.get("GPUD_GRAD_CHECKPOINTING")
        place = placement_from(env)
        return cls(
            run_id=env.get("GPUD_RUN_ID") or None,
            run_dir=env.get("GPUD_RUN_DIR") or None,
            ingest=env.get("GPUD_INGEST") or None,
            ingest_token=env.get("GPUD_INGEST_TOKEN") or None,
            control=env.get("GPUD_CONTROL") or None,
            node=place.node,
            node_rank=place.node_rank,
            nnodes=place.nnodes,
            placed_by=place.source,
            attempt=_int(env, "GPUD_ATTEMPT", 1) or 1,
            resume_from=env.get("GPUD_RESUME_FROM") or None,
            checkpoint_dir=env.get("GPUD_CHECKPOINT_DIR") or None,
            checkpoint_keep=_int(env, "GPUD_CHECKPOINT_KEEP", 3) or 3,
            checkpoint_every=_int(env, "GPUD_CHECKPOINT_EVERY"),
            backend=env.get("GPUD_BACKEND") or None,
            collective_timeout_s=_float(env, "GPUD_COLLECTIVE_TIMEOUT_S"),
            wandb=env.get("GPUD_WANDB") == "1",
            rank=_int(env, "RANK", 0) or 0,
            local_rank=_int(env, "LOCAL_RANK", 0) or 0,
            world_size=_int(env, "WORLD_SIZE", 1) or 1,
            hints=Hints(
                batch_size_per_gpu=_int(env, "GPUD_BATCH_SIZE_PER_GPU"),
                gradient_accumulation=_int(env, "GPUD_GRAD_ACCUM"),
                mixed_precision=env.get("GPUD_MIXED_PRECISION") or None,
                gradient_checkpointing=None if checkpointing is None else checkpointing == "1",
                lr=_float(env, "GPUD_LR"),
                lr_base=_float(env, "GPUD_LR_BASE"),
                max_steps=_int(env, "GPUD_MAX_STEPS"),
                seed=_int(env, "GPUD_SEED"),
            ),
        )
