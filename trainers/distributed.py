"""Distributed set-up in one function (imports torch)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from trainers.run import Run


def init_distributed(run: Run) -> torch.device:
    """Join the process group the launcher prepared and pick this rank's device.

    The backend is the run's (`GPUD_BACKEND`), else nccl with CUDA and gloo without; the
    collective timeout comes from `nccl.timeout_s` in the spec when set.
    """
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(run.local_rank)
    device = torch.device("cuda", run.local_rank) if cuda else torch.device("cpu")
    if "MASTER_ADDR" in os.environ and not dist.is_initialized():
        backend = run.env.backend or ("nccl" if cuda else "gloo")
        timeout = run.env.collective_timeout_s
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout) if timeout else None,
            device_id=device if backend == "nccl" else None,
        )
    return device
