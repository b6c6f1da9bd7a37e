"""A run's line in a node's brief carries node 0's FLOP rate and MFU while it trains."""

from __future__ import annotations

from gpud.efficiency.model import RunFlops
from gpud.model.run import HealthSummary, RunState
from gpud.wire.briefing import run_brief
from gpud.wire.run_messages import RunSummary


def summary(state: RunState) -> RunSummary:
    return RunSummary(
        id="r-1", name="r", state=state, state_since=0.0, attempt=1, created_at=0.0,
        node_rank=0, nodes=[], launcher="torchrun",
    )  # fmt: skip


HEALTH = HealthSummary(
    run_id="r-1", attempt=1, time=0.0, verdict="ok",
    flops=RunFlops(flops_per_second=3.2e15, mfu=0.404, gpus=8),
)  # fmt: skip


def test_a_training_runs_brief_has_its_flops_and_mfu() -> None:
    line = run_brief(summary(RunState.RUNNING), HEALTH)
    assert (line.flops_per_second, line.mfu) == (3.2e15, 0.404)


def test_a_run_that_does_not_train_has_none() -> None:
    for state in (RunState.STOPPED, RunState.QUEUED, RunState.FAILED):
        line = run_brief(summary(state), HEALTH)
        assert (line.flops_per_second, line.mfu) == (None, None), state
    assert run_brief(summary(RunState.RUNNING), None).mfu is None  # not node 0
