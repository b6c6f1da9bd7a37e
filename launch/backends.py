"""How one node's part of a run is started: the launcher command line, environment and files.

Pure functions of a `RunSpec` and a `Placement` (where this node sits in the gang and the
paths gpud chose); no I/O, no sockets, no torch. The daemon writes `Command.files` into the
attempt directory and hands `argv`/`env`/`cwd` to the shim. Launchers run as
`python -m <module>` would (through `launch.launcher_main`, which the command writes into
the attempt directory) so nothing depends on PATH, and argv is always a list: nothing is
quoted, joined or passed through a shell.

The flags follow each tool's own argparse (torch.distributed.run, deepspeed.launcher.runner,
accelerate.commands.launch); tests parse every generated command with those parsers.
The environment a run's processes get (the GPUD_* contract, hints, NCCL, wandb) lives in
`launch.environment`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launch import launcher_main
from launch.autotune import Recommendation
from launch.environment import base_env, scaled_lr
from launch.placement import Placement
from launch.sections import Launcher, TrainingHints
from launch.spec import RunSpec

__all__ = [
    "Command",
    "Placement",
    "build_command",
    "deepspeed_config",
    "resolve_backend",
    "resolve_hints",
    "resolve_nproc",
    "scaled_lr",
]

#: Written into the attempt directory; the trainer finds it through GPUD_DEEPSPEED_CONFIG.
DEEPSPEED_CONFIG_FILE = "deepspeed.json"
#: DeepSpeed's runner needs a hostfile naming every node, even with --no_ssh (see below).
DEEPSPEED_HOSTFILE = "hostfile"
#: DeepSpeed prints its config and throughput every `steps_per_print` steps; gpud has its
#: own metrics, so keep that out of the logs.
QUIET_STEPS_PER_PRINT = 10**9


#: What torchrun gives its workers; a lone `launcher: python` process gets none of them.
DISTRIBUTED_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]  # ONLY what gpud adds on top of the inherited environment
    cwd: str
    files: dict[str, str]  # file name (written into attempt_dir by the caller) -> content
    unset: tuple[str, ...] = ()  # inherited variables the processes must not see

    def environ(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The processes' whole environment: inherited, plus what gpud adds, less unset.
        Inherited GPUD_* variables (the daemon's own settings, or the submitter's) never
        reach the ranks: what they need of gpud's, `env` says."""
        env = {k: v for k, v in inherited.items() if not k.startswith("GPUD_")}
        env.update(self.env)
        for name in self.unset:
            env.pop(name, None)
        return env


# --------------------------------------------------------------------------- resolving "auto"


def resolve_nproc(spec: RunSpec, gpu_count: int, leased: int = 0) -> int:
    """Processes per node: the spec's number; for `auto`, one per GPU leased to the part
    (else per real GPU, else 1)."""
    if spec.launcher is Launcher.PYTHON:
        return 1  # one process whatever the node has; the spec rejects anything else
    if spec.nproc_per_node == "auto":
        return leased or gpu_count or 1
    return spec.nproc_per_node


def _accelerate_on_cpu(spec: RunSpec, gpu_count: int) -> bool:
    use_cpu = spec.accelerate.use_cpu if spec.accelerate is not None else None
    return gpu_count == 0 if use_cpu is None else use_cpu


def resolve_backend(spec: RunSpec, gpu_count: int) -> str:
    """The torch.distributed backend: nccl on GPUs, gloo on CPU."""
    if spec.backend != "auto":
        return spec.backend
    if spec.launcher is Launcher.ACCELERATE and _accelerate_on_cpu(spec, gpu_count):
        return "gloo"  # accelerate told to train on CPU although the node has GPUs
    return "nccl" if gpu_count else "gloo"


def resolve_hints(training: TrainingHints, recommendation: Recommendation | None) -> TrainingHints:
    """With `training.auto`, fill the hints left unset from the hardware table; explicit wins."""
    if not training.auto or recommendation is None:
        return training
    filled = {
        "batch_size_per_gpu": recommendation.batch_size_per_gpu,
        "gradient_accumulation": recommendation.gradient_accumulation,
        "mixed_precision": recommendation.mixed_precision,  # fp32 on CPU stays fp32
        "gradient_checkpointing": recommendation.gradient_checkpointing,
    }
    update = {key: value for key, value in filled.items() if getattr(training, key) is None}
    return training.model_copy(update=update)


# --------------------------------------------------------------------------- DeepSpeed JSON


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def deepspeed_config(spec: RunSpec, place: Placement) -> dict[str, Any]:
    """The DeepSpeed JSON: the user's file as given, or built from the inline fields."""
    settings = spec.deepspeed
    if settings is None:
        raise ValueError("the run spec has no `deepspeed` section")
    if isinstance(settings.config, dict):
        # The user's file is the whole truth; filling keys in would fight with it.
        return copy.deepcopy(settings.config)
    hints = place.hints
    zero: dict[str, Any] = {"stage": settings.zero_stage}
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if settings.offload_params:
        zero["offload_param"] = {"device": "cpu"}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": hints.batch_size_per_gpu or 1,
        "gradient_accumulation_steps": (
            settings.gradient_accumulation or hints.gradient_accumulation or 1
        ),
        "zero_optimization": zero,
        "steps_per_print": QUIET_STEPS_PER_PRINT,
    }
    precision = settings.precision or hints.mixed_precision
    if precision in ("fp16", "bf16"):
        config[precision] = {"enabled": True}
    if settings.gradient_clipping is not None:
        config["gradient_clipping"] = settings.gradient_clipping
    return _deep_merge(config, settings.extra)


def _deepspeed_slots(place: Placement, rank: int) -> list[int]:
    """The device slots node `rank` runs on. This node's are its leased GPUs; another
    node's only count (each node's gpud starts its own part), so they are 0..nproc-1."""
    if rank == place.node_rank and place.gpus:
        return list(place.gpus)
    return list(range(place.nproc_per_node))


def _deepspeed_hostfile(place: Placement) -> str:
    # With --no_ssh, DeepSpeed's runner still sizes the world from a hostfile: without one
    # it fails for --num_nodes > 1 ("no extra nodes available via hostfile") and replaces
    # --master_addr with 127.0.0.1. Only the order and slot counts matter, not the names
    # (nothing connects to them), so synthetic ones keep this independent of DNS. A node's
    # slots must reach past its highest leased GPU for --include to name it.
    return "".join(
        f"node{rank} slots={max(_deepspeed_slots(place, rank)) + 1}\n"
        for rank in range(place.nnodes)
    )


def _deepspeed_include(place: Placement) -> str:
    """`--include node0:2,3@node1:0,1`: DeepSpeed's runner ignores CUDA_VISIBLE_DEVICES
    when it is given a world, and sets it for each rank from this instead."""
    return "@".join(
        f"node{rank}:{','.join(map(str, _deepspeed_slots(place, rank)))}"
        for rank in range(place.nnodes)
    )


# --------------------------------------------------------------------------- command lines


def _target(spec: RunSpec, module_flag: str) -> list[str]:
    if spec.module is not None:
        return [module_flag, spec.module]
    return [spec.entry]


def _launcher(place: Placement, module: str) -> list[str]:
    """`python -m module`, through `launch.launcher_main` (written into the attempt dir):
    the launcher exits as soon as it is done, not a second of torch teardown later."""
    return [place.python, f"{place.attempt_dir}/{launcher_main.FILE_NAME}", module]


def _torchrun_argv(spec: RunSpec, place: Placement) -> list[str]:
    return [
        *_launcher(place, "torch.distributed.run"),
        f"--nnodes={place.nnodes}",
        f"--nproc-per-node={place.nproc_per_node}",
        f"--node-rank={place.node_rank}",
        f"--master-addr={place.master_addr}",
        f"--master-port={place.master_port}",
        # gpud restarts whole attempts itself (from a checkpoint), never torchrun.
        "--max-restarts=0",
        # Prefix every worker line with [default<local_rank>]: and keep per-rank files.
        "--tee=3",
        f"--log-dir={place.attempt_dir}/ranks",
        *_target(spec, "-m"),
    ]


def _deepspeed_argv(spec: RunSpec, place: Placement) -> list[str]:
    return [
        *_launcher(place, "deepspeed.launcher.runner"),
        # Each node's gpud starts its own part: no ssh/pdsh fan-out from node 0.
        "--no_ssh",
        f"--hostfile={place.attempt_dir}/{DEEPSPEED_HOSTFILE}",
        f"--node_rank={place.node_rank}",
        # --include and --num_nodes/--num_gpus are exclusive; leased GPUs need --include.
        *(
            [f"--include={_deepspeed_include(place)}"]
            if place.gpus
            else [f"--num_nodes={place.nnodes}", f"--num_gpus={place.nproc_per_node}"]
        ),
        f"--master_addr={place.master_addr}",
        f"--master_port={place.master_port}",
        *_target(spec, "--module"),
    ]


def _accelerate_mixed_precision(spec: RunSpec, place: Placement) -> str:
    settings = spec.accelerate
    if settings is not None and settings.mixed_precision is not None:
        return settings.mixed_precision
    # Unset: follow the training hints, as the DeepSpeed config does.
    precision = place.hints.mixed_precision
    return precision if precision in ("fp16", "bf16") else "no"


def _accelerate_argv(spec: RunSpec, place: Placement) -> list[str]:
    settings = spec.accelerate
    argv = _launcher(place, "accelerate.commands.launch")
    on_cpu = _accelerate_on_cpu(spec, place.gpu_count)
    if place.world_size > 1:
        # Also on CPU: `--cpu` would take accelerate's single-process path, while
        # --multi_gpu with ACCELERATE_USE_CPU=1 starts every process on gloo.
        # --tee makes torchrun (under accelerate) prefix worker lines with their local rank,
        # which gpud's log filters and failure reports rely on.
        argv += ["--multi_gpu", "--tee=3", f"--log_dir={place.attempt_dir}/ranks"]
    elif on_cpu:
        # The single-process path overwrites ACCELERATE_USE_CPU from this flag.
        argv.append("--cpu")
    argv += [
        f"--num_machines={place.nnodes}",
        f"--num_processes={place.world_size}",
        f"--machine_rank={place.node_rank}",
        f"--main_process_ip={place.master_addr}",
        f"--main_process_port={place.master_port}",
        f"--mixed_precision={_accelerate_mixed_precision(spec, place)}",
    ]
    if settings is not None:
        if settings.dynamo_backend is not None:
            argv.append(f"--dynamo_backend={settings.dynamo_backend}")
        if settings.gradient_accumulation_steps is not None:
            argv.append(f"--gradient_accumulation_steps={settings.gradient_accumulation_steps}")
        if settings.num_cpu_threads_per_process is not None:
            argv.append(f"--num_cpu_threads_per_process={settings.num_cpu_threads_per_process}")
        if settings.config_file is not None:
            argv.append(f"--config_file={settings.config_file}")
        argv += settings.extra_args
    return argv + _target(spec, "-m")


def _python_argv(spec: RunSpec, place: Placement) -> list[str]:
    return [place.python, *_target(spec, "-m")]


_ARGV = {
    Launcher.TORCHRUN: _torchrun_argv,
    Launcher.DEEPSPEED: _deepspeed_argv,
    Launcher.ACCELERATE: _accelerate_argv,
    Launcher.PYTHON: _python_argv,
}


def build_command(spec: RunSpec, place: Placement) -> Command:
    """The launcher command for this node's part of the run."""
    argv = _ARGV[spec.launcher](spec, place)
    argv += spec.args
    if place.resume_from is not None:
        argv += spec.resume.args
    env = base_env(spec, place, backend=resolve_backend(spec, place.gpu_count))
    single = spec.launcher is Launcher.PYTHON and not spec.distributed_env
    if single:
        # A lone process is not one rank of many: scripts read RANK/MASTER_ADDR as "torchrun
        # started me" and wait for peers that never come (or init nccl on a CPU box).
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            env.pop(name)
    files: dict[str, str] = {}
    if spec.launcher is not Launcher.PYTHON:
        files[launcher_main.FILE_NAME] = launcher_main.source()
    if spec.deepspeed is not None:
        config_path = f"{place.attempt_dir}/{DEEPSPEED_CONFIG_FILE}"
        files[DEEPSPEED_CONFIG_FILE] = json.dumps(deepspeed_config(spec, place), indent=2)
        env["GPUD_DEEPSPEED_CONFIG"] = config_path
        if spec.deepspeed.config_arg is not None:
            argv += [spec.deepspeed.config_arg, config_path]
    if spec.launcher is Launcher.DEEPSPEED:
        files[DEEPSPEED_HOSTFILE] = _deepspeed_hostfile(place)
    elif spec.launcher is Launcher.ACCELERATE and _accelerate_on_cpu(spec, place.gpu_count):
        env["ACCELERATE_USE_CPU"] = "1"
    elif spec.launcher is Launcher.PYTHON:
        # torch's error-file contract, which torchrun gives each of its workers.
        env["TORCHELASTIC_ERROR_FILE"] = f"{place.attempt_dir}/errors/rank-0.json"
        if not single:  # distributed_env: what torchrun would give a single worker
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    if place.gpus:
        # Indices as NVML (and so the lease) counts them, not CUDA's fastest-first order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if spec.launcher is not Launcher.DEEPSPEED:  # DeepSpeed's runner: --include
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, place.gpus))
    # The user's own variables come last: they may tune any preset above, or remove one.
    unset = [name for name, value in spec.env.items() if value is None]
    if single:  # nor inherited from a daemon that was itself started by torchrun
        unset += [n for n in DISTRIBUTED_VARS if n not in spec.env and n not in unset]
    env.update({name: value for name, value in spec.env.items() if value is not None})
    for name in unset:
        env.pop(name, None)
    cwd = spec.workdir or place.run_dir
    return Command(argv=argv, env=env, cwd=cwd, files=files, unset=tuple(unset))
