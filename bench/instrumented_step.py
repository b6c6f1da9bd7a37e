"""The training loop `publisher_overhead.py` times: bare, or with full instrumentation.

The model, data and loop of `trainers/examples/ddp.py` (ToyModel, synthetic data,
DistributedSampler, gradient accumulation with `no_sync`, AdamW, LR schedule, gradient
clipping) under torchrun on gloo. Both variants compute the same five metric values every
step; they differ only in the library calls:

- `--mode bare`: none (`torch.distributed` is initialised directly);
- `--mode instrumented`: `trainers.init()`, `run.watch(ddp)`, `run.probe_collectives(100)`,
  and on every rank every step `run.log(step, **metrics)` and `run.should_stop()`;
  heartbeats come from the library's own thread;
- `--mode mixed`: as instrumented, but the per-step calls are made only in every other
  block of `--block` steps, so one process times steps with and without them side by side
  (machine noise between processes is several % here, far above what is measured).

Rank 0 times each step after `--warmup` (start-up excluded) and prints one line,
`STEP_TIME {json}`: mean and median step time (in mixed mode, of each kind of block), the
time spent inside `run.log()` and `run.should_stop()`, how much longer `should_stop()`
takes on the steps that run the collective probe, and the CPU its threads other than the
main one used per step (the link thread, zmq's and gloo's).

    torchrun --standalone --nproc-per-node=2 bench/instrumented_step.py [--mode mixed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import trainers
from trainers.distributed import init_distributed
from trainers.examples.toy import IN_FEATURES, ToyModel, synthetic_dataset

PROBE_EVERY_N_STEPS = 100  # as trainers/examples/ddp.py


class BackgroundCpu:
    """CPU time of this process's threads other than the main one (psutil, per thread)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._main = threading.main_thread().native_id
        self._start = 0.0

    def _now_s(self) -> float:
        return sum(
            t.user_time + t.system_time for t in self._process.threads() if t.id != self._main
        )

    def start(self) -> None:
        self._start = self._now_s()

    def ms_since_start(self) -> float:
        return (self._now_s() - self._start) * 1e3


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["bare", "instrumented", "mixed"], default="bare")
    p.add_argument("--block", type=int, default=25, help="steps per block in mixed mode")
    p.add_argument(
        "--without",
        default="",
        help="comma-separated parts to leave out of the instrumentation: watch, probe, stop",
    )
    p.add_argument("--steps", type=int, default=400, help="timed steps")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    run = None
    if args.mode != "bare":
        run = trainers.init()
        init_distributed(run)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    data = synthetic_dataset(args.samples, args.seed)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    model = ToyModel(args.width, args.depth)
    ddp = DistributedDataParallel(model)
    without = set(filter(None, args.without.split(",")))
    if run is not None:
        if "watch" not in without:
            run.watch(ddp)
        if "probe" not in without:
            run.probe_collectives(every_n_steps=PROBE_EVERY_N_STEPS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    total_steps = args.warmup + args.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / total_steps)
    )

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from DataLoader(data, batch_size=args.batch_size, sampler=sampler)
            epoch += 1

    stream = batches()
    samples_per_step = args.batch_size * args.grad_accum * world
    clock = time.perf_counter_ns
    step_ns: list[int] = []  # rank 0's timed steps, end to end
    called: list[bool] = []  # ... whether the step made the library calls
    probed: list[bool] = []  # ... and ran the collective probe
    log_ns: list[int] = []  # time inside run.log()
    stop_ns: list[int] = []  # ... and inside run.should_stop(), on steps without a probe
    probe_ns: list[int] = []  # ... on steps with one
    last = clock()
    previous_step_s = 1.0
    background = BackgroundCpu()
    for step in range(total_steps):
        if step == args.warmup:
            background.start()
        total = 0.0
        for micro in range(args.grad_accum):
            x, y = next(stream)
            if micro < args.grad_accum - 1:
                with ddp.no_sync():
                    loss = torch.nn.functional.mse_loss(ddp(x), y) / args.grad_accum
                    loss.backward()
            else:
                loss = torch.nn.functional.mse_loss(ddp(x), y) / args.grad_accum
                loss.backward()
            total += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        metrics = {
            "loss": total,
            "lr": float(schedule.get_last_lr()[0]),
            "grad_norm": float(grad_norm),
            "samples_per_s": samples_per_step / previous_step_s,
            "tokens_per_s": samples_per_step * IN_FEATURES / previous_step_s,
        }
        stop = False
        calls = run is not None and (args.mode == "instrumented" or (step // args.block) % 2 == 0)
        probe = calls and "probe" not in without and step % PROBE_EVERY_N_STEPS == 0
        if calls and run is not None:
            t0 = clock()
            run.log(step, **metrics)
            t1 = clock()
            stop = "stop" not in without and run.should_stop()
            t2 = clock()
            if step >= args.warmup:
                log_ns.append(t1 - t0)
                (probe_ns if probe else stop_ns).append(t2 - t1)
        now = clock()
        if step >= args.warmup:
            step_ns.append(now - last)
            called.append(calls)
            probed.append(probe)
        previous_step_s, last = (now - last) / 1e9, now
        if stop:
            break

    if rank == 0:
        result: dict[str, object] = {
            "mode": args.mode,
            "steps": len(step_ns),
            "background_cpu_ms_per_step": background.ms_since_start() / max(1, len(step_ns)),
        }
        kinds = {"with": True, "without": False} if args.mode == "mixed" else {"all": True}
        for kind, with_calls in kinds.items():
            times = [
                ns
                for ns, c, p in zip(step_ns, called, probed, strict=True)
                if (c == with_calls or args.mode != "mixed") and not p
            ]
            result[f"{kind}_mean_ms"] = statistics.mean(times) / 1e6
            result[f"{kind}_median_ms"] = statistics.median(times) / 1e6
        if log_ns:
            stop_median = statistics.median(stop_ns) if stop_ns else 0
            result.update(
                log_median_us=statistics.median(log_ns) / 1e3,
                log_mean_us=statistics.mean(log_ns) / 1e3,
                should_stop_median_us=stop_median / 1e3,
                should_stop_mean_us=statistics.mean(stop_ns) / 1e3 if stop_ns else 0.0,
                probe_step_extra_ms=(statistics.mean(probe_ns) - stop_median) / 1e6
                if probe_ns
                else None,
                dropped=run.dropped if run is not None else 0,
            )
        print(f"STEP_TIME {json.dumps(result)}", flush=True)
    if run is not None:
        run.finish()
    # As Run.finish() does: leaving through os._exit avoids gloo aborting at exit.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
