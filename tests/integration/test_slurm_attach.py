"""A Slurm run reports to the gpud daemon of each node it runs on (issue 12): the CPU DDP
example on the two nodes of a real local Slurm, one real daemon per Slurm node (each with
its attach socket), and the run in `gpuctl ps`, `status`, `health` and gputop like a run
gpud launched: its loss, every rank's heartbeat (node 1's through node 0's daemon), and
Slurm's job on it. gpud refuses to stop what Slurm owns; Slurm's stop ends it everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import HealthSummary
from gpud.wire.client import Client, ClientError
from gpud.wire.protocol import RUN_HEALTH, RUN_LIST, RUN_STATUS
from gpud.wire.run_messages import ListRequest, RunRef, RunSummary
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.slurm import LocalSlurm
from tests.support.slurm_runs import ps, submit, write_spec
from tests.support.waiting import until
from tests.tui.screen import screen_text
from tui.app import GpuTop
from tui.model.feed import Feed
from tui.model.fleet import FleetModel
from tui.model.targets import Target
from tui.screens.run import RunScreen

pytestmark = pytest.mark.slow
Daemons = Callable[..., RunningDaemon]


@pytest.fixture
def nodes(
    cluster: LocalSlurm, daemons: Daemons, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[RunningDaemon, RunningDaemon]:
    """A daemon for each Slurm node (both on this host), named as Slurm names them."""
    started = tuple(
        daemons(node=name, simulate_gpus=4, extra=("--attach", str(tmp_path / f"attach-{name}")))
        for name in ("n1", "n2")
    )
    # What a job's part runner reads to find its node's daemon (sbatch exports it).
    monkeypatch.setenv("GPUD_ATTACH", str(tmp_path / "attach-{node}"))
    return started[0], started[1]


def runs_on(daemon: RunningDaemon) -> dict[str, RunSummary]:
    with Client(daemon.target(), timeout_s=10) as client:
        return {r.id: r for r in client.call(RUN_LIST, ListRequest()).runs}


def health(daemon: RunningDaemon, run_id: str) -> HealthSummary:
    with Client(daemon.target(), timeout_s=10) as client:
        reply = client.call(RUN_HEALTH, RunRef(run=run_id))
    assert isinstance(reply, HealthSummary)
    return reply


def test_a_slurm_run_reports_to_its_nodes_daemons_and_shows_as_a_gpud_run_does(
    nodes: tuple[RunningDaemon, RunningDaemon], tmp_path: Path
) -> None:
    node0, node1 = nodes
    run_id, job = submit(write_spec(tmp_path, "attached", steps=100_000))

    def running() -> RunSummary | None:
        run = runs_on(node0).get(run_id)
        return run if run and run.state.value == "running" and (run.last_step or 0) >= 40 else None

    run = until("the run on node 0's daemon, training", running)
    assert run.attached is not None and run.attached.scheduler == "slurm"
    assert run.attached.job_id == job and run.attached.user == "root"
    assert 0 < run.last_values["loss"] < 10
    assert runs_on(node1)[run_id].node_rank == 1  # node 1's part, on its own daemon
    with Client(node0.target(), timeout_s=10) as client:
        status = client.call(RUN_STATUS, RunRef(run=run_id))
    attached = [e.message for e in status.events if e.kind == "attached"]
    assert attached and f"slurm job {job}: node 0 (n1) attached, attempt 1" in attached[0]

    # Every rank's heartbeat, node 1's polled from its daemon by node 0's.
    def both_ranks() -> HealthSummary | None:
        found = health(node0, run_id)
        beating = {r.rank: r for r in found.ranks if r.heartbeat_age_s is not None}
        return found if set(beating) == {0, 1} and beating[1].node_rank == 1 else None

    seen = until("both ranks' heartbeats on node 0", both_ranks, timeout=60)
    ages = {r.rank: r.heartbeat_age_s for r in seen.ranks}  # 0.0 is a fresh heartbeat
    assert all(age is not None and age < 5 for age in ages.values()), ages
    assert seen.world_size == 2 and seen.verdict in ("ok", "degraded"), seen

    # gpuctl ps: one row, Slurm's state and job, the daemon's live step and loss.
    rows = [line for line in gpuctl("ps").stdout.splitlines() if line.startswith(run_id)]
    assert len(rows) == 1 and "running" in rows[0] and f"slurm:{job}" in rows[0], rows
    row = ps(run_id)
    assert row["attached"]["job_id"] == job and row["last_step"] >= 40

    # gputop over both daemons: the run, its loss and both ranks, and whose job it is.
    asyncio.run(_gputop_shows(node0, node1, run_id, job))

    # gpud watches, Slurm owns: a stop asked of gpud names Slurm's way, and does nothing.
    with Client(node0.target(), timeout_s=10) as client, pytest.raises(ClientError) as refused:
        client.stop_run(run_id)
    assert f"Slurm job {job}" in str(refused.value) and f"gpuctl stop {run_id}" in str(
        refused.value
    )
    assert runs_on(node0)[run_id].state.value == "running"

    stopped = gpuctl("stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    for daemon in nodes:
        ended = until(
            "the part's end on its daemon",
            lambda d=daemon: (r := runs_on(d)[run_id]).state.terminal and r,  # type: ignore[misc]
        )
        assert ended.state.value == "stopped", ended
        assert "stopped by Slurm" in (ended.reason or ""), ended.reason


async def _gputop_shows(node0: RunningDaemon, node1: RunningDaemon, run_id: str, job: str) -> None:
    targets = [Target(node0.target()), Target(node1.target())]
    model = FleetModel(targets)
    app = GpuTop(model, Feed(model, targets, refresh_s=0.5), start_run=run_id, refresh_s=0.3)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 30

        def ready() -> bool:
            with model.lock:
                run = model.runs.get(run_id)
                return bool(
                    run is not None
                    and run.known
                    and run.history in ("loaded", "unavailable")
                    and run.health is not None
                    and len([r for r in run.health.ranks if r.heartbeat_age_s is not None]) == 2
                )

        while not ready():
            assert time.monotonic() < deadline, "gputop never showed the run with both ranks"
            await pilot.pause(0.2)
        await pilot.pause(0.6)
        assert isinstance(app.screen, RunScreen)
        text = screen_text(app)
        assert run_id in text or "attached" in text, text
        assert f"Slurm job {job} (root)" in text, text
        assert "loss" in text
        await pilot.press("s")  # stop: refused in gputop itself, naming Slurm's way
        await pilot.pause(0.3)
        assert not any(type(s).__name__ == "ConfirmScreen" for s in app.screen_stack)
