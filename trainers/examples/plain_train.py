"""A training script that knows nothing of gpud, in the style of nanoGPT's train.py.

gpud runs it unchanged: metrics come from its `iter N: loss L, time Tms` lines, a stop is a
plain SIGTERM (the ranks agree on the iter, rank 0 writes `ckpt.pt`, all exit 0), and a
resume passes `--init_from=resume`, which continues after the saved iter with the same
weights, optimizer and RNG states, so the result matches a run that never stopped. Only
the toy model and data come from `trainers.examples.toy`; nothing else of the library.

    torchrun --nproc-per-node=2 trainers/examples/plain_train.py --max_iters=400
    torchrun --nproc-per-node=2 trainers/examples/plain_train.py --init_from=resume
"""

from __future__ import annotations

import ast
import math
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainers.examples.toy import ToyModel, synthetic_dataset

# ----------------------------------------------------------------------------- config
# Defaults; each can be overridden with --key=value (nanoGPT's configurator, minus files).
CONFIG: dict[str, Any] = {
    "out_dir": "out",
    "init_from": "scratch",  # or "resume": continue from out_dir/ckpt.pt
    "max_iters": 600,
    "eval_interval": 100,  # evaluate and write ckpt.pt every this many iters
    "log_interval": 10,
    "batch_size": 32,  # per process and micro-step
    "gradient_accumulation_steps": 1,
    "learning_rate": 2e-3,
    "min_lr": 2e-4,
    "warmup_iters": 20,
    "decay_lr": True,  # cosine from learning_rate to min_lr over max_iters
    "weight_decay": 0.1,
    "grad_clip": 1.0,  # 0 disables
    "n_layer": 4,
    "n_embd": 512,
    "dropout": 0.0,
    "samples": 16384,
    "seed": 1337,
    "min_iter_ms": 0.0,  # the least time an iter takes; the rest is slept (the tests pace)
    "device": "cuda" if torch.cuda.is_available() else "cpu",
    "backend": "nccl" if torch.cuda.is_available() else "gloo",
}


def parse_overrides(argv: list[str], config: dict[str, Any]) -> dict[str, Any]:
    """`--key=value` pairs over the defaults; values are Python literals or bare strings."""
    config = dict(config)
    for arg in argv:
        key, sep, raw = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not sep:
            sys.exit(f"expected --key=value, got {arg!r}")
        if key not in config:
            sys.exit(f"unknown config key {key!r}; known: {', '.join(sorted(config))}")
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw  # a bare string such as --init_from=resume
        default = config[key]
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(default):
            sys.exit(f"--{key} wants a {type(default).__name__}, got {raw!r}")
        config[key] = value
    return config


cfg = parse_overrides(sys.argv[1:], CONFIG)

# ----------------------------------------------------------------------------- stop on SIGTERM
stop_requested = False


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the loop notices it at the end of an iter, where all ranks agree.
    global stop_requested  # noqa: PLW0603
    stop_requested = True


signal.signal(signal.SIGTERM, on_sigterm)

# ----------------------------------------------------------------------------- set-up
ddp = int(os.environ.get("RANK", "-1")) != -1
if ddp:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{local_rank}" if cfg["device"] == "cuda" else cfg["device"]
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group(backend=cfg["backend"])
else:
    rank, local_rank, world, device = 0, 0, 1, cfg["device"]
master = rank == 0
out_dir = Path(cfg["out_dir"])
ckpt_path = out_dir / "ckpt.pt"
if master:
    out_dir.mkdir(parents=True, exist_ok=True)

torch.manual_seed(cfg["seed"] + rank)
data = synthetic_dataset(cfg["samples"], cfg["seed"])
split = int(0.9 * len(data))
train_x, train_y = data.tensors[0][:split], data.tensors[1][:split]
val_x, val_y = data.tensors[0][split:].to(device), data.tensors[1][split:].to(device)


def get_batch(it: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random training samples, a pure function of (seed, rank, iter, micro-step).

    So a resumed run draws the very batches the uninterrupted run would, with no data
    position to save.
    """
    key = ((cfg["seed"] * 1_000_003 + it) * world + rank) * 64 + micro
    g = torch.Generator().manual_seed(key)
    ix = torch.randint(split, (cfg["batch_size"],), generator=g)
    return train_x[ix].to(device), train_y[ix].to(device)


def get_lr(it: int) -> float:
    """Linear warmup, then cosine decay to min_lr at max_iters (a function of the iter)."""
    lr: float = cfg["learning_rate"]
    min_lr: float = cfg["min_lr"]
    warmup: int = cfg["warmup_iters"]
    if not cfg["decay_lr"]:
        return lr
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, cfg["max_iters"] - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
    return min_lr + coeff * (lr - min_lr)


model = ToyModel(cfg["n_embd"], cfg["n_layer"], dropout=cfg["dropout"]).to(device)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=cfg["learning_rate"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"]
)
iter_num = 0
if cfg["init_from"] == "resume":
    # On the CPU: RNG states must stay CPU tensors; load_state_dict moves the rest.
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"] + 1
    if checkpoint["world_size"] == world:
        torch.set_rng_state(checkpoint["rng"][rank]["torch"])
        if "cuda" in checkpoint["rng"][rank]:
            torch.cuda.set_rng_state(checkpoint["rng"][rank]["cuda"])
    elif master:
        print(f"world size changed ({checkpoint['world_size']} -> {world}): fresh dropout RNG")
    if master:
        print(f"resuming from {ckpt_path} at iter {iter_num}", flush=True)
    del checkpoint
elif cfg["init_from"] != "scratch":
    sys.exit(f"--init_from must be scratch or resume, not {cfg['init_from']!r}")
net: torch.nn.Module = DistributedDataParallel(model) if ddp else model


def save_checkpoint(it: int) -> None:
    """Collective (every rank's RNG state); rank 0 replaces ckpt.pt atomically."""
    mine = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and device.startswith("cuda"):
        mine["cuda"] = torch.cuda.get_rng_state()
    rngs: list[Any] = [mine]
    if ddp:
        rngs = [None] * world
        dist.all_gather_object(rngs, mine)
    if master:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iter_num": it,
            "world_size": world,
            "rng": rngs,
            "config": cfg,
        }
        tmp = ckpt_path.with_name(f".{ckpt_path.name}.tmp")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_path)
        print(f"saving checkpoint to {ckpt_path} (iter {it})", flush=True)


@torch.no_grad()
def estimate_val_loss() -> float:
    model.eval()  # no dropout, so no RNG is drawn: evaluating changes nothing
    loss = torch.nn.functional.mse_loss(model(val_x), val_y).item()
    model.train()
    return loss


def stop_agreed() -> bool:
    """True on every rank as soon as any rank got SIGTERM (a one-integer all-reduce)."""
    if not ddp:
        return stop_requested
    flag = torch.tensor([int(stop_requested)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def shutdown() -> None:
    # gloo can abort a rank at interpreter exit after training finished (SIGABRT).
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- training
accum = cfg["gradient_accumulation_steps"]
t0 = time.time()
while iter_num < cfg["max_iters"]:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = 0.0
    for micro in range(accum):
        if isinstance(net, DistributedDataParallel):
            # All-reduce gradients on the last micro-step only (nanoGPT's shortcut).
            net.require_backward_grad_sync = micro == accum - 1
        x, y = get_batch(iter_num, micro)
        loss = torch.nn.functional.mse_loss(net(x), y) / accum
        loss.backward()
        loss_sum += loss.item()
    if cfg["grad_clip"]:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if master and iter_num % cfg["log_interval"] == 0:
        print(f"iter {iter_num}: loss {loss_sum:.4f}, time {dt * 1000:.2f}ms", flush=True)
    if iter_num > 0 and iter_num % cfg["eval_interval"] == 0:
        if master:
            print(f"step {iter_num}: train loss {loss_sum:.4f}, val loss {estimate_val_loss():.4f}")
        save_checkpoint(iter_num)
    if stop_agreed():
        save_checkpoint(iter_num)
        if master:
            print(f"stopping after iter {iter_num} (SIGTERM)", flush=True)
        shutdown()
    if (rest := cfg["min_iter_ms"] / 1000 - (time.time() - t0)) > 0:
        time.sleep(rest)
    iter_num += 1

save_checkpoint(cfg["max_iters"] - 1)
if master:
    print(f"done: {cfg['max_iters']} iters, val loss {estimate_val_loss():.4f}", flush=True)
shutdown()
