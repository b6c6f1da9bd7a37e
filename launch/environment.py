"""The environment gpud gives a run's processes, on top of what they inherit.

Owns the variable names of the trainer contract (GPUD_*: where to publish, where to
checkpoint, what to resume from, the training hints) and the presets a spec can ask for
(NCCL and PyTorch distributed debugging, wandb). Pure: values in, a dict of strings out.
`launch.backends` adds the launcher-specific variables and the spec's own `env` last.
"""

from __future__ import annotations

import math

from launch.placement import Placement
from launch.sections import NcclSettings, TrainingHints, WandbSettings
from launch.spec import RunSpec


def scaled_lr(hints: TrainingHints, world_size: int) -> float | None:
    """The learning rate for `world_size` ranks, from `lr` tuned at `lr_base_world_size`."""
    if hints.lr is None:
        return None
    ratio = world_size / hints.lr_base_world_size
    if hints.lr_scaling == "linear":
        return hints.lr * ratio
    if hints.lr_scaling == "sqrt":
        return hints.lr * math.sqrt(ratio)
    return hints.lr


def _flag(value: bool) -> str:
    return "1" if value else "0"


def contract_env(spec: RunSpec, place: Placement, backend: str) -> dict[str, str]:
    """The GPUD_* variables the trainer library reads (docs/DESIGN.md, "Ingest")."""
    env = {
        "GPUD_RUN_ID": place.run_id,
        "GPUD_RUN_DIR": place.run_dir,
        "GPUD_INGEST": place.ingest,
        "GPUD_CONTROL": place.control,
        "GPUD_NODE": place.node_name,
        "GPUD_NODE_RANK": str(place.node_rank),
        "GPUD_ATTEMPT": str(place.attempt),
        "GPUD_CHECKPOINT_DIR": place.checkpoint_dir,
        "GPUD_CHECKPOINT_KEEP": str(spec.checkpoint.keep_last),
        "GPUD_BACKEND": backend,
        # Where a rank that torchrun did not start records an uncaught exception.
        "GPUD_ERROR_DIR": f"{place.attempt_dir}/errors",
    }
    if place.resume_from is not None:
        env["GPUD_RESUME_FROM"] = place.resume_from
    if spec.checkpoint.every_steps is not None:
        env["GPUD_CHECKPOINT_EVERY"] = str(spec.checkpoint.every_steps)
    return env


def hints_env(hints: TrainingHints, world_size: int) -> dict[str, str]:
    """The training hints that are set; a trainer keeps its own default for the others."""
    env: dict[str, str] = {}
    if hints.batch_size_per_gpu is not None:
        env["GPUD_BATCH_SIZE_PER_GPU"] = str(hints.batch_size_per_gpu)
    if hints.gradient_accumulation is not None:
        env["GPUD_GRAD_ACCUM"] = str(hints.gradient_accumulation)
    if hints.mixed_precision is not None:
        env["GPUD_MIXED_PRECISION"] = hints.mixed_precision
    if hints.gradient_checkpointing is not None:
        env["GPUD_GRAD_CHECKPOINTING"] = _flag(hints.gradient_checkpointing)
    lr = scaled_lr(hints, world_size)
    if lr is not None and hints.lr is not None:
        # The base and the rule travel too, so a trainer can log how its lr came about.
        env["GPUD_LR"] = repr(lr)
        env["GPUD_LR_BASE"] = repr(hints.lr)
        env["GPUD_LR_SCALING"] = hints.lr_scaling
        env["GPUD_LR_BASE_WORLD_SIZE"] = str(hints.lr_base_world_size)
    if hints.max_steps is not None:
        env["GPUD_MAX_STEPS"] = str(hints.max_steps)
    if hints.seed is not None:
        env["GPUD_SEED"] = str(hints.seed)
    return env


def nccl_env(nccl: NcclSettings, attempt_dir: str) -> dict[str, str]:
    """NCCL and PyTorch distributed presets; harmless under gloo, so set on every backend."""
    env: dict[str, str] = {}
    if nccl.debug is not None:
        env["NCCL_DEBUG"] = nccl.debug
    if nccl.debug_subsys is not None:
        env["NCCL_DEBUG_SUBSYS"] = nccl.debug_subsys
    if nccl.socket_ifname is not None:
        # Both: a run on gloo (CPU, or gloo side groups) must bind the same interface.
        env["NCCL_SOCKET_IFNAME"] = nccl.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = nccl.socket_ifname
    if nccl.ib_disable:
        env["NCCL_IB_DISABLE"] = "1"
    if nccl.p2p_disable:
        env["NCCL_P2P_DISABLE"] = "1"
    if nccl.flight_recorder:
        # On a collective timeout every rank dumps its recent collectives next to the
        # attempt's logs (PyTorch appends the global rank to the prefix).
        # torch 2.13 names (the TORCH_NCCL_* spellings are deprecated and warn per rank).
        env["TORCH_FR_BUFFER_SIZE"] = str(nccl.trace_buffer_size)
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        env["TORCH_FR_DUMP_TEMP_FILE"] = f"{attempt_dir}/nccl_trace_rank_"
    if nccl.async_error_handling:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if nccl.timeout_s is not None:
        env["GPUD_COLLECTIVE_TIMEOUT_S"] = str(nccl.timeout_s)
    return env


def wandb_env(wandb: WandbSettings) -> dict[str, str]:
    """wandb reads these itself; GPUD_WANDB tells the trainer library to start a run."""
    env = {"GPUD_WANDB": "1", "WANDB_MODE": wandb.mode}
    if wandb.project is not None:
        env["WANDB_PROJECT"] = wandb.project
    if wandb.entity is not None:
        env["WANDB_ENTITY"] = wandb.entity
    if wandb.group is not None:
        env["WANDB_RUN_GROUP"] = wandb.group
    if wandb.tags:
        env["WANDB_TAGS"] = ",".join(wandb.tags)
    return env


def base_env(spec: RunSpec, place: Placement, backend: str) -> dict[str, str]:
    """Everything gpud sets for every launcher, before launcher specifics and `spec.env`."""
    env = {
        # Line-buffered output: gpud parses metrics and heartbeats from logs as they come.
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": place.master_addr,
        "MASTER_PORT": str(place.master_port),
    }
    env |= contract_env(spec, place, backend)
    env |= hints_env(place.hints, place.world_size)
    env |= nccl_env(spec.nccl, place.attempt_dir)
    if spec.wandb is not None:
        env |= wandb_env(spec.wandb)
    return env
