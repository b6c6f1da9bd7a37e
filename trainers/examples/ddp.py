"""DDP under torchrun, instrumented with the trainers library.

Runs on gloo (CPU) and nccl (GPU): DistributedSampler, gradient accumulation, mixed
precision on GPU, gradient checkpointing, LR scaled by world size (gpud's GPUD_LR), and
rank-0 checkpoints that carry every rank's RNG state and the data position, so a stopped
and resumed run ends with the same weights as one that never stopped.

    torchrun --nproc-per-node=2 trainers/examples/ddp.py --steps 100     # anywhere
    gpuctl launch config/examples/cpu-ddp.yaml                           # under gpud
"""

from __future__ import annotations

import contextlib
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

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


def main() -> None:
    one_thread_per_rank()
    run = trainers.init()
    args = common_args(__doc__.splitlines()[0], run.hints).parse_args()
    device = init_distributed(run)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"rank {rank} of {world} on {socket.gethostname()} ({device})", flush=True)

    torch.manual_seed(args.seed)
    data = synthetic_dataset(args.samples, args.seed)
    sampler = ResumableDistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    model = ToyModel(
        args.width, args.depth, gradient_checkpointing=bool(run.hints.gradient_checkpointing)
    ).to(device)
    ddp: DistributedDataParallel | ToyModel = (
        DistributedDataParallel(model) if dist.is_initialized() else model
    )
    run.watch(ddp)  # heartbeats say how long each step waited on the other ranks
    run.probe_collectives(every_n_steps=100)  # all-reduce bandwidth for the health panel
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / args.steps)
    )
    precision = run.hints.mixed_precision if device.type == "cuda" else None
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision or "")
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype is torch.float16)

    batches = ResumableBatches(data, sampler, args.batch_size, device)
    ckpt = Checkpointer(run)
    start = 0
    if (saved := ckpt.load()) is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        scaler.load_state_dict(saved["scaler"])
        start = saved["step"] + 1
        batches.load_state_dict(saved["data"])
        if rank == 0:
            print(f"resumed from {run.resume_from} at step {start}", flush=True)

    def state() -> dict[str, object]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(),
            "data": batches.state_dict(),
        }

    stream = iter(batches)
    every = run.env.checkpoint_every
    step = start
    final: float | None = None  # the last step's loss; None if none was left to train
    pace = Pace(args.step_ms)
    while step < args.steps:
        total = 0.0
        with run.count_flops():  # the first step's FLOPs, counted once: gpud's MFU
            for micro in range(args.grad_accum):
                x, y = next(stream)
                last = micro == args.grad_accum - 1
                # Gradients are all-reduced on the last micro-batch only.
                sync: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
                if isinstance(ddp, DistributedDataParallel) and not last:
                    sync = ddp.no_sync()
                amp = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
                with sync, amp:
                    loss = torch.nn.functional.mse_loss(ddp(x), y) / args.grad_accum
                scaler.scale(loss).backward()
                total += loss.item()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        lr = float(schedule.get_last_lr()[0])
        final = total
        run.log(step, loss=total, lr=lr)
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step} loss {total:.5f} lr {lr:.5f}", flush=True)
        if every and (step + 1) % every == 0:
            ckpt.save(step, state())
        if run.should_stop():
            path = ckpt.save(step, state())
            run.stopped(checkpoint=path, step=step)
            if rank == 0:
                print(f"stopped at step {step}: {run.stop_reason}; checkpoint {path}", flush=True)
            run.finish()
        pace.wait()
        step += 1

    if rank == 0:
        save_final(model.state_dict(), args.out, run.env.run_dir)
        print(done_line(args.steps, final), flush=True)
    run.finish()


if __name__ == "__main__":
    main()
