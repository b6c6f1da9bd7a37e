"""An ended run shows how it ended, never the live health it last had: a run whose last
health said STALLED with a countdown (published while it ran) shows "ENDED: succeeded" or
"FAILED: <reason>" once it ended, and no countdown, stall or straggler."""

from __future__ import annotations

import pytest

from gpud.model.run import (
    NO_HEARTBEATS,
    CauseKind,
    FailureCause,
    HealthSummary,
    RankView,
    RunState,
    Stall,
    Straggler,
)
from tests.tui import scenes
from tests.tui.screen import screen_text
from tui.app import GpuTop
from tui.model.fleet import FleetModel
from tui.screens.run import RunScreen

RUN = "cpu-ddp-7c8d9e"
NODE = "tcp://10.0.0.1:7711"


def last_health_stalled() -> HealthSummary:
    """What the daemon published a moment before the run ended."""
    ranks = [
        RankView(rank=0, node_rank=0, local_rank=0, last_step=99, heartbeat_age_s=0.3,
                 phase="collective", phase_for_s=12.0),
        RankView(rank=1, node_rank=0, local_rank=1, last_step=99, heartbeat_age_s=0.3,
                 stalled=True, straggler=True),
    ]  # fmt: skip
    return HealthSummary(
        run_id=RUN,
        attempt=1,
        time=scenes.T0,
        verdict="stalled",
        reasons=["rank 1 has not finished step 101 for 12.0s while 1 rank(s) wait"],
        backend="gloo",
        world_size=2,
        ranks=ranks,
        straggler=Straggler(rank=1, step_time_s=0.2, median_step_time_s=0.05, ratio=4.0),
        stall=Stall(rank=1, stuck_for_s=12.0, timeout_s=1800, countdown_s=1788, why="rank 1 …"),
    )


def model(state: RunState, reason: str | None) -> FleetModel:
    fleet = FleetModel(
        [scenes.target(1, "n1")], clock=scenes.FixedClock(), wall=scenes.FixedClock(scenes.T0)
    )
    summary = scenes.summary(RUN, [NODE], state=state, attempt=1, step=99)
    summary = summary.model_copy(update={"reason": reason, "max_steps": 100})
    fleet.apply_health(last_health_stalled())
    fleet.apply_event(NODE, scenes.event(f"run.{RUN}.state", summary))
    return fleet


async def run_screen(fleet: FleetModel) -> str:
    gputop = GpuTop(fleet, refresh_s=3600, start_run=RUN)
    async with gputop.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)
        return screen_text(gputop)


async def runs_row(fleet: FleetModel) -> str:
    """The run's row in gputop's runs table."""
    gputop = GpuTop(fleet, refresh_s=3600)
    async with gputop.run_test(size=(120, 40)) as pilot:
        await pilot.press("colon", *"runs", "enter")
        await pilot.pause()
        runs = screen_text(gputop)
    return next(line for line in runs.splitlines() if line.startswith(RUN))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "reason", "shown"),
    [
        (RunState.SUCCEEDED, "exit 0", ["ENDED: succeeded"]),
        (RunState.FAILED, "rank 1 exited with code 1", ["FAILED", "rank 1 exited with code 1"]),
        (RunState.STOPPED, "by the operator", ["ENDED: stopped", "by the operator"]),
    ],
)
async def test_an_ended_run_shows_its_end_and_no_countdown(
    state: RunState, reason: str, shown: list[str]
) -> None:
    text = await run_screen(model(state, reason))
    panel = text[text.index("health · gloo") :]
    for line in shown:
        assert line in panel, text
    for live in ("STALLED", "timeout in", "stuck:", "straggler", "✗"):
        assert live not in text, (live, text)


@pytest.mark.asyncio
async def test_a_running_run_with_the_same_health_shows_the_stall_and_its_countdown() -> None:
    assert model(RunState.RUNNING, None).runs[RUN].ending() is None
    text = await run_screen(model(RunState.RUNNING, None))
    assert "STALLED" in text and "timeout in 29m" in text and "straggler: rank 1" in text
    assert "ENDED" not in text


@pytest.mark.asyncio
async def test_a_failed_run_shows_its_cause_and_the_lines_around_it() -> None:
    fleet = model(RunState.FAILED, "rank 1 on node n1: ValueError: bad shard 17 (user code, …)")
    cause = FailureCause(
        kind=CauseKind.USER,
        summary="ValueError: bad shard 17",
        rank=1,
        node_rank=0,
        node="n1",
        step=6,
        attempt=1,
        source="error file",
        lines=['  File "train.py", line 31, in main', "ValueError: bad shard 17"],
    )
    summary = fleet.runs[RUN].summary.model_copy(update={"cause": cause})
    fleet.apply_event(NODE, scenes.event(f"run.{RUN}.state", summary))
    text = await run_screen(fleet)
    panel = text[text.index("health · gloo") :]
    assert "FAILED  user code" in panel, panel
    assert "rank 1, node n1, step 7, attempt 1,\n" in panel and "from the error file" in panel
    assert '│   File "train.py", line 31, in main' in panel
    assert "│ ValueError: bad shard 17" in panel
    row = await runs_row(fleet)
    assert " user " in row, row  # the class where a live run shows its verdict


@pytest.mark.asyncio
async def test_a_failed_run_shows_the_hint_of_a_known_failure() -> None:
    fleet = model(RunState.FAILED, "rank 0 on node n1: AttributeError: … (environment, …)")
    cause = FailureCause(
        kind=CauseKind.ENVIRONMENT,
        summary="AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
        rank=0,
        node="n1",
        attempt=1,
        source="traceback",
        hint="the torch in /srv/venv/bin/python is a CPU build and the script uses CUDA",
    )
    summary = fleet.runs[RUN].summary.model_copy(update={"cause": cause})
    fleet.apply_event(NODE, scenes.event(f"run.{RUN}.state", summary))
    text = await run_screen(fleet)
    # The panel is the right-hand column; it wraps a long line where it must.
    panel = " ".join(line.split("▏", 1)[1].strip() for line in text.splitlines() if "▏" in line)
    assert "FAILED  environment" in panel, text
    hint = "hint: the torch in /srv/venv/bin/python is a CPU build and the script uses CUDA"
    assert hint in panel, text
    assert panel.index("from the traceback") < panel.index(hint), text  # below the cause


@pytest.mark.asyncio
async def test_a_run_without_heartbeats_shows_so_in_place_of_ok() -> None:
    fleet = FleetModel(
        [scenes.target(1, "n1")], clock=scenes.FixedClock(), wall=scenes.FixedClock(scenes.T0)
    )
    summary = scenes.summary(RUN, [NODE], state=RunState.RUNNING, attempt=1, step=49)
    fleet.apply_event(NODE, scenes.event(f"run.{RUN}.state", summary))
    fleet.apply_health(
        HealthSummary(
            run_id=RUN, attempt=1, time=scenes.T0, verdict="ok", backend="gloo", world_size=2,
            reasons=[f"{NO_HEARTBEATS}; last output 0.4s ago, step 50 0.4s ago"],
            judged_from_output=True,
        )
    )  # fmt: skip
    text = await run_screen(fleet)
    panel = " ".join(line.split("▏", 1)[1].strip() for line in text.splitlines() if "▏" in line)
    assert "NO HEARTBEATS" in panel and " OK " not in panel, text
    assert "judged from its output; last output 0.4s ago" in panel, text
    row = await runs_row(fleet)
    assert " no beats " in row and " ok " not in row, row
