"""One step number everywhere (issue 8): gputop shows steps done (the last completed step's
0-based index + 1) as done/total, the same number as `gpuctl ps`, `status` and `health`."""

from __future__ import annotations

import pytest

from gpud.model.run import HealthSummary, RankView, RunState
from gpud.wire.protocol import RunMetricsEvent
from gpud.wire.run_messages import MetricRow, MetricsReply
from tests.tui import scenes
from tests.tui.screen import screen_text
from tui.app import GpuTop
from tui.model.fleet import FleetModel
from tui.screens.run import RunScreen
from tui.screens.runs import RunsScreen
from tui.widgets.health_panel import rank_grid
from tui.widgets.run_header import header_text
from tui.widgets.runs_table import COLUMNS, run_row

RUN = "cpu-ddp-5e6f7a"
NODE = "tcp://10.0.0.1:7711"
STEPS = 20
STEP_COLUMN = next(i for i, (label, _, _) in enumerate(COLUMNS) if label == "STEP")


def finished_run() -> FleetModel:
    """A run of max_steps 20 that ran to its end: its trainer logged indexes 0..19."""
    model = FleetModel(
        [scenes.target(1, "n1")], clock=scenes.FixedClock(), wall=scenes.FixedClock(scenes.T0)
    )
    summary = scenes.summary(RUN, [NODE], state=RunState.SUCCEEDED, attempt=1, step=STEPS - 1)
    summary = summary.model_copy(update={"max_steps": STEPS, "last_checkpoint": None})
    model.apply_event(NODE, scenes.event(f"run.{RUN}.state", summary))
    rows = [
        MetricRow(attempt=1, step=s, time=scenes.T0 - 60 + s, values={"loss": 1.0 / (s + 1)})
        for s in range(STEPS)
    ]
    model.apply_metrics_history(RUN, MetricsReply(run_id=RUN, rows=rows))
    ranks = [
        RankView(rank=r, node_rank=0, local_rank=r, last_step=STEPS - 1, heartbeat_age_s=0.4)
        for r in range(2)
    ]
    model.apply_health(
        HealthSummary(
            run_id=RUN,
            attempt=1,
            time=scenes.T0,
            verdict="ok",
            backend="gloo",
            world_size=2,
            ranks=ranks,
        )
    )
    return model


def test_a_finished_run_of_20_steps_shows_20_of_20_in_the_table_header_and_ranks() -> None:
    model = finished_run()
    run = model.runs[RUN]
    assert run.summary.steps_done == STEPS
    assert run.steps_done() == STEPS
    cells = run_row(run, scenes.T0)[1]
    assert cells[STEP_COLUMN] == f"{STEPS}/{STEPS}"
    assert f"step {STEPS}/{STEPS}" in header_text(run, "loss").plain
    assert run.health is not None
    grid = rank_grid(run.health).plain.splitlines()
    assert [line.split()[:2] for line in grid[1:]] == [["0", str(STEPS)], ["1", str(STEPS)]]


def test_a_live_point_moves_table_and_header_together() -> None:
    model = finished_run()
    running = model.runs[RUN].summary.model_copy(
        update={"state": RunState.RUNNING, "last_step": 9, "max_steps": 40}
    )
    model.apply_event(NODE, scenes.event(f"run.{RUN}.state", running, seq=2))
    live = RunMetricsEvent(
        run_id=RUN, attempt=1, points=[{"step": 24, "time": scenes.T0, "values": {"loss": 0.1}}]
    )
    model.apply_event(NODE, scenes.event(f"run.{RUN}.metrics", live, seq=3))
    run = model.runs[RUN]
    # The newest index seen anywhere is 24: 25 steps done, in both views.
    assert run_row(run, scenes.T0)[1][STEP_COLUMN] == "25/40"
    assert "step 25/40" in header_text(run, "loss").plain


@pytest.mark.asyncio
async def test_the_runs_screen_and_the_run_screen_show_20_of_20() -> None:
    gputop = GpuTop(finished_run(), refresh_s=3600)
    async with gputop.run_test(size=(120, 40)) as pilot:
        await pilot.press("colon", *"runs", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, RunsScreen)
        row = next(line for line in screen_text(gputop).splitlines() if line.startswith(RUN))
        assert f" {STEPS}/{STEPS} " in row, row
        assert f"{STEPS - 1}/{STEPS}" not in row
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)
        assert f"step {STEPS}/{STEPS}" in screen_text(gputop)
