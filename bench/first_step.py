"""The script both launch paths start: join the gloo group, take one training step, say when.

Prints `FIRST_STEP <unix time>` from rank 0 right after its first optimizer step.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(16, 64)).square().mean()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"FIRST_STEP {time.time():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
