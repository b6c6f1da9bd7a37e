"""HF Accelerate on the toy model, instrumented with the trainers library.

`accelerate launch` starts the ranks and chooses the device and mixed precision (gloo on
CPU with ACCELERATE_USE_CPU=1, nccl on GPUs); Accelerate wraps the model, optimizer and
schedule and does the gradient accumulation. The data is sharded by our own resumable
sampler rather than by Accelerate, so a resumed run sees exactly the batches an
uninterrupted one would; rank-0 checkpoints carry every rank's RNG state and the data
position, so a stopped and resumed run ends with the same weights as one that never
stopped.

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 \\
        trainers/examples/accelerate_train.py --steps 100                       # CPU
    accelerate launch --mixed_precision fp16 trainers/examples/accelerate_train.py  # GPUs
    gpuctl launch config/examples/cpu-accelerate.yaml                            # gpud
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

import trainers
from trainers.checkpoint import Checkpointer
from trainers.data import ResumableBatches, ResumableDistributedSampler
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
    timeout = run.env.collective_timeout_s
    accelerator = Accelerator(
        # `accelerate launch --gradient_accumulation_steps` (an env variable) wins over this.
        gradient_accumulation_steps=args.grad_accum,
        # The schedule counts optimizer steps, as in the other examples; by default
        # Accelerate would step it once per process at every optimizer step.
        step_scheduler_with_optimizer=False,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=timeout))]
        if timeout
        else None,
    )
    device = accelerator.device
    rank, world = accelerator.process_index, accelerator.num_processes
    accumulation = accelerator.gradient_accumulation_steps

    torch.manual_seed(args.seed)
    data = synthetic_dataset(args.samples, args.seed)
    sampler = ResumableDistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    model = ToyModel(
        args.width, args.depth, gradient_checkpointing=bool(run.hints.gradient_checkpointing)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / args.steps)
    )
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    scaler = accelerator.scaler  # fp16 only; its loss scale is part of the resumable state

    batches = ResumableBatches(data, sampler, args.batch_size, device)
    ckpt = Checkpointer(run)
    start = 0
    if (saved := ckpt.load()) is not None:
        accelerator.unwrap_model(model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        if scaler is not None and saved["scaler"] is not None:
            scaler.load_state_dict(saved["scaler"])
        start = saved["step"] + 1
        batches.load_state_dict(saved["data"])
        if rank == 0:
            print(f"resumed from {run.resume_from} at step {start}", flush=True)

    def state() -> dict[str, Any]:
        return {
            "model": accelerator.unwrap_model(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
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
            for _ in range(accumulation):
                x, y = next(stream)
                # No gradient sync and no optimizer step until the last micro-batch.
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    accelerator.backward(loss)  # divides by the accumulation steps itself
                    total += loss.item() / accumulation
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        # Resumes start at a step boundary, so Accelerate's micro-batch count stays aligned.
        assert accelerator.sync_gradients, "the optimizer step must end each step"
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
        save_final(accelerator.unwrap_model(model).state_dict(), args.out, run.env.run_dir)
        print(done_line(args.steps, final, device.type), flush=True)
    run.finish()


if __name__ == "__main__":
    main()
