"""gputop drains and undrains against a real daemon (issue 21 §1): on the Node screen `d`
asks for a reason and drains the selected GPU, `D` the node, `u`/`U` put them back after
a confirmation; the table, the node's header and the fleet row show each hold, and a
quarantine the daemon put on a GPU itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon
from tests.tui.screen import screen_text
from tests.tui.test_live import settle, watch
from tui.app import GpuTop
from tui.screens.node import NodeScreen
from tui.widgets.gpu_table import GpuTable


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gputop_drains_a_gpu_and_the_node_and_puts_them_back(
    daemon: RunningDaemon,
) -> None:
    model, feed, key = watch(daemon)
    app = GpuTop(model, feed, refresh_s=0.3)

    def holds() -> tuple[list[int], bool]:
        snap = daemon.client().node_hw()
        return [g.index for g in snap.gpus if g.hold is not None], snap.drained is not None

    async with app.run_test(size=(140, 44)) as pilot:
        app.push_screen(NodeScreen(model, key))
        await settle(pilot, lambda: model.nodes[key].snapshot is not None, 30, "the GPUs")
        table = app.screen.query_one(GpuTable)
        await settle(pilot, lambda: table.row_count == 8, 10, "the GPU table")
        table.move_cursor(row=2)  # GPU 2
        await pilot.pause(0.2)
        await pilot.press("d")
        await pilot.pause(0.5)
        assert "Drain GPU 2 of node0?" in screen_text(app)
        await pilot.press("ctrl+u", *"swap the fan", "enter")
        await settle(pilot, lambda: holds() == ([2], False), 10, "GPU 2 drained")
        await settle(pilot, lambda: "GPU 2 drained by" in screen_text(app), 10, "the header")
        # The header and the table's row come from different refreshes: wait for both.
        await settle(
            pilot,
            lambda: "swap the fan" in (text := screen_text(app)) and "DRAIN" in text,
            10,
            "the reason and the row's DRAIN",
        )

        await pilot.press("D")
        await pilot.pause(0.5)
        await pilot.press("enter")  # the default reason
        await settle(pilot, lambda: holds() == ([2], True), 10, "the node drained")
        await settle(pilot, lambda: "DRAINED by" in screen_text(app), 10, "the node's header")
        assert "drained from gputop by" in screen_text(app)

        await pilot.press("U")
        await pilot.pause(0.5)
        assert "Undrain node node0" in screen_text(app)
        await pilot.press("y")
        await settle(pilot, lambda: holds() == ([2], False), 10, "the node undrained")
        await pilot.press("u")
        await pilot.pause(0.5)
        await pilot.press("n")  # asked, and not done
        await pilot.pause(1.0)
        assert holds() == ([2], False)
        await pilot.press("u")
        await pilot.pause(0.5)
        await pilot.press("y")
        await settle(pilot, lambda: holds() == ([], False), 10, "GPU 2 undrained")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gputop_shows_a_gpu_the_daemon_quarantined_on_an_xid(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    xids = tmp_path / "xids"
    daemon = daemons(simulate_gpus=4, extra=("--simulate-xid-file", str(xids)))
    model, feed, key = watch(daemon)
    app = GpuTop(model, feed, refresh_s=0.3)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot, lambda: "node0" in screen_text(app), 30, "the fleet row")
        assert "QUAR" not in screen_text(app)
        xids.write_text("3:79\n")  # the driver says GPU 3 fell off the bus
        await settle(pilot, lambda: "QUAR 1" in screen_text(app), 15, "the fleet row's QUAR 1")
        app.push_screen(NodeScreen(model, key))
        await settle(
            pilot,
            lambda: "GPU 3 QUARANTINED: XID 79 (GPU has fallen off the bus)" in screen_text(app),
            10,
            "the node's header",
        )
        table = app.screen.query_one(GpuTable)

        def gpu_rows() -> list[list[str]]:
            rows = [line.split() for line in screen_text(app).splitlines()]
            return [row for row in rows if row and row[0] in {"0", "1", "2", "3"}]

        # The table's rows, as painted (row_count leads the paint on a busy machine).
        await settle(
            pilot, lambda: table.row_count == 4 and len(gpu_rows()) == 4, 10, "the GPU table"
        )
        marked = [row[0] for row in gpu_rows() if "QUAR" in row]
        assert marked == ["3"], marked  # GPU 3's row, and no other
