"""Training settings recommended for a node's hardware: the memory-class table.

The table is data, in one place: `gpuctl hw` prints it and the launcher's
`training.auto: true` fills a run's hints from it. The figures are starting points for a
mid-sized transformer in mixed precision, not promises; a model that is much larger or
smaller than that shifts the batch size, not the shape of the advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpud.model.snapshot import NodeSnapshot

GB = 1_000_000_000  # classes are in decimal GB, as GPU boards are sold (an "80GB" H100 ≈ 85.5e9)
DEFAULT_TARGET_BATCH = 256
WORKERS_PER_GPU = 3

Precision = Literal["bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class MemoryClass:
    label: str
    min_gb: float  # inclusive lower bound
    batch_per_gpu: int
    gradient_checkpointing: bool
    tight: bool  # memory is tight: shard everything (ZeRO-3) when there are several GPUs


#: GPU memory classes, largest first. The first whose `min_gb` the GPU reaches applies.
MEMORY_CLASSES: tuple[MemoryClass, ...] = (
    MemoryClass("≥80 GB", 80, batch_per_gpu=64, gradient_checkpointing=False, tight=False),
    MemoryClass("40–80 GB", 40, batch_per_gpu=32, gradient_checkpointing=False, tight=False),
    MemoryClass("20–40 GB", 20, batch_per_gpu=16, gradient_checkpointing=False, tight=False),
    MemoryClass("14–20 GB", 14, batch_per_gpu=8, gradient_checkpointing=True, tight=False),
    MemoryClass("10–14 GB", 10, batch_per_gpu=4, gradient_checkpointing=True, tight=True),
    MemoryClass("6–10 GB", 6, batch_per_gpu=2, gradient_checkpointing=True, tight=True),
    MemoryClass("<6 GB", 0, batch_per_gpu=1, gradient_checkpointing=True, tight=True),
)

#: No GPU: plain data-parallel training on CPU processes (gloo).
CPU_CLASS = MemoryClass(
    "no GPU (CPU)", 0, batch_per_gpu=8, gradient_checkpointing=False, tight=False
)


class Recommendation(BaseModel):
    """Recommended settings for one node; `reasons` says where each figure comes from."""

    model_config = ConfigDict(frozen=True)

    memory_class: str
    gpus: int
    batch_size_per_gpu: int
    gradient_accumulation: int
    effective_batch: int
    target_batch: int
    dataloader_workers_per_gpu: int
    mixed_precision: Precision
    gradient_checkpointing: bool
    zero_stage: int = Field(description="DeepSpeed ZeRO stage; 0 means plain DDP")
    reasons: dict[str, str]


def memory_class(memory_total_bytes: int) -> MemoryClass:
    gb = memory_total_bytes / GB
    for cls in MEMORY_CLASSES:
        if gb >= cls.min_gb:
            return cls
    return MEMORY_CLASSES[-1]


def supports_bf16(compute_capability: tuple[int, int] | None) -> bool:
    """bf16 needs Ampere (sm_80) or later."""
    return compute_capability is not None and compute_capability >= (8, 0)


def recommend(
    gpu_count: int,
    gpu_memory_bytes: int | None,
    compute_capability: tuple[int, int] | None,
    cpu_cores: int,
    target_batch: int = DEFAULT_TARGET_BATCH,
) -> Recommendation:
    """Settings for `gpu_count` GPUs of the smallest memory on the node (the gang's limit)."""
    if target_batch < 1:
        raise ValueError("target batch must be at least 1")
    has_gpus = gpu_count > 0 and gpu_memory_bytes is not None
    cls = memory_class(gpu_memory_bytes or 0) if has_gpus else CPU_CLASS
    ranks = max(1, gpu_count)
    # The class gives the largest micro-batch that fits; never go past what the target needs.
    batch = min(cls.batch_per_gpu, max(1, math.ceil(target_batch / ranks)))
    accumulation = max(1, math.ceil(target_batch / (batch * ranks)))
    # Each rank needs a core of its own; workers share what is left, at most 3 per rank.
    workers = max(0, min(WORKERS_PER_GPU, (cpu_cores - ranks) // ranks))
    if not has_gpus:
        precision: Precision = "fp32"
        precision_why = "CPU training: no mixed precision"
    elif supports_bf16(compute_capability):
        precision = "bf16"
        precision_why = f"compute capability {_cc(compute_capability)} supports bf16"
    else:
        precision = "fp16"
        precision_why = (
            f"compute capability {_cc(compute_capability)} has no bf16: fp16 + loss scaling"
        )
    if gpu_count <= 1:
        zero, zero_why = 0, "one GPU: nothing to shard"
    elif cls.tight:
        zero, zero_why = 3, f"{cls.label} is tight: shard parameters, grads and optimizer"
    else:
        zero, zero_why = 2, "several GPUs: shard optimizer state and gradients"
    return Recommendation(
        memory_class=cls.label,
        gpus=gpu_count,
        batch_size_per_gpu=batch,
        gradient_accumulation=accumulation,
        effective_batch=batch * ranks * accumulation,
        target_batch=target_batch,
        dataloader_workers_per_gpu=workers,
        mixed_precision=precision,
        gradient_checkpointing=cls.gradient_checkpointing,
        zero_stage=zero,
        reasons={
            "batch_size_per_gpu": (
                f"memory class {cls.label} fits {cls.batch_per_gpu}"
                + (f"; {batch} reaches the target" if batch < cls.batch_per_gpu else "")
            ),
            "gradient_accumulation": f"reach ~{target_batch} samples per optimizer step",
            "dataloader_workers_per_gpu": (
                f"{WORKERS_PER_GPU} per GPU, bounded by {cpu_cores} cores for {ranks} rank(s)"
                + (" (0: load in the training process)" if workers == 0 else "")
            ),
            "mixed_precision": precision_why,
            "gradient_checkpointing": (
                "trade compute for memory" if cls.gradient_checkpointing else "memory suffices"
            ),
            "zero_stage": zero_why,
        },
    )


def _cc(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def recommend_for_node(
    snapshot: NodeSnapshot, target_batch: int = DEFAULT_TARGET_BATCH
) -> Recommendation:
    """The recommendation for a node as one snapshot shows it (its smallest GPU decides)."""
    memories = [g.memory_total_bytes for g in snapshot.gpus if g.memory_total_bytes]
    capabilities = [g.compute_capability for g in snapshot.gpus if g.compute_capability]
    return recommend(
        gpu_count=len(snapshot.gpus),
        gpu_memory_bytes=min(memories) if memories else None,
        compute_capability=min(capabilities) if capabilities else None,
        cpu_cores=snapshot.host.cpu_count_logical,
        target_batch=target_batch,
    )
