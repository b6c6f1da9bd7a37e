"""Launcher command builders: exact argv, the real tools' parsers, environment, DeepSpeed JSON.

The argv checks compare with the command lines each tool documents; the parser checks feed
the same argv to torch's, DeepSpeed's and accelerate's own argparse, so a misspelled flag
fails here rather than on a cluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from launch import launcher_main
from launch.autotune import recommend
from launch.backends import (
    Command,
    Placement,
    build_command,
    deepspeed_config,
    resolve_backend,
    resolve_hints,
    resolve_nproc,
    scaled_lr,
)
from launch.sections import SpecError, TrainingHints
from launch.spec import RunSpec, parse_spec

PY = "/opt/venv/bin/python"
RUN_DIR = "/srv/gpud/runs/r-42"
ATTEMPT_DIR = f"{RUN_DIR}/attempt-1"
LAUNCH = f"{ATTEMPT_DIR}/gpud_launch.py"  # launch.launcher_main, written there
WORKDIR = "/home/me/project"


def make_spec(**fields: Any) -> RunSpec:
    data: dict[str, Any] = {"name": "t", "script": "train.py", "workdir": WORKDIR}
    if "module" in fields:
        data.pop("script")
    data.update(fields)
    return parse_spec(data)


def make_place(spec: RunSpec | None = None, **fields: Any) -> Placement:
    values: dict[str, Any] = {
        "run_id": "r-42",
        "attempt": 1,
        "node_name": "box0",
        "node_rank": 0,
        "nnodes": 1,
        "nproc_per_node": 4,
        "master_addr": "10.0.0.1",
        "master_port": 29517,
        "gpu_count": 4,
        "python": PY,
        "run_dir": RUN_DIR,
        "attempt_dir": ATTEMPT_DIR,
        "checkpoint_dir": f"{RUN_DIR}/checkpoints",
        "ingest": "ipc:///srv/gpud/ingest.sock",
        "control": "ipc:///srv/gpud/control.sock",
        "resume_from": None,
        "hints": (spec or make_spec()).training,
    }
    values.update(fields)
    return Placement(**values)


def build(spec: RunSpec, **place: Any) -> Command:
    return build_command(spec, make_place(spec, **place))


def multinode(rank: int) -> dict[str, Any]:
    return {"nnodes": 2, "node_rank": rank, "node_name": f"box{rank}"}


# --------------------------------------------------------------------------- torchrun


def test_torchrun_single_node_script_matches_the_documented_form() -> None:
    # torch docs: torchrun --nnodes=$NUM_NODES --nproc-per-node=$NUM_TRAINERS
    #   --node-rank=... --master-addr=... --master-port=... YOUR_TRAINING_SCRIPT.py (--arg1 ...)
    command = build(make_spec(args=["--lr", "3e-4"]))
    assert command.argv == [
        PY, LAUNCH, "torch.distributed.run",
        "--nnodes=1", "--nproc-per-node=4", "--node-rank=0",
        "--master-addr=10.0.0.1", "--master-port=29517",
        "--max-restarts=0", "--tee=3", f"--log-dir={ATTEMPT_DIR}/ranks",
        "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    assert command.cwd == WORKDIR
    assert command.files == {"gpud_launch.py": launcher_main.source()}


def test_torchrun_multi_node_module() -> None:
    # torch docs: torchrun ... -m/--module: "interpret the launch script as a Python module"
    command = build(make_spec(module="pkg.train", args=["--x"]), **multinode(1))
    assert command.argv == [
        PY, LAUNCH, "torch.distributed.run",
        "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
        "--master-addr=10.0.0.1", "--master-port=29517",
        "--max-restarts=0", "--tee=3", f"--log-dir={ATTEMPT_DIR}/ranks",
        "-m", "pkg.train", "--x",
    ]  # fmt: skip


@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_argv_parses_with_torchs_own_parser(module: bool, rank: int) -> None:
    from torch.distributed.run import get_args_parser

    entry = {"module": "pkg.train"} if module else {"script": "train.py"}
    spec = make_spec(**entry, args=["--epochs", "3", "--name=x y"])
    argv = build(spec, **multinode(rank), resume_from="/ck/step-10").argv
    assert argv[:3] == [PY, LAUNCH, "torch.distributed.run"]
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "4", rank)
    assert (args.master_addr, args.master_port) == ("10.0.0.1", 29517)
    assert (args.max_restarts, args.tee, args.log_dir) == (0, "3", f"{ATTEMPT_DIR}/ranks")
    assert args.module is module
    assert args.training_script == ("pkg.train" if module else "train.py")
    assert args.training_script_args == ["--epochs", "3", "--name=x y"]


# --------------------------------------------------------------------------- deepspeed


def test_deepspeed_single_node_matches_the_documented_form() -> None:
    # DeepSpeed docs, "launching without passwordless SSH":
    #   deepspeed --hostfile=myhostfile --no_ssh --node_rank=<n>
    #     --master_addr=<addr> --master_port=<port> <client_entry.py> <client args>
    command = build(make_spec(launcher="deepspeed", args=["--steps", "5"]))
    assert command.argv == [
        PY, LAUNCH, "deepspeed.launcher.runner",
        "--no_ssh", f"--hostfile={ATTEMPT_DIR}/hostfile",
        "--node_rank=0", "--num_nodes=1", "--num_gpus=4",
        "--master_addr=10.0.0.1", "--master_port=29517",
        "train.py", "--steps", "5",
    ]  # fmt: skip
    assert command.files == {
        "hostfile": "node0 slots=4\n",
        "gpud_launch.py": launcher_main.source(),
    }
    assert "GPUD_DEEPSPEED_CONFIG" not in command.env  # no `deepspeed:` section, no JSON


def test_deepspeed_multi_node_module() -> None:
    command = build(make_spec(launcher="deepspeed", module="pkg.train"), **multinode(1))
    assert command.argv == [
        PY, LAUNCH, "deepspeed.launcher.runner",
        "--no_ssh", f"--hostfile={ATTEMPT_DIR}/hostfile",
        "--node_rank=1", "--num_nodes=2", "--num_gpus=4",
        "--master_addr=10.0.0.1", "--master_port=29517",
        "--module", "pkg.train",
    ]  # fmt: skip


@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
@pytest.mark.parametrize("rank", [0, 1])
def test_deepspeed_argv_and_hostfile_parse_with_deepspeeds_own_runner(
    module: bool, rank: int
) -> None:
    from deepspeed.launcher.runner import _parse_hostfile, parse_args

    entry = {"module": "pkg.train"} if module else {"script": "train.py"}
    spec = make_spec(launcher="deepspeed", **entry, args=["--epochs", "3"], deepspeed={})
    command = build(spec, **multinode(rank))
    argv = command.argv
    assert argv[:3] == [PY, LAUNCH, "deepspeed.launcher.runner"]
    args = parse_args(argv[3:])
    assert args.no_ssh is True
    assert (args.node_rank, args.num_nodes, args.num_gpus) == (rank, 2, 4)
    assert (args.master_addr, args.master_port) == ("10.0.0.1", 29517)
    assert args.hostfile == f"{ATTEMPT_DIR}/hostfile"
    assert args.module is module
    assert args.user_script == ("pkg.train" if module else "train.py")
    config_path = f"{ATTEMPT_DIR}/deepspeed.json"
    assert args.user_args == ["--epochs", "3", "--deepspeed_config", config_path]
    # Without a hostfile naming both nodes the runner refuses --num_nodes=2; with it, the
    # world is two nodes of four slots each, in rank order.
    pool = _parse_hostfile(command.files["hostfile"].splitlines())
    assert list(pool.values()) == [4, 4]


@pytest.mark.parametrize("rank", [0, 1])
def test_deepspeed_on_leased_gpus_gets_include_that_its_runner_resolves(rank: int) -> None:
    """DeepSpeed's runner ignores CUDA_VISIBLE_DEVICES once given a world: the lease goes
    in --include, and the runner's own resolution gives this node exactly its GPUs."""
    from deepspeed.launcher.runner import (
        _parse_hostfile,
        parse_args,
        parse_inclusion_exclusion,
    )

    spec = make_spec(launcher="deepspeed", script="train.py", deepspeed={})
    command = build(spec, **multinode(rank), gpus=(5, 6, 7, 4)[:4])
    args = parse_args(command.argv[3:])
    assert (args.num_nodes, args.num_gpus) == (-1, -1)  # exclusive with --include
    assert "CUDA_VISIBLE_DEVICES" not in command.env
    assert command.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    pool = _parse_hostfile(command.files["hostfile"].splitlines())
    world = parse_inclusion_exclusion(pool, args.include, args.exclude)
    mine, other = list(world)[rank], list(world)[1 - rank]
    assert sorted(world[mine]) == [4, 5, 6, 7]
    assert len(world[other]) == 4  # the other node's part: only its count matters here


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "python"])
def test_leased_gpus_are_the_visible_devices_in_nvml_order(launcher: str) -> None:
    nproc = 1 if launcher == "python" else 2
    spec = make_spec(launcher=launcher, nproc_per_node=nproc)
    command = build(spec, gpus=(2, 3), nproc_per_node=nproc)
    assert command.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert command.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_VISIBLE_DEVICES" not in build(spec, nproc_per_node=nproc).env  # no lease


def test_auto_is_one_process_per_leased_gpu() -> None:
    spec = make_spec(nproc_per_node="auto")
    assert resolve_nproc(spec, gpu_count=8, leased=3) == 3
    assert resolve_nproc(spec, gpu_count=0, leased=4) == 4  # simulated GPUs, leased
    assert resolve_nproc(spec, gpu_count=0) == 1


# --------------------------------------------------------------------------- accelerate


def test_accelerate_multi_node_matches_the_documented_form() -> None:
    # accelerate docs (multi-node, no config file): accelerate launch --multi_gpu
    #   --num_machines=2 --num_processes=8 --machine_rank={node_number}
    #   --main_process_ip=... --main_process_port=... {script_name.py} {--arg1} ...
    spec = make_spec(launcher="accelerate", args=["--bs", "8"])
    command = build(spec, **multinode(1))
    assert command.argv == [
        PY, LAUNCH, "accelerate.commands.launch",
        "--multi_gpu", "--tee=3", f"--log_dir={ATTEMPT_DIR}/ranks",
        "--num_machines=2", "--num_processes=8", "--machine_rank=1",
        "--main_process_ip=10.0.0.1", "--main_process_port=29517", "--mixed_precision=no",
        "train.py", "--bs", "8",
    ]  # fmt: skip
    assert "ACCELERATE_USE_CPU" not in command.env


def test_accelerate_options_extra_args_and_module() -> None:
    spec = make_spec(
        launcher="accelerate",
        module="pkg.train",
        accelerate={
            "mixed_precision": "bf16",
            "dynamo_backend": "inductor",
            "gradient_accumulation_steps": 4,
            "num_cpu_threads_per_process": 2,
            "config_file": "/etc/accelerate.yaml",
            "extra_args": ["--same_network"],
        },
    )
    assert build(spec, nproc_per_node=1, gpu_count=1).argv == [
        PY, LAUNCH, "accelerate.commands.launch",
        "--num_machines=1", "--num_processes=1", "--machine_rank=0",
        "--main_process_ip=10.0.0.1", "--main_process_port=29517", "--mixed_precision=bf16",
        "--dynamo_backend=inductor", "--gradient_accumulation_steps=4",
        "--num_cpu_threads_per_process=2", "--config_file=/etc/accelerate.yaml",
        "--same_network",
        "-m", "pkg.train",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "nnodes", "rank", "nproc"),
    [(False, 1, 0, 1), (False, 1, 0, 4), (True, 2, 1, 4), (False, 2, 0, 2)],
)
def test_accelerate_argv_parses_with_accelerates_own_parser(
    module: bool, nnodes: int, rank: int, nproc: int
) -> None:
    from accelerate.commands.launch import launch_command_parser

    entry = {"module": "pkg.train"} if module else {"script": "train.py"}
    spec = make_spec(
        launcher="accelerate",
        **entry,
        args=["--epochs", "3"],
        accelerate={"mixed_precision": "fp16"},
    )
    argv = build(spec, nnodes=nnodes, node_rank=rank, nproc_per_node=nproc).argv
    assert argv[:3] == [PY, LAUNCH, "accelerate.commands.launch"]
    args = launch_command_parser().parse_args(argv[3:])
    assert args.multi_gpu is (nnodes * nproc > 1)
    assert args.cpu is False
    assert (args.num_machines, args.num_processes, args.machine_rank) == (
        nnodes,
        nnodes * nproc,
        rank,
    )
    assert (args.main_process_ip, args.main_process_port) == ("10.0.0.1", 29517)
    assert args.mixed_precision == "fp16"
    # accelerate's own store_true leaves an absent flag at None (it tracks what was given).
    assert bool(args.module) is module
    assert args.training_script == ("pkg.train" if module else "train.py")
    assert args.training_script_args == ["--epochs", "3"]


def test_accelerate_on_cpu_uses_the_env_and_multi_gpu_for_several_processes() -> None:
    from accelerate.commands.launch import launch_command_parser

    # `--cpu --num_processes 2` starts one process; ACCELERATE_USE_CPU=1 + --multi_gpu, two.
    command = build(make_spec(launcher="accelerate"), gpu_count=0, nproc_per_node=2)
    assert command.env["ACCELERATE_USE_CPU"] == "1"
    assert command.env["GPUD_BACKEND"] == "gloo"
    args = launch_command_parser().parse_args(command.argv[3:])
    assert (args.multi_gpu, args.cpu, args.num_processes) == (True, False, 2)


def test_accelerate_use_cpu_on_a_gpu_node_and_single_process_cpu() -> None:
    spec = make_spec(launcher="accelerate", accelerate={"use_cpu": True})
    command = build(spec, gpu_count=4, nproc_per_node=2)
    assert command.env["ACCELERATE_USE_CPU"] == "1" and "--multi_gpu" in command.argv
    assert command.env["GPUD_BACKEND"] == "gloo"
    # One process takes accelerate's simple path, which sets ACCELERATE_USE_CPU from --cpu.
    single = build(make_spec(launcher="accelerate"), gpu_count=0, nproc_per_node=1)
    assert "--cpu" in single.argv and "--multi_gpu" not in single.argv
    assert single.env["ACCELERATE_USE_CPU"] == "1"
    gpus = build(make_spec(launcher="accelerate", accelerate={"use_cpu": False}), gpu_count=0)
    assert "ACCELERATE_USE_CPU" not in gpus.env and "--cpu" not in gpus.argv


def test_accelerate_mixed_precision_follows_the_hints_unless_set() -> None:
    spec = make_spec(launcher="accelerate", training={"mixed_precision": "bf16"})
    assert "--mixed_precision=bf16" in build(spec).argv
    fp32 = make_spec(launcher="accelerate", training={"mixed_precision": "fp32"})
    assert "--mixed_precision=no" in build(fp32).argv
    explicit = make_spec(
        launcher="accelerate",
        training={"mixed_precision": "bf16"},
        accelerate={"mixed_precision": "no"},
    )
    assert "--mixed_precision=no" in build(explicit).argv


# --------------------------------------------------------------------------- python


def test_a_lone_python_process_is_not_told_it_is_one_rank_of_many() -> None:
    command = build(make_spec(launcher="python", args=["--a", "1"]), nproc_per_node=1)
    assert command.argv == [PY, "train.py", "--a", "1"]
    module = build(make_spec(launcher="python", module="pkg.train"), nproc_per_node=1)
    assert module.argv == [PY, "-m", "pkg.train"]
    inherited = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "10.9.9.9", "HOME": "/root"}
    for cmd in (command, module):
        env = cmd.environ(inherited)  # a daemon that was itself started by torchrun
        assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(env)
        assert env["HOME"] == "/root"
        assert env["TORCHELASTIC_ERROR_FILE"] == f"{ATTEMPT_DIR}/errors/rank-0.json"


def test_distributed_env_gives_a_python_process_what_torchrun_gives_one_worker() -> None:
    spec = make_spec(launcher="python", distributed_env=True)
    env = build(spec, nproc_per_node=1).environ({})
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29517")


def test_env_null_removes_a_variable_and_numbers_are_text() -> None:
    spec = make_spec(env={"HF_HUB_OFFLINE": 1, "DEBUG": True, "CUDA_LAUNCH_BLOCKING": None})
    assert spec.env == {"HF_HUB_OFFLINE": "1", "DEBUG": "1", "CUDA_LAUNCH_BLOCKING": None}
    command = build(spec)
    env = command.environ({"CUDA_LAUNCH_BLOCKING": "1", "PATH": "/bin"})
    assert "CUDA_LAUNCH_BLOCKING" not in env and env["PATH"] == "/bin"
    assert (env["HF_HUB_OFFLINE"], env["DEBUG"]) == ("1", "1")
    assert command.unset == ("CUDA_LAUNCH_BLOCKING",)
    gpud_preset = build(make_spec(env={"NCCL_DEBUG": None})).environ({})
    assert "NCCL_DEBUG" not in gpud_preset  # a preset of gpud's own can go too


def test_distributed_env_is_only_for_the_python_launcher() -> None:
    with pytest.raises(SpecError, match="distributed_env is for launcher: python"):
        parse_spec({"name": "t", "script": "t.py", "distributed_env": True})


def test_cwd_defaults_to_the_run_dir_without_a_workdir() -> None:
    spec = parse_spec({"name": "t", "script": "/abs/train.py"})
    assert build(spec).cwd == RUN_DIR


# --------------------------------------------------------------------------- environment


def test_env_carries_the_gpud_contract() -> None:
    spec = make_spec(checkpoint={"keep_last": 5, "every_steps": 100})
    env = build(spec, **multinode(1), gpu_count=0, attempt=2).env
    assert {k: v for k, v in env.items() if k.startswith("GPUD_")} == {
        "GPUD_RUN_ID": "r-42",
        "GPUD_RUN_DIR": RUN_DIR,
        "GPUD_INGEST": "ipc:///srv/gpud/ingest.sock",
        "GPUD_CONTROL": "ipc:///srv/gpud/control.sock",
        "GPUD_NODE": "box1",
        "GPUD_NODE_RANK": "1",
        "GPUD_ATTEMPT": "2",
        "GPUD_CHECKPOINT_DIR": f"{RUN_DIR}/checkpoints",
        "GPUD_CHECKPOINT_KEEP": "5",
        "GPUD_CHECKPOINT_EVERY": "100",
        "GPUD_BACKEND": "gloo",
        "GPUD_ERROR_DIR": f"{ATTEMPT_DIR}/errors",
    }
    assert env["PYTHONUNBUFFERED"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29517")
    assert "RANK" not in env  # the launcher sets ranks for torchrun


def test_every_value_is_a_string_and_nothing_is_shell_quoted() -> None:
    spec = make_spec(args=["it's", "a b", "$HOME"], env={"NOTE": "x y"})
    command = build(spec)
    assert command.argv[-3:] == ["it's", "a b", "$HOME"]
    assert all(isinstance(v, str) for v in [*command.argv, *command.env.values()])


def test_resume_sets_resume_from_and_appends_resume_args() -> None:
    spec = make_spec(args=["--steps", "9"], resume={"args": ["--init_from=resume"]})
    fresh = build(spec)
    assert "GPUD_RESUME_FROM" not in fresh.env
    assert fresh.argv[-2:] == ["--steps", "9"]
    resumed = build(spec, resume_from="/ck/step-100", attempt=2)
    assert resumed.env["GPUD_RESUME_FROM"] == "/ck/step-100"
    assert resumed.argv[-3:] == ["--steps", "9", "--init_from=resume"]


def test_hints_reach_the_env_only_when_set() -> None:
    bare = build(make_spec()).env
    hint_keys = {
        "GPUD_BATCH_SIZE_PER_GPU", "GPUD_GRAD_ACCUM", "GPUD_MIXED_PRECISION",
        "GPUD_GRAD_CHECKPOINTING", "GPUD_LR", "GPUD_LR_BASE", "GPUD_LR_SCALING",
        "GPUD_LR_BASE_WORLD_SIZE", "GPUD_MAX_STEPS", "GPUD_SEED",
    }  # fmt: skip
    assert not hint_keys & set(bare)
    spec = make_spec(
        training={
            "batch_size_per_gpu": 16,
            "gradient_accumulation": 2,
            "mixed_precision": "bf16",
            "gradient_checkpointing": False,
            "lr": 0.001,
            "max_steps": 500,
            "seed": 0,
        }
    )
    env = build(spec).env
    assert {k: env[k] for k in hint_keys} == {
        "GPUD_BATCH_SIZE_PER_GPU": "16",
        "GPUD_GRAD_ACCUM": "2",
        "GPUD_MIXED_PRECISION": "bf16",
        "GPUD_GRAD_CHECKPOINTING": "0",
        "GPUD_LR": "0.001",
        "GPUD_LR_BASE": "0.001",
        "GPUD_LR_SCALING": "none",
        "GPUD_LR_BASE_WORLD_SIZE": "1",
        "GPUD_MAX_STEPS": "500",
        "GPUD_SEED": "0",
    }


@pytest.mark.parametrize(
    ("scaling", "expected"),
    [("linear", 0.001 * 8 / 2), ("sqrt", 0.001 * math.sqrt(8 / 2)), ("none", 0.001)],
)
def test_lr_is_scaled_by_the_whole_world_size(scaling: str, expected: float) -> None:
    training = {"lr": 0.001, "lr_scaling": scaling, "lr_base_world_size": 2}
    spec = make_spec(training=training)
    assert scaled_lr(spec.training, 8) == pytest.approx(expected)
    env = build(spec, nnodes=2, nproc_per_node=4).env  # world size 8
    assert float(env["GPUD_LR"]) == pytest.approx(expected)
    assert (env["GPUD_LR_BASE"], env["GPUD_LR_SCALING"]) == ("0.001", scaling)
    assert env["GPUD_LR_BASE_WORLD_SIZE"] == "2"


def test_scaled_lr_without_lr_is_none() -> None:
    assert scaled_lr(TrainingHints(), 8) is None


def test_nccl_defaults_turn_on_the_flight_recorder() -> None:
    env = build(make_spec()).env
    assert {k: v for k, v in env.items() if any(s in k for s in ("NCCL", "GLOO", "TORCH_FR"))} == {
        "NCCL_DEBUG": "WARN",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": f"{ATTEMPT_DIR}/nccl_trace_rank_",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def test_nccl_presets_map_to_their_variables() -> None:
    spec = make_spec(
        nccl={
            "debug": "INFO",
            "debug_subsys": "INIT,NET",
            "socket_ifname": "eth0",
            "ib_disable": True,
            "p2p_disable": True,
            "trace_buffer_size": 500,
            "timeout_s": 600,
        }
    )
    env = build(spec).env
    assert {k: v for k, v in env.items() if any(s in k for s in ("NCCL", "GLOO", "TORCH_FR"))} == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_DISABLE": "1",
        "TORCH_FR_BUFFER_SIZE": "500",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": f"{ATTEMPT_DIR}/nccl_trace_rank_",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert env["GPUD_COLLECTIVE_TIMEOUT_S"] == "600"


def test_nccl_presets_off_set_nothing() -> None:
    spec = make_spec(nccl={"debug": None, "flight_recorder": False, "async_error_handling": False})
    env = build(spec).env
    assert not [k for k in env if "NCCL" in k or "GLOO" in k]


def test_wandb_variables_only_when_set() -> None:
    assert not [k for k in build(make_spec()).env if "WANDB" in k]
    minimal = build(make_spec(wandb={})).env
    assert {k: v for k, v in minimal.items() if "WANDB" in k} == {
        "GPUD_WANDB": "1",
        "WANDB_MODE": "online",
    }
    spec = make_spec(
        wandb={
            "project": "llm",
            "entity": "team",
            "mode": "offline",
            "group": "sweep-3",
            "tags": ["a", "b"],
        }
    )
    env = build(spec).env
    assert {k: v for k, v in env.items() if "WANDB" in k} == {
        "GPUD_WANDB": "1",
        "WANDB_PROJECT": "llm",
        "WANDB_ENTITY": "team",
        "WANDB_MODE": "offline",
        "WANDB_RUN_GROUP": "sweep-3",
        "WANDB_TAGS": "a,b",
    }


def test_spec_env_is_added_last_and_may_tune_presets() -> None:
    env = build(make_spec(env={"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "TRACE"})).env
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["NCCL_DEBUG"] == "TRACE"


# --------------------------------------------------------------------------- DeepSpeed JSON


def test_deepspeed_config_from_inline_fields() -> None:
    spec = make_spec(
        launcher="deepspeed",
        training={"batch_size_per_gpu": 8, "gradient_accumulation": 4, "mixed_precision": "bf16"},
        deepspeed={
            "zero_stage": 3,
            "offload_optimizer": True,
            "offload_params": True,
            "gradient_clipping": 1.0,
            "extra": {
                "zero_optimization": {"overlap_comm": True, "offload_param": {"pin_memory": True}},
                "wall_clock_breakdown": False,
            },
        },
    )
    assert deepspeed_config(spec, make_place(spec)) == {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
        },
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def test_deepspeed_config_defaults_and_own_fields_win_over_hints() -> None:
    bare = make_spec(launcher="deepspeed", deepspeed={})
    assert deepspeed_config(bare, make_place(bare)) == {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "steps_per_print": 10**9,
    }
    spec = make_spec(
        launcher="deepspeed",
        training={"gradient_accumulation": 4, "mixed_precision": "bf16"},
        deepspeed={"gradient_accumulation": 2, "precision": "fp16"},
    )
    config = deepspeed_config(spec, make_place(spec))
    assert config["gradient_accumulation_steps"] == 2
    assert config["fp16"] == {"enabled": True} and "bf16" not in config
    fp32 = make_spec(launcher="deepspeed", training={"mixed_precision": "fp32"}, deepspeed={})
    assert not {"fp16", "bf16"} & set(deepspeed_config(fp32, make_place(fp32)))


def test_a_given_deepspeed_config_passes_through_unchanged() -> None:
    given = {"train_batch_size": 64, "zero_optimization": {"stage": 1}, "fp16": {"enabled": True}}
    spec = make_spec(
        launcher="deepspeed", training={"batch_size_per_gpu": 8}, deepspeed={"config": given}
    )
    config = deepspeed_config(spec, make_place(spec))
    assert config == given
    config["zero_optimization"]["stage"] = 3
    assert given["zero_optimization"] == {"stage": 1}  # a copy, not the spec's own dict


def test_deepspeed_json_file_env_and_config_arg() -> None:
    spec = make_spec(
        launcher="deepspeed", args=["--x"], resume={"args": ["--resume"]}, deepspeed={}
    )
    command = build(spec, resume_from="/ck/1")
    path = f"{ATTEMPT_DIR}/deepspeed.json"
    assert json.loads(command.files["deepspeed.json"]) == deepspeed_config(spec, make_place(spec))
    assert command.files["deepspeed.json"].startswith("{\n  ")  # indent=2, for people
    assert command.env["GPUD_DEEPSPEED_CONFIG"] == path
    assert command.argv[-4:] == ["--x", "--resume", "--deepspeed_config", path]
    custom = build(make_spec(launcher="deepspeed", deepspeed={"config_arg": "--ds"}))
    assert custom.argv[-2:] == ["--ds", path]


def test_deepspeed_config_arg_null_passes_the_path_by_env_only() -> None:
    spec = make_spec(args=["--x"], deepspeed={"config_arg": None})  # torchrun + deepspeed
    command = build(spec)
    assert command.argv[-1] == "--x"
    assert command.env["GPUD_DEEPSPEED_CONFIG"] == f"{ATTEMPT_DIR}/deepspeed.json"
    assert set(command.files) == {"deepspeed.json", "gpud_launch.py"}


def test_deepspeed_config_needs_a_deepspeed_section() -> None:
    spec = make_spec()
    with pytest.raises(ValueError, match="deepspeed"):
        deepspeed_config(spec, make_place(spec))


# --------------------------------------------------------------------------- resolving auto


@pytest.mark.parametrize(
    ("nproc", "launcher", "gpus", "expected"),
    [
        ("auto", "torchrun", 8, 8),
        ("auto", "torchrun", 0, 1),
        (2, "torchrun", 8, 2),
        (3, "deepspeed", 0, 3),
        ("auto", "python", 8, 1),
    ],
)
def test_resolve_nproc(nproc: Any, launcher: str, gpus: int, expected: int) -> None:
    assert resolve_nproc(make_spec(nproc_per_node=nproc, launcher=launcher), gpus) == expected


@pytest.mark.parametrize(
    ("fields", "gpus", "expected"),
    [
        ({}, 4, "nccl"),
        ({}, 0, "gloo"),
        ({"backend": "gloo"}, 4, "gloo"),
        ({"backend": "nccl"}, 0, "nccl"),
        ({"launcher": "accelerate", "accelerate": {"use_cpu": True}}, 4, "gloo"),
    ],
)
def test_resolve_backend(fields: dict[str, Any], gpus: int, expected: str) -> None:
    assert resolve_backend(make_spec(**fields), gpus) == expected


def test_resolve_hints_fills_only_unset_hints_when_auto() -> None:
    gpu = recommend(
        gpu_count=8, gpu_memory_bytes=80 * 10**9, compute_capability=(9, 0), cpu_cores=64
    )
    training = TrainingHints(auto=True, batch_size_per_gpu=4, lr=0.01)
    hints = resolve_hints(training, gpu)
    assert hints.batch_size_per_gpu == 4  # explicit wins
    assert hints.gradient_accumulation == gpu.gradient_accumulation
    assert hints.mixed_precision == "bf16"
    assert hints.gradient_checkpointing is False
    assert hints.lr == 0.01
    explicit = resolve_hints(TrainingHints(auto=True, mixed_precision="fp16"), gpu)
    assert explicit.mixed_precision == "fp16"


def test_resolve_hints_on_cpu_recommends_fp32() -> None:
    cpu = recommend(gpu_count=0, gpu_memory_bytes=None, compute_capability=None, cpu_cores=8)
    hints = resolve_hints(TrainingHints(auto=True), cpu)
    assert (hints.mixed_precision, hints.batch_size_per_gpu) == ("fp32", cpu.batch_size_per_gpu)
    assert hints.gradient_checkpointing is False


def test_resolve_hints_without_auto_or_recommendation_is_unchanged() -> None:
    cpu = recommend(gpu_count=0, gpu_memory_bytes=None, compute_capability=None, cpu_cores=8)
    manual = TrainingHints(batch_size_per_gpu=2)
    assert resolve_hints(manual, cpu) == manual
    auto = TrainingHints(auto=True)
    assert resolve_hints(auto, None) == auto


def test_placement_rejects_a_rank_outside_the_gang() -> None:
    with pytest.raises(ValueError, match="node_rank"):
        make_place(nnodes=2, node_rank=2)
    place = make_place(nnodes=2, node_rank=1, nproc_per_node=3)
    assert place.world_size == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        place.node_rank = 0  # type: ignore[misc]


def test_the_ranks_never_inherit_gpud_settings_only_what_the_command_sets() -> None:
    inherited = {"GPUD_STATE_DIR": "/var/lib/gpud", "GPUD_RUN_ID": "someone-else", "HOME": "/r"}
    env = build(make_spec()).environ(inherited)
    assert "GPUD_STATE_DIR" not in env and env["HOME"] == "/r"
    assert env["GPUD_RUN_ID"] != "someone-else"  # the command's own run id
