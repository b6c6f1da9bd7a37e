"""gputop's Node screen against a real daemon (issue 9): two runs with `gpus: 4` on a box of
8 simulated GPUs, each GPU row naming the run that leases it, and each rank's process
mapped back to its run and rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.wire.client import Client
from tests.support.daemons import RunningDaemon
from tests.support.runs import holder_spec, launch, ranks_of, wait_for
from tests.tui.screen import screen_text
from tests.tui.test_live import flat, settle, watch
from tui.app import GpuTop
from tui.screens.node import NodeScreen


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_node_screen_shows_each_gpus_run_and_maps_processes_to_ranks(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    holder = holder_spec(tmp_path)  # torchrun runs whose ranks only hold: no torch in them
    first = launch(daemon, "gpus=4", config=holder)
    second = launch(daemon, "gpus=4", config=holder)
    model, feed, key = watch(daemon)
    app = GpuTop(model, feed, refresh_s=0.3)
    try:
        async with app.run_test(size=(130, 40)) as pilot:

            def mapped() -> bool:
                with model.lock:
                    snap = model.nodes[key].snapshot
                    if snap is None:
                        return False
                    owners = {
                        g.index: model.process_owner(key, g.index, p.pid)
                        for g in snap.gpus
                        for p in g.processes or []
                    }
                return all(owners.get(i) is not None for i in (0, 1, 4, 5))

            app.push_screen(NodeScreen(model, key))  # its full snapshots come while it shows
            await settle(pilot, mapped, 60, "every rank's process on its leased GPU")

            def gpu_rows() -> dict[str, list[str]]:
                return {
                    line.split()[0]: line.split()
                    for line in screen_text(app).splitlines()
                    if line.split() and line.split()[0].isdigit() and len(line.split()) > 8
                }

            def leased_rows() -> bool:
                rows = gpu_rows()
                return all((first if i < 4 else second) in rows.get(str(i), []) for i in range(8))

            # the model has them: the screen draws them at its next refresh
            await settle(pilot, leased_rows, 30, f"GPUs 0-3 leased to {first}, 4-7 to {second}")
            pid = ranks_of(second)[1].pid  # local rank 1 of the second run: GPU 5
            for _ in range(5):
                await pilot.press("down")
            await pilot.pause(1.0)
            text = flat(screen_text(app))
            assert f"GPU 5 · NVIDIA H100 80GB HBM3 SIMULATED leased to {second} (holder)" in text
            assert f"pid {pid} " in text and f"→ {second} rank 1 (local 1)" in text, text
    finally:
        for run_id in (first, second):
            with Client(daemon.target()) as client:
                client.stop_run(run_id, force=True)
        for run_id in (first, second):
            wait_for(daemon, run_id, {"stopped"}, timeout=60)
