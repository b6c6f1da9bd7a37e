"""`trainers.callbacks.steps`: what a framework logs becomes gpud's metrics, and outside
gpud a callback costs nothing (the frameworks themselves: test_framework_callbacks)."""

from __future__ import annotations

import torch

from trainers.callbacks.steps import FrameworkSteps, numbers
from trainers.env import RunEnv
from trainers.run import Run


def test_numbers_keeps_plain_and_one_element_tensor_values_under_gpuds_names() -> None:
    logged = {
        "loss": torch.tensor(2.5),
        "learning_rate": 1e-3,
        "epoch": 1,
        "grad_norm": torch.tensor([0.75]),
        "per_class": torch.tensor([1.0, 2.0]),  # not one number
        "should_stop": True,  # a flag, not a metric
        "note": "eval",
    }
    assert numbers(logged) == {"loss": 2.5, "lr": 1e-3, "epoch": 1.0, "grad_norm": 0.75}


def test_outside_gpud_the_steps_do_nothing_and_never_stop() -> None:
    run = Run(RunEnv.from_environ({}))
    steps = FrameworkSteps(run)
    for step in range(3):
        steps.step_begin()
        assert steps.step_end(step, {"loss": torch.tensor(1.0)}) is False
    steps.saved("/nowhere/checkpoint-3", 2)
    steps.ended()
    assert steps.last_step == 2 and not steps.stopping and run.flops_per_step is None
