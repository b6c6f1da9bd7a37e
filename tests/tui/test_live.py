"""gputop against real daemons: real zmq events, a real CPU DDP run, real stop and resume."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets._toast import Toast

from gpud.model.run import RunState
from gpud.runs.diagnosis.logparse import split_rank
from gpud.wire.brief import NodeBrief
from gpud.wire.client import Client
from gpud.wire.run_messages import RunList
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import FAST, launch, script_spec, wait_for
from tests.tui import scenes
from tests.tui.screen import region_text, screen_text
from tui.app import GpuTop
from tui.model import units
from tui.model.feed import Feed
from tui.model.fleet import FleetModel
from tui.model.runs import RunView
from tui.model.targets import Target
from tui.screens.confirm import ConfirmScreen
from tui.screens.run import RunScreen
from tui.screens.runs import RunsScreen

SHORT = ("training.max_steps=100000", FAST)
#: The Run screen's goodput line: `goodput 72% [███░] training 7.2s · starting 4.1s (wall 11.3s)`
GOODPUT = re.compile(r"goodput (\d+)% \[[^\]]*\] ([^(]*)\(wall ([^)]+)\)")


def flat(text: str) -> str:
    """Screen text with box drawing and line wrapping taken out."""
    return " ".join(text.replace("█", " ").replace("▀", " ").replace("▄", " ").split())


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def settle(pilot: object, condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def watch(daemon: RunningDaemon) -> tuple[FleetModel, Feed, str]:
    targets = [Target(daemon.target())]
    model = FleetModel(targets)
    return model, Feed(model, targets, refresh_s=0.5), targets[0].node.control


def stop_quietly(daemon: RunningDaemon, run_id: str) -> None:
    with Client(daemon.target()) as client:
        client.stop_run(run_id, force=True)
    wait_for(daemon, run_id, {"stopped", "failed", "succeeded"}, timeout=60)


@pytest.mark.slow
def test_a_silent_node_is_offline_within_3_s_and_comes_back(daemon: RunningDaemon) -> None:
    model, feed, key = watch(daemon)
    feed.start()
    try:
        wait_until(lambda: model.online(key), 15, "the node online")
        node = model.nodes[key]
        # `node.briefs`, not `node.brief`: until the daemon's first brief, the view derives
        # one from each full snapshot (which is what it subscribes to until then).
        wait_until(lambda: node.info is not None and node.briefs, 10, "node info and a brief")
        assert node.simulated and node.brief is not None and len(node.brief.gpus) == 8
        assert node.snapshot is None  # full snapshots only for a node on screen
        daemon.proc.send_signal(signal.SIGSTOP)  # the daemon goes silent, sockets stay open
        silent_since = time.monotonic()
        wait_until(lambda: not model.online(key), 5, "the node offline")
        assert time.monotonic() - silent_since < 3.0
        daemon.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: model.online(key), 5, "the node back online")
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
        feed.stop()


@pytest.mark.slow
def test_the_fleet_takes_briefs_and_a_node_on_screen_its_full_snapshots(
    daemon: RunningDaemon,
) -> None:
    run_id = launch(daemon, *SHORT)
    try:
        # What the daemon publishes: the node in brief, naming its run and how far it is.
        with Client(daemon.target()) as client, client.subscribe("sum.") as sub:

            def brief() -> NodeBrief:
                event = sub.recv(timeout_s=5)
                assert event is not None and isinstance(event.body, NodeBrief), event
                return event.body

            found = brief()
            deadline = time.monotonic() + 60
            while not any(r.id == run_id and (r.last_step or 0) > 0 for r in found.runs):
                assert time.monotonic() < deadline, found.runs
                found = brief()
        assert found.simulated and len(found.gpus) == 8 and found.health.ok
        line = next(r for r in found.runs if r.id == run_id)
        assert line.state is RunState.RUNNING and line.node_rank == 0 and "loss" in line.values
        # gputop's fleet: briefs only; a node on screen gets its full snapshots while it is.
        model, feed, key = watch(daemon)
        feed.start()
        try:
            node = model.nodes[key]
            wait_until(lambda: node.brief is not None and node.briefs, 15, "a brief")
            time.sleep(2.5)  # two more intervals: any snapshot would be here by now
            assert node.snapshot is None
            model.focus_node(key)
            wait_until(lambda: node.snapshot is not None, 5, "the full snapshot")
            snap = node.snapshot
            assert snap is not None and len(snap.gpus) == 8 and snap.host.hostname
            first = snap.seq
            wait_until(lambda: node.snapshot is not None and node.snapshot.seq > first, 5, "more")
            model.unfocus_node(key)
            assert node.snapshot is None
            time.sleep(2.5)
            assert node.snapshot is None, "a snapshot came after the node's screen closed"
            assert node.brief is not None and any(r.id == run_id for r in node.brief.runs)
        finally:
            feed.stop()
    finally:
        stop_quietly(daemon, run_id)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_real_run_end_to_end_then_stop_and_resume_it_from_the_ui(
    daemon: RunningDaemon,
) -> None:
    run_id = launch(daemon, *SHORT)
    model, feed, key = watch(daemon)
    app = GpuTop(model, feed, start_run=run_id, refresh_s=0.3)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:

            def run() -> RunView | None:
                found = model.runs.get(run_id)
                return found if found is not None and found.known else None

            def state() -> RunState | None:
                with model.lock:
                    found = run()
                    return found.summary.state if found is not None else None

            def step() -> int:
                with model.lock:
                    found = run()
                    return (found.steps_done() or 0) if found is not None else 0

            def ready() -> bool:
                with model.lock:
                    found = run()
                    return (
                        found is not None
                        and found.history in ("loaded", "unavailable")
                        and found.health is not None
                        and any(ln.rank == 1 for ln in found.logs.lines())
                        and len(found.metrics.get("loss", ())) > 10
                    )

            await settle(pilot, ready, 90, "the run's history, health and logs")
            with model.lock:
                found = run()
                assert found is not None
                assert found.history == "loaded", found.history_error
                assert found.summary.state is RunState.RUNNING
                assert found.nproc_by_node() == [2]
                assert found.metrics["loss"].segments[0].steps[0] == 0.0  # from the start
                assert "lr" in found.metrics and found.rate() is not None
                assert run_id in model.nodes[key].run_ids
            text = screen_text(app)
            assert "cpu-ddp · running" in text and "torchrun/gloo" in text and "1×2 procs" in text

            # Goodput on the Run screen moves with the training, not only when node 0
            # stores it (when the run moves): training time grows second by second.
            def goodput() -> tuple[int, str, str] | None:
                found = GOODPUT.search(screen_text(app))
                return None if found is None else (int(found[1]), found[2], found[3])

            await settle(pilot, lambda: (goodput() or (0, "", ""))[0] > 0, 30, "goodput > 0")
            first = goodput()
            await pilot.pause(2.5)
            later = goodput()
            assert first is not None and later is not None, screen_text(app)
            assert "training" in later[1] and later[2] != first[2], (first, later)

            def owned() -> bool:  # ranks show as load on simulated GPUs, mapped back
                with model.lock:
                    snap = model.nodes[key].snapshot
                    gpus = snap.gpus if snap is not None else []
                    procs = [(g.index, p.pid) for g in gpus for p in g.processes or []]
                    owners = [model.process_owner(key, i, pid) for i, pid in procs]
                return any(o is not None and o.run_id == run_id for o in owners)

            model.focus_node(key)  # as the node screen does: its full snapshots
            await settle(pilot, owned, 20, "a GPU process mapped to the run")
            model.unfocus_node(key)

            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            text = flat(region_text(app, "#confirm-box"))
            assert f"Stop run {run_id} (cpu-ddp), attempt 1" in text
            assert f"on 1 node: node0 ({daemon.address}) × 2 processes — 2 ranks in all" in text
            await pilot.press("y")
            await settle(pilot, lambda: state() is RunState.STOPPED, 60, "stopped")
            stopped_at = step()
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            text = flat(region_text(app, "#confirm-box"))
            assert f"Resume run {run_id} (cpu-ddp) as attempt 2" in text
            await pilot.press("y")
            await settle(pilot, lambda: state() is RunState.RUNNING, 60, "running again")

            def resumed() -> bool:
                with model.lock:
                    loss = model.runs[run_id].metrics.get("loss")
                    return loss is not None and bool(loss.resumed_at())

            await settle(pilot, resumed, 60, "a resume mark on the loss curve")
            with model.lock:
                marks = model.runs[run_id].metrics["loss"].resumed_at()
            assert abs(marks[0] - stopped_at) <= 10
            await pilot.pause(0.5)
            assert "resumed @" in screen_text(app)
    finally:
        stop_quietly(daemon, run_id)


@pytest.mark.asyncio
async def test_run_by_name_opens_the_newest_run_of_that_name(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """`gputop --run NAME`: the app starts before any run is known, then finds it."""
    spec = script_spec(tmp_path, "print('hello')", name="hello")
    older = launch(daemon, config=spec)
    wait_for(daemon, older, {"succeeded"})
    newer = launch(daemon, config=spec)
    wait_for(daemon, newer, {"succeeded"})
    model, feed, _ = watch(daemon)
    app = GpuTop(model, feed, start_run="hello", refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:

        def shown() -> bool:
            screen = app.screen
            return isinstance(screen, RunScreen) and screen.run_id == newer

        await settle(pilot, shown, 20, f"the screen of {newer}")
        await pilot.pause(0.5)
        text = screen_text(app)
        assert newer in text and "hello · succeeded" in text and "not known" not in text
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.selected_run() == newer  # `s`, `r`, `l`


@pytest.mark.asyncio
async def test_a_failed_action_is_a_notification_not_a_crash(daemon: RunningDaemon) -> None:
    model, feed, key = watch(daemon)
    # A run the daemon does not have (it ended and was forgotten, say): the UI still
    # offers to stop it, and the daemon's refusal must come back as a notification.
    ghost = scenes.summary("ghost-000000", [key], 0)
    model.apply_runs(key, RunList(runs=[ghost]))
    app = GpuTop(model, feed, start_run="ghost-000000", refresh_s=0.3)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await settle(
            pilot,
            lambda: bool(app.screen.query(Toast)) and "failed" in screen_text(app),
            20,
            "a notification",
        )
        text = screen_text(app)
        assert "stop ghost-000000 failed" in text and "no run" in text
        assert app.is_running


@pytest.mark.slow
@pytest.mark.asyncio
async def test_leaving_a_run_screen_keeps_the_runs_table_true_and_reopening_shows_the_end(
    daemon: RunningDaemon,
) -> None:
    """Issue 33 §3: after the Run screen was left, the Runs table's LOSS stayed at the
    screen's last point while STEP went on; reopened after the run ended, the screen
    showed a loss, lr and log tail from 700 steps before its end; Esc from a screen opened
    with --run went to Fleet, though the breadcrumb read Runs › run."""
    run_id = launch(daemon, "training.max_steps=250", FAST)
    model, feed, _ = watch(daemon)
    app = GpuTop(model, feed, start_run=run_id, refresh_s=0.3)

    def run() -> RunView:
        found = model.runs.get(run_id)
        assert found is not None and found.known
        return found

    def known() -> bool:
        with model.lock:
            found = model.runs.get(run_id)
            return found is not None and found.known and len(found.metrics.get("loss", ())) > 3

    def table_loss() -> str | None:
        row = next((ln for ln in screen_text(app).splitlines() if run_id[:15] in ln), None)
        found = re.search(r" (\d+)/250 +(\S+) ", row or "")
        return found[2] if found else None

    try:
        async with app.run_test(size=(130, 40)) as pilot:
            await settle(pilot, known, 90, "the run's live loss on its screen")
            assert isinstance(app.screen, RunScreen) and "Runs › " in screen_text(app)
            await pilot.press("escape")
            await pilot.pause(0.3)
            assert isinstance(app.screen, RunsScreen)  # as the breadcrumb said
            with model.lock:
                left = run().metrics["loss"].last()
            assert left is not None

            def moved_on() -> bool:
                with model.lock:
                    summary = run().summary
                return (summary.last_step or 0) > left[1] + 30

            await settle(pilot, moved_on, 60, "30 steps past the screen's last point")

            # The table shows the daemon's loss, not the screen's last one
            def follows() -> bool:
                with model.lock:
                    loss = run().summary.last_values.get("loss")
                return loss is not None and table_loss() == units.number(loss, 3)

            await settle(pilot, follows, 10, "the Runs table's LOSS following the daemon's")
            assert table_loss() != units.number(left[2], 3)

            ended = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=120)
            assert ended.run.state is RunState.SUCCEEDED, ended.run.reason
            last_line = gpuctl("--node", daemon.address, "logs", run_id, "--tail", "1").stdout
            final = ended.run.last_values
            app.push_screen(RunScreen(model, run_id))

            def shows_the_end() -> bool:
                with model.lock:
                    found = run()
                    lines = found.logs.lines()
                    return (
                        found.history == "loaded"
                        and found.last_value("loss") == final["loss"]
                        and found.last_value("lr") == final["lr"]
                        and bool(lines)
                        and lines[-1].text == split_rank(last_line.strip())[1]
                    )

            await settle(pilot, shows_the_end, 30, "the reopened screen's last values and lines")
            await pilot.press("escape")
            await pilot.pause(0.5)
            header = next(ln for ln in screen_text(app).splitlines() if "LOSS" in ln)
            assert "RATE ETA" in " ".join(header.split()) and "RATEETA" not in header, header
    finally:
        feed.stop()
