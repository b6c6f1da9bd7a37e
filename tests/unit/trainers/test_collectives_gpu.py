"""Under NCCL a gradient all-reduce is left when it has run on the GPU, not when it was
enqueued (NCCL's futures complete at enqueue). One process, one GPU, a real NCCL group."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainers import collectives
from trainers.pulse import Pulse

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture
def nccl(tmp_path: Path) -> Iterator[torch.device]:
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("no CUDA GPU or no NCCL in this torch")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield device
    dist.destroy_process_group()


def test_an_nccl_all_reduce_is_left_when_the_gpu_has_run_it(nccl: torch.device) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # slow fp32 matmuls: the GPU lags the host
    width = 8192
    model = DistributedDataParallel(
        torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(6))).to(nccl)
    )
    pulse = Pulse(time.time())
    enters: list[float] = []
    leaves: list[float] = []

    def enter(now: float) -> None:
        enters.append(now)
        pulse.enter_collective(now)

    def leave(now: float) -> None:
        leaves.append(now)
        pulse.leave_collective(now)

    collectives.watch_ddp(model, enter, leave)
    x = torch.randn(width, width, device=nccl)
    model(x).sum().backward()  # warm-up: cuBLAS, NCCL, DDP's bucket rebuild
    torch.cuda.synchronize()
    deadline = time.monotonic() + 10
    while len(leaves) < len(enters) and time.monotonic() < deadline:
        time.sleep(0.01)
    enters.clear()
    leaves.clear()

    model(x).sum().backward()
    host_done = time.time()  # the host has enqueued everything
    torch.cuda.synchronize()
    gpu_done = time.time()
    deadline = time.monotonic() + 10
    while len(leaves) < len(enters) and time.monotonic() < deadline:
        time.sleep(0.01)

    lag = gpu_done - host_done
    assert lag > 0.05, f"the GPU finished {lag:.3f}s after the host: nothing to tell apart"
    assert enters and len(leaves) == len(enters)
    assert max(enters) <= host_done
    # Left once the GPU ran it: after most of the lag, not at enqueue.
    assert max(leaves) > host_done + lag / 2, (host_done, gpu_done, leaves)
    assert pulse.phase == "compute"
