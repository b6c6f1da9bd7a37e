"""DDP's comm hook marks each gradient all-reduce as a collective, from launch to completion
(a real DDP model on a one-process gloo group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainers import collectives
from trainers.pulse import Pulse

pytestmark = pytest.mark.slow  # torch and a process group: seconds, not milliseconds


@pytest.fixture
def gloo(tmp_path: Path):  # type: ignore[no-untyped-def]
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("gloo")
def test_every_gradient_all_reduce_is_entered_then_left() -> None:
    calls: list[str] = []
    pulse = Pulse(0.0)

    def enter(now: float) -> None:
        calls.append("enter")
        pulse.enter_collective(now)

    def leave(now: float) -> None:
        calls.append("leave")
        pulse.leave_collective(now)

    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    )
    collectives.watch_ddp(model, enter, leave)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    assert calls == ["enter", "leave"] * 3  # a small model: one bucket per backward
    assert pulse.phase == "compute" and pulse.collective_time(1e12) > 0
