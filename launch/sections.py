"""The sections of a run spec: everything `launch.spec.RunSpec` holds below its top level.

`deepspeed`, `accelerate`, `training` (the hints), `checkpoint`, `resume`, `slurm`,
`restart`, `elastic`, `metrics` (the patterns), `logs`, `nccl` and `wandb`, each a strict
model (`SpecModel`: unknown keys are refused, naming the nearest valid one), with the
`Launcher` names and `SpecError`. Pure: no I/O.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpud.model.run import DEFAULT_RESTART_ON, CauseKind
from gpud.model.sizes import SizeError, parse_size, size_text
from gpud.patterns.engine import MAX_PATTERN_CHARS, PatternError, compile_pattern

#: What each node keeps of an attempt's output when neither the spec nor the daemon says.
DEFAULT_LOG_MAX_BYTES = 100_000_000
#: The least bound: each of the log's four quarters still holds many lines.
MIN_LOG_MAX_BYTES = 64_000


class SpecError(ValueError):
    """A run spec that cannot be used; `str()` is one line naming file, key and problem."""


class Launcher(str, Enum):
    TORCHRUN = "torchrun"
    DEEPSPEED = "deepspeed"
    ACCELERATE = "accelerate"
    PYTHON = "python"


class SpecModel(BaseModel):
    """Base of every spec section: strict about keys, immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


Precision = Literal["fp32", "fp16", "bf16"]


class DeepSpeedSettings(SpecModel):
    """DeepSpeed: a JSON config (a path, inlined by gpuctl) or the common fields inline."""

    config: str | dict[str, Any] | None = Field(
        None, description="path to a DeepSpeed JSON config (relative to this file), or its content"
    )
    zero_stage: int = Field(2, ge=0, le=3, description="ZeRO stage 0 to 3")
    offload_optimizer: bool = Field(False, description="keep optimizer state on the CPU")
    offload_params: bool = Field(False, description="keep parameters on the CPU (ZeRO-3 only)")
    precision: Precision | None = Field(
        None, description="fp16 or bf16 (default: training.mixed_precision, else fp32)"
    )
    gradient_accumulation: int | None = Field(
        None, ge=1, description="default: training.gradient_accumulation"
    )
    gradient_clipping: float | None = Field(None, gt=0, description="max gradient norm")
    config_arg: str | None = Field(
        "--deepspeed_config",
        description="script argument that receives the JSON path (null: env only)",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="more DeepSpeed JSON keys, merged in as given"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DeepSpeedSettings:
        inline = self.model_fields_set - {"config", "config_arg"}
        if self.config is not None and inline:
            raise ValueError(
                f"deepspeed.config and inline fields ({', '.join(sorted(inline))}) are "
                "exclusive: put everything in the JSON file, or drop `config`"
            )
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("deepspeed.offload_params needs zero_stage: 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs zero_stage 1, 2 or 3")
        return self


class AccelerateSettings(SpecModel):
    """Options handed to `accelerate launch`."""

    mixed_precision: Literal["no", "fp16", "bf16", "fp8"] | None = Field(
        None, description="accelerate's --mixed_precision (default: training.mixed_precision)"
    )
    use_cpu: bool | None = Field(
        None, description="train on CPU processes (default: when the node has no real GPU)"
    )
    dynamo_backend: str | None = Field(None, description="accelerate's --dynamo_backend")
    gradient_accumulation_steps: int | None = Field(None, ge=1)
    num_cpu_threads_per_process: int | None = Field(None, ge=1)
    config_file: str | None = Field(None, description="an accelerate config file on the nodes")
    extra_args: list[str] = Field(
        default_factory=list, description="more `accelerate launch` flags, as given"
    )


class TrainingHints(SpecModel):
    """Hints handed to trainers through the environment (GPUD_*)."""

    auto: bool = Field(False, description="fill unset hints from the node's hardware table")
    batch_size_per_gpu: int | None = Field(None, ge=1)
    gradient_accumulation: int | None = Field(None, ge=1)
    seq_len: int | None = Field(
        None, ge=1, description="tokens per sample: gpud reports tokens/s as samples/s × seq_len"
    )
    mixed_precision: Precision | None = None
    flops_per_sample: float | None = Field(
        None,
        gt=0,
        description="training FLOPs of one sample (forward + backward): gpud reports achieved"
        " FLOP/s as samples/s × this, and MFU against the GPUs' peak",
    )
    model_params: int | None = Field(
        None,
        ge=1,
        description="the model's parameters: with seq_len, gpud estimates achieved FLOP/s as"
        " 6 × model_params × tokens/s (when flops_per_sample is unset)",
    )
    gradient_checkpointing: bool | None = None
    lr: float | None = Field(None, gt=0, description="learning rate at lr_base_world_size")
    lr_scaling: Literal["linear", "sqrt", "none"] = Field(
        "none", description="how lr scales with the world size"
    )
    lr_base_world_size: int = Field(1, ge=1, description="world size `lr` was tuned for")
    max_steps: int | None = Field(None, ge=1, description="optimizer steps to train")
    seed: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _scaling_needs_lr(self) -> TrainingHints:
        if self.lr_scaling != "none" and self.lr is None:
            raise ValueError(f"training.lr_scaling: {self.lr_scaling} needs training.lr")
        return self


class CheckpointSettings(SpecModel):
    dir: str | None = Field(
        None,
        description="default: <run-dir>/checkpoints; a relative path is taken from the workdir",
    )
    keep_last: int = Field(3, ge=1, description="checkpoints to keep")
    every_steps: int | None = Field(None, ge=1, description="save every N steps (hint)")


class ResumeSettings(SpecModel):
    """How a resumed attempt finds its checkpoint and tells the trainer."""

    args: list[str] = Field(
        default_factory=list,
        description="appended to the script's args on resume (e.g. --init_from=resume)",
    )
    latest: Literal["auto", "reported", "newest"] = Field(
        "auto",
        description="reported: what the trainer reported; newest: the newest match of "
        "`pattern` in the checkpoint dir; auto: reported, else newest",
    )
    pattern: str = Field(
        "*",
        description="glob for checkpoints in the checkpoint dir; only matches written after"
        " the run was created count (never another run's checkpoint)",
    )
    require_checkpoint: bool = Field(
        False,
        description="refuse to resume or restart without a checkpoint of this run, instead"
        " of starting from scratch (gpuctl resume --from PATH names one)",
    )


#: Slurm's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED).
SLURM_TIME = re.compile(
    r"^(UNLIMITED|\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?)$"
)
SLURM_WORD = r"^[A-Za-z0-9_.,:+=@%/-]+$"


class SlurmSettings(SpecModel):
    """Run under Slurm (`gpuctl launch --slurm`): the allocation sbatch asks for."""

    partition: str | None = Field(None, pattern=SLURM_WORD)
    account: str | None = Field(None, pattern=SLURM_WORD)
    qos: str | None = Field(None, pattern=SLURM_WORD)
    time: str | None = Field(None, description="time limit: MM, HH:MM:SS, D-HH:MM, ...")
    nodes: int = Field(1, ge=1, description="nodes in the allocation (one part each)")
    gpus_per_node: int | None = Field(
        None, ge=0, description="GPUs per node (default: the spec's `gpus` when a count)"
    )
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = Field(None, pattern=r"^\d+[KMGT]?$", description="per node, e.g. 64G")
    constraint: str | None = Field(None, pattern=r"^[A-Za-z0-9_.,:&|*\[\]()-]+$")
    exclusive: bool = False
    extra: list[str] = Field(
        default_factory=list, description="more sbatch flags, each `--flag` or `--flag=value`"
    )
    requeue: bool = Field(False, description="requeue on the time-limit signal or preemption")
    signal_before_s: int = Field(
        120, ge=1, le=65535, description="seconds before the time limit to stop with a checkpoint"
    )

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # minutes, as YAML reads `time: 30`
        if isinstance(value, str) and not SLURM_TIME.match(value):
            raise ValueError(f"{value!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM, ...)")
        return value

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for flag in value:
            if not flag.startswith("--") or "\n" in flag:
                raise ValueError(f"{flag!r}: each extra sbatch flag is one `--flag[=value]`")
        return value


class RestartSettings(SpecModel):
    max_attempts: int = Field(0, ge=0, le=1000, description="automatic restarts after failure")
    backoff_s: float = Field(10.0, ge=0, le=3600, description="wait before the first restart")
    backoff_max_s: float = Field(300.0, ge=0, le=86400, description="cap of the doubling wait")
    on: list[CauseKind] = Field(
        default_factory=lambda: list(DEFAULT_RESTART_ON),
        description="the failure causes worth a restart (user code is not, by default): "
        + ", ".join(kind.value for kind in CauseKind),
    )
    hang_timeout_s: float | None = Field(
        None,
        ge=5,
        le=86400,
        description="a run health calls stalled this long is stopped as a hang and restarted"
        " from its latest checkpoint (when `on` has hang and restarts are left); unset: never",
    )


class ElasticSettings(SpecModel):
    """Keep training on the healthy nodes when one is lost, drained or fails its preflight
    (issue 21): node 0 starts the next attempt on what is left, plus a spare."""

    min_nodes: int = Field(
        ge=1,
        description="fewer healthy nodes than this: the run waits, queued, with queue: true,"
        " and fails without it",
    )
    max_nodes: int | None = Field(
        None, ge=1, description="most nodes an attempt uses (default: the spec's nodes)"
    )
    spares: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="daemon addresses HOST:PORT of nodes that join an attempt only to take a"
        " lost node's place (joined at launch, idle until then)",
    )
    keep_global_batch: bool = Field(
        True,
        description="raise training.gradient_accumulation as the world shrinks, so the"
        " global batch stays the same (the learning rate is left alone)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ElasticSettings:
        if self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes {self.max_nodes} is below min_nodes {self.min_nodes}")
        return self


class MetricPattern(SpecModel):
    """A regex over log lines; each named group becomes a metric (`step` is the step).

    It runs on RE2 (linear time: no backreferences or lookarounds; `gpud.patterns`)."""

    pattern: str = Field(
        max_length=MAX_PATTERN_CHARS,
        description=r"e.g. 'iter (?P<step>\d+): loss (?P<loss>[\d.]+)'; RE2 syntax: no"
        " backreferences, lookarounds or possessive quantifiers",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            compiled = compile_pattern(value)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        if not set(compiled.names) - {"step"}:
            raise ValueError("needs a named group for a metric, e.g. (?P<loss>[0-9.]+)")
        return value


def log_bound(value: Any) -> int:
    """`logs.max_bytes` (and `gpud serve --logs-max-bytes`): a size of at least 64 kB."""
    try:
        size = parse_size(value)
    except SizeError as exc:
        raise ValueError(str(exc)) from None
    if size < MIN_LOG_MAX_BYTES:
        raise ValueError(
            f"{value!r} is below the least bound, {size_text(MIN_LOG_MAX_BYTES)}"
            " (a quarter of it is the head, three quarters the tail)"
        )
    return size


LogBound = Annotated[
    int,
    BeforeValidator(log_bound),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": MIN_LOG_MAX_BYTES},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]i?)?[bB]?\s*$"},
            ]
        }
    ),
]


class LogSettings(SpecModel):
    """How much of each attempt's output a node keeps (`gpuctl logs`, gputop, causes)."""

    max_bytes: LogBound | None = Field(
        None,
        description="bound on a node's log of one attempt, e.g. 100MB or 2GiB (at least"
        " 64kB): its first quarter and its last half to three quarters are kept, and"
        " readers show a mark saying how many lines were dropped between; unset: the"
        " daemon's `--logs-max-bytes` (100MB unless set)",
    )


class NcclSettings(SpecModel):
    """Presets for NCCL and PyTorch distributed environment variables."""

    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(
        "WARN", description="NCCL_DEBUG"
    )
    debug_subsys: str | None = Field(None, description="NCCL_DEBUG_SUBSYS")
    socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME")
    ib_disable: bool = Field(False, description="NCCL_IB_DISABLE=1")
    p2p_disable: bool = Field(False, description="NCCL_P2P_DISABLE=1")
    flight_recorder: bool = Field(
        True, description="PyTorch's NCCL flight recorder, dumped into the run dir on timeout"
    )
    trace_buffer_size: int = Field(2000, ge=1, description="TORCH_FR_BUFFER_SIZE")
    timeout_s: int | None = Field(
        None, ge=1, description="collective timeout the trainers library uses"
    )
    async_error_handling: bool = Field(True, description="TORCH_NCCL_ASYNC_ERROR_HANDLING=1")


class WandbSettings(SpecModel):
    project: str | None = None
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] = "online"
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
