"""Every screen and every key, driven with Pilot over a hand-made model (fixed clock)."""

from __future__ import annotations

import pytest

from tests.tui import scenes
from tests.tui.screen import screen_text
from tui.app import GpuTop
from tui.screens.confirm import ConfirmScreen
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.logs import LogsScreen
from tui.screens.node import NodeScreen
from tui.screens.run import RunScreen
from tui.screens.runs import RunsScreen
from tui.widgets.loss_chart import LossChart

pytestmark = pytest.mark.asyncio
RUN = "pretrain-7b-3f9a2c"


def app(readonly: bool = False, start_run: str | None = None) -> GpuTop:
    return GpuTop(scenes.fleet(), refresh_s=0.2, readonly=readonly, start_run=start_run)


async def test_fleet_shows_every_node_with_badges_bars_health_and_runs() -> None:
    gputop = app()
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(gputop)
        assert isinstance(gputop.screen, FleetScreen)
        assert "2/3 nodes up 1 down" in text
        assert "XID 1" in text and "THR 1" in text
        rows = {ln.split()[1]: ln for ln in text.splitlines() if ln[:1] and ln[0] in "●○"}
        assert set(rows) == {"gpu-a01", "gpu-a02", "gpu-b01"}
        assert "online" in rows["gpu-a01"] and "pretrain-7b-3f9a2c" in rows["gpu-a01"]
        assert "offline" in rows["gpu-b01"]
        assert "LOST 1 XID 1" in rows["gpu-a02"] and "✗" in rows["gpu-a02"]
        assert "▾ gpu-a" in text and "▾ gpu-b" in text  # grouped by name series


async def test_fleet_groups_fold_and_filter_narrows() -> None:
    gputop = app()
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.press("enter")  # on the first group row: fold it
        await pilot.pause()
        text = screen_text(gputop)
        assert "▸ gpu-a" in text and "gpu-a01" not in text
        await pilot.press("enter")
        await pilot.press("slash", *"b01")
        await pilot.pause()
        text = screen_text(gputop)
        assert "gpu-b01" in text and "gpu-a01" not in text
        await pilot.press("escape")  # clears the filter
        await pilot.pause()
        assert "gpu-a01" in screen_text(gputop)


async def test_enter_opens_a_node_with_every_field_and_processes_by_run_and_rank() -> None:
    gputop = app()
    async with gputop.run_test(size=(120, 40)) as pilot:
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, NodeScreen)
        text = screen_text(gputop)
        assert "gpu-a01" in text and "CUDA 12.4" in text
        assert "UTIL HISTORY" in text
        assert "pid 4100 python 60.0 GiB → pretrain-7b-3f9a2c rank 0 (local 0)" in text
        for label in ("util", "memory", "power", "temp"):
            assert any(line.lstrip().startswith(label) for line in text.splitlines())
        await pilot.press("down")  # GPU 1: its process is rank 1
        await pilot.pause()
        assert "rank 1 (local 1)" in screen_text(gputop)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(gputop.screen, FleetScreen)


async def test_runs_table_and_run_screen_with_loss_health_and_logs() -> None:
    gputop = app()
    async with gputop.run_test(size=(120, 40)) as pilot:
        await pilot.press("colon", *"runs", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, RunsScreen)
        text = screen_text(gputop)
        row = next(line for line in text.splitlines() if line.startswith(RUN))
        for expected in ("running", "2×2", "1182/1800", "0.0426", "st/s", "degraded"):
            assert expected in row, row
        assert "cpu-ddp-0a1b2c" in text and "stopped" in text
        await pilot.press("enter")
        await pilot.pause()
        screen = gputop.screen
        assert isinstance(screen, RunScreen) and screen.run_id == RUN
        text = screen_text(gputop)
        assert "torchrun/nccl" in text and "2×2 procs" in text
        assert "resumed @700" in text
        assert "DEGRADED" in text and "straggler" in text
        assert "busbw 142.50 GB/s" in text and "NCCL warnings 1" in text
        assert "gpu-a02 GPU 1: XID 1" in text
        assert "step 1180 loss 0.04431" in text  # the log tail
        chart = screen.query_one(LossChart)
        assert chart.points == len(gputop.model.runs[RUN].metrics["loss"])
        await pilot.press("m")
        await pilot.pause()
        assert screen.metric == "grad_norm"
        await pilot.press("m", "m")
        assert screen.metric == "loss"


async def test_logs_follow_filter_by_node_and_rank_and_search() -> None:
    gputop = app(start_run=RUN)
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        screen = gputop.screen
        assert isinstance(screen, LogsScreen)
        text = screen_text(gputop)
        assert "resumed from /ckpt/step-699" in text and "slow data loader" in text
        await pilot.press("n", "n")  # all → gpu-a01 → gpu-a02
        await pilot.pause()
        text = screen_text(gputop)
        assert "node gpu-a02" in text
        assert "slow data loader" in text and "resumed from" not in text
        await pilot.press("n", "k", "k")  # all nodes; rank 0 → rank 1
        await pilot.pause()
        text = screen_text(gputop)
        assert "rank 1" in text and "NCCL WARN" in text and "slow data loader" not in text
        await pilot.press("k", "k", "k")  # rank 2, rank 3, all
        await pilot.press("slash", *"loss")
        await pilot.pause()
        text = screen_text(gputop)
        assert "step 1170 loss" in text and "NCCL WARN" not in text
        await pilot.press("enter", "f")
        await pilot.pause()
        assert "follow off" in screen_text(gputop)


async def test_help_lists_the_keys_of_every_screen_and_of_this_one() -> None:
    gputop = app(start_run=RUN)
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(gputop.screen, HelpScreen)
        text = screen_text(gputop)
        for expected in ("this help", "jump to a screen", "stop the selected run", "Next metric"):
            assert expected in text
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)


async def test_jump_goes_to_nodes_runs_and_back_to_the_fleet() -> None:
    gputop = app()
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.press("colon", *"node gpu-a02", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, NodeScreen) and gputop.screen.key.endswith(".2:7711")
        await pilot.press("colon", *"run pretrain", "enter")  # a unique id prefix
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)
        await pilot.press("colon", *"logs", "enter")  # the run on screen
        await pilot.pause()
        assert isinstance(gputop.screen, LogsScreen)
        await pilot.press("colon", *"fleet", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, FleetScreen)
        await pilot.press("colon", *"run nope", "enter")
        await pilot.pause()
        assert isinstance(gputop.screen, FleetScreen)


async def test_stop_asks_first_naming_run_nodes_and_processes_and_no_cancels() -> None:
    gputop = app(start_run=RUN)
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(gputop.screen, ConfirmScreen)
        text = screen_text(gputop)
        assert "Stop run pretrain-7b-3f9a2c" in text
        assert "gpu-a01 (10.0.0.1:7711) × 2" in text and "4 ranks in all" in text
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)
        await pilot.press("r")  # a running run: nothing to resume, no question
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)


async def test_readonly_removes_stop_and_resume() -> None:
    gputop = app(readonly=True, start_run=RUN)
    async with gputop.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(gputop)
        assert "read-only" in text
        assert "Stop" not in text.splitlines()[-1] and "Resume" not in text.splitlines()[-1]
        await pilot.press("s", "r")
        await pilot.pause()
        assert isinstance(gputop.screen, RunScreen)
        assert not gputop.check_action("stop", ())
