"""Counting one step's FLOPs: the first block is counted, later blocks cost nothing."""

from __future__ import annotations

import contextlib

import torch

from trainers.flops import FlopCount


def test_the_first_step_is_counted_once() -> None:
    model = torch.nn.Linear(64, 32)
    counted: list[float] = []
    count = FlopCount(counted.append)
    for _ in range(3):
        with count.step():
            model(torch.randn(8, 64)).sum().backward()
    # forward 2·b·in·out, backward 2·b·in·out for the weights' gradient (the input needs none)
    assert count.flops == 2 * (2 * 8 * 64 * 32)
    assert counted == [count.flops]


def test_later_steps_get_a_shared_no_op_context() -> None:
    count = FlopCount()
    with count.step():
        pass
    later = count.step()
    assert isinstance(later, contextlib.nullcontext)
    assert count.step() is later
    assert count.flops == 0.0
