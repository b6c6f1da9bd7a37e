"""The small model and synthetic data every example trains: deterministic, quick on CPU.

A fixed random "teacher" network labels Gaussian inputs, so the loss falls visibly and
any two runs with the same seed see the very same data.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import TensorDataset

from trainers.env import Hints

IN_FEATURES = 64
OUT_FEATURES = 8


def one_thread_per_rank() -> None:
    """One intra-op thread per process on the CPU, unless OMP_NUM_THREADS says otherwise:
    the ranks of a CPU run share the host's cores, and spare threads spin between ops
    (measured: 25 ms of CPU a step against 1.5 ms). torchrun sets the variable only for
    nproc_per_node > 1, and setting it once torch is imported changes nothing."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, IN_FEATURES, generator=g)
    teacher = torch.randn(IN_FEATURES, OUT_FEATURES, generator=g) / IN_FEATURES**0.5
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(samples, OUT_FEATURES, generator=g)
    return TensorDataset(x, y)


class Block(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.net(x)
        return out


class ToyModel(nn.Module):
    """An MLP with residual blocks; knows nothing of parallelism."""

    def __init__(
        self, width: int, depth: int, dropout: float = 0.1, gradient_checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.inp = nn.Linear(IN_FEATURES, width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.out = nn.Linear(width, OUT_FEATURES)
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        out: torch.Tensor = self.out(h)
        return out


def common_args(description: str, hints: Hints) -> argparse.ArgumentParser:
    """Flags every example takes; defaults come from the run spec's training hints."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=hints.max_steps or 600)
    p.add_argument("--batch-size", type=int, default=hints.batch_size_per_gpu or 32)
    p.add_argument("--grad-accum", type=int, default=hints.gradient_accumulation or 1)
    p.add_argument("--lr", type=float, default=hints.lr or 0.002)
    p.add_argument("--seed", type=int, default=hints.seed if hints.seed is not None else 1234)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--out", default=None, help="where final.pt goes [the run dir, else .]")
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="the least time a step takes; the rest of it is slept, as a GPU's share of a "
        "real step would be waited on (the tests pace their runs so that several share a "
        "small machine) [0: as fast as the CPU goes]",
    )
    return p


class Pace:
    """`--step-ms`: each `wait()` returns no sooner than `step_ms` after the one before."""

    def __init__(self, step_ms: float) -> None:
        self.step_s = max(0.0, step_ms) / 1000
        self.last = time.monotonic()

    def wait(self) -> None:
        if self.step_s:
            time.sleep(max(0.0, self.last + self.step_s - time.monotonic()))
        self.last = time.monotonic()


def save_final(state: dict[str, torch.Tensor], out: str | None, run_dir: str | None) -> Path:
    """Rank 0's final weights, where the tests and people look: `--out`, the run dir, or `.`."""
    directory = Path(out or run_dir or ".")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "final.pt"
    torch.save(state, path)
    return path


def done_line(steps: int, loss: float | None, where: str = "") -> str:
    """`done: 40 steps on cpu, final loss 0.01234`; a run resumed from its last step's
    checkpoint (stopped just as it finished) has no step left: it says so and ends."""
    on = f" on {where}" if where else ""
    if loss is None:
        return f"done: {steps} steps{on}, none left to train after the resume"
    return f"done: {steps} steps{on}, final loss {loss:.5f}"
