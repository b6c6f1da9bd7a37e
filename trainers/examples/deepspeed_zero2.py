"""DeepSpeed ZeRO-2 (torchrun or the deepspeed launcher), instrumented with the trainers library.

Runs on gloo (CPU, `deepspeed.initialize` inside the script) and nccl (GPU), with the
optimizer state optionally offloaded to CPU. The DeepSpeed JSON comes from gpud
(GPUD_DEEPSPEED_CONFIG, or the `--deepspeed_config` argument it appends); run by hand,
the script builds a small ZeRO-2 config from its flags. Gradient accumulation is
DeepSpeed's; checkpoints are DeepSpeed's own sharded ones plus every rank's RNG state and
the data position, so a stopped and resumed run ends with the same weights as one that
never stopped.

    torchrun --nproc-per-node=2 trainers/examples/deepspeed_zero2.py --steps 100   # CPU
    deepspeed trainers/examples/deepspeed_zero2.py --steps 100                      # GPUs
    gpuctl launch config/examples/cpu-deepspeed-zero2.yaml                          # gpud
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import trainers
from trainers.checkpoint import Checkpointer
from trainers.data import ResumableBatches, ResumableDistributedSampler
from trainers.distributed import init_distributed
from trainers.examples.toy import (
    Pace,
    ToyModel,
    common_args,
    done_line,
    one_thread_per_rank,
    save_final,
    synthetic_dataset,
)


def deepspeed_config(path: str | None, args: Any) -> dict[str, Any]:
    """The run's DeepSpeed JSON (gpud's or the user's), else a small ZeRO-2 one.

    Batch geometry the JSON leaves out comes from the flags; DeepSpeed then checks it.
    """
    if path:
        config: dict[str, Any] = json.loads(Path(path).read_text())
    else:
        config = {
            "zero_optimization": {"stage": 2},
            "gradient_clipping": 1.0,
            "steps_per_print": 10**9,
        }
    if "train_batch_size" not in config:
        config.setdefault("train_micro_batch_size_per_gpu", args.batch_size)
        config.setdefault("gradient_accumulation_steps", args.grad_accum)
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {})
    if offload.get("device", "none") != "none" and "optimizer" not in config:
        # Our own torch AdamW instead of DeepSpeedCPUAdam, whose C++ op would be compiled
        # on first use (a minute or more); DeepSpeed refuses that unless told.
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    return config


def main() -> None:
    one_thread_per_rank()
    run = trainers.init()
    parser = common_args(__doc__.splitlines()[0], run.hints)
    parser.add_argument("--deepspeed_config", default=None, help="DeepSpeed JSON path")
    parser.add_argument("--local_rank", type=int, default=None, help="(the deepspeed launcher's)")
    args = parser.parse_args()
    config = deepspeed_config(
        os.environ.get("GPUD_DEEPSPEED_CONFIG") or args.deepspeed_config, args
    )

    import deepspeed  # after the flags: importing it probes the accelerator (slow, noisy)

    if "MASTER_ADDR" not in os.environ:
        # Plain `python`, no launcher: DeepSpeed wants a process group, so a world of one.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
        )
    # The process group is ours (gloo on CPU, GPUD_BACKEND under gpud); DeepSpeed adopts it.
    device = init_distributed(run)
    if device.type == "cpu":
        # DeepSpeed's shared-memory all-reduce serves inference only, yet its C++ op would be
        # compiled (about a minute) when the first engine starts; gloo does the training.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0

    torch.manual_seed(args.seed)
    data = synthetic_dataset(args.samples, args.seed)
    sampler = ResumableDistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    model = ToyModel(
        args.width, args.depth, gradient_checkpointing=bool(run.hints.gradient_checkpointing)
    )
    optimizer = None
    if "optimizer" not in config:  # a user's JSON that names one is the whole truth
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)

    def schedule(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / args.steps)
        )

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        model_parameters=model.parameters(),
        lr_scheduler=None if "scheduler" in config else schedule,
        config=config,
    )
    micro_batch = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    dtype = next(engine.module.parameters()).dtype  # bf16/fp16 when the JSON enables them

    batches = ResumableBatches(data, sampler, micro_batch, engine.device, dtype)
    ckpt = Checkpointer(run)
    start = 0
    if (saved := ckpt.load_deepspeed(engine)) is not None:
        start = saved["step"] + 1
        batches.load_state_dict(saved["data"])
        if rank == 0:
            print(f"resumed from {run.resume_from} at step {start}", flush=True)

    def client_state() -> dict[str, Any]:
        return {"data": batches.state_dict()}

    stream = iter(batches)
    every = run.env.checkpoint_every
    step = start
    final: float | None = None  # the last step's loss; None if none was left to train
    pace = Pace(args.step_ms)
    while step < args.steps:
        total = 0.0
        # The first step's FLOPs, counted once (gpud's MFU): the engine's forward and
        # backward are the module's, so torch's counter sees every matmul of them.
        with run.count_flops():
            for _ in range(accumulation):
                x, y = next(stream)
                loss = torch.nn.functional.mse_loss(engine(x), y)
                engine.backward(loss)  # DeepSpeed divides by the accumulation steps itself
                total += loss.item() / accumulation
                engine.step()  # an optimizer step only at the accumulation boundary
        # Here, and only here, an optimizer step has just completed: the place to stop.
        lr = float(engine.get_lr()[0])
        final = total
        run.log(step, loss=total, lr=lr)
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step} loss {total:.5f} lr {lr:.5f}", flush=True)
        if every and (step + 1) % every == 0:
            ckpt.save_deepspeed(engine, step, client_state())
        if run.should_stop():
            path = ckpt.save_deepspeed(engine, step, client_state())
            run.stopped(checkpoint=path, step=step)
            if rank == 0:
                print(f"stopped at step {step}: {run.stop_reason}; checkpoint {path}", flush=True)
            run.finish()
        pace.wait()
        step += 1

    if rank == 0:
        # ZeRO-2 keeps whole parameters on every rank (in the training dtype).
        save_final(engine.module.state_dict(), args.out, run.env.run_dir)
        print(done_line(args.steps, final, device.type), flush=True)
    run.finish()


if __name__ == "__main__":
    # Where DeepSpeed keeps the ops it compiles (only if one is ever needed): persistent, so
    # the compile happens once per machine instead of once per run.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    main()
