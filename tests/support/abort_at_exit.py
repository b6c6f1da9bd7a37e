"""A run that trains to its end and then has rank 1 abort at exit (SIGABRT).

That is what gloo sometimes does to a rank at interpreter exit after training finished;
here rank 1 is made to do it every time, after telling gpud training finished.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import trainers


def main() -> None:
    run = trainers.init()
    dist.init_process_group("gloo")
    tensor = torch.ones(4)
    for step in range(5):
        dist.all_reduce(tensor)
        run.log(step, loss=1.0 / (step + 1))
        run.should_stop()
    if dist.get_rank() == 1:
        os._exit = lambda code: os.abort()  # type: ignore[assignment]
    run.finish()


if __name__ == "__main__":
    main()
