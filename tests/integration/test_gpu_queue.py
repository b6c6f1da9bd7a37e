"""The queue (issue 9): a run whose GPUs are busy waits, first come first served, and
starts by itself when they free up — on one node, and across two daemons, with no
deadlock. Real daemons with 8 simulated GPUs each, real torchrun, real gloo ranks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from gpud.model.run import RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    FAST,
    ROOT,
    force_stop,
    holder_spec,
    launch,
    nothing_left,
    status,
    wait_for,
    wait_for_step,
)

LONG = "training.max_steps=100000"
CONFIG = str(ROOT / "config/examples/cpu-ddp.yaml")
Daemons = Callable[..., RunningDaemon]


def queue_launch(
    daemon: RunningDaemon, *sets: str, nodes: tuple[str, ...] = (), config: str = CONFIG
) -> str:
    """`gpuctl launch --queue`, as a person types it; returns the run id."""
    args = [a for node in (nodes or (daemon.address,)) for a in ("--node", node)]
    args += ["launch", config, "--queue"]
    for s in sets:
        args += ["--set", s]
    result = gpuctl(*args)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(("queued ", "launched ")), result.stdout
    return first.split()[1]


def ps(daemon: RunningDaemon) -> dict[str, list[str]]:
    """`gpuctl ps` as a table: run id → its columns."""
    result = gpuctl("--node", daemon.address, "ps")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    starts = [header.index(h) for h in header.split()]
    return {
        row.split()[0]: [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        for row in rows
    }


def state_column(daemon: RunningDaemon, run_id: str) -> str:
    return ps(daemon)[run_id][2]


def gpus_column(daemon: RunningDaemon, run_id: str) -> str:
    return ps(daemon)[run_id][4]


def test_a_third_run_waits_in_the_queue_then_gets_the_freed_gpus(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    holder = holder_spec(tmp_path)  # runs that only hold their GPUs: no torch in their ranks
    first = launch(daemon, "gpus=4", config=holder)
    second = launch(daemon, "gpus=4", config=holder)
    third = queue_launch(daemon, "gpus=4", config=str(holder))
    fourth = queue_launch(daemon, "gpus=2", config=str(holder))
    try:
        assert state_column(daemon, third) == "queued #1"
        assert state_column(daemon, fourth) == "queued #2"
        assert gpus_column(daemon, third) == "-"  # a queued run holds nothing
        reason = status(daemon, third).run.reason or ""
        assert f"GPU 0-3 held by run {first} (holder)" in reason, reason
        # First come, first served: a later launch does not jump the queue.
        late = gpuctl("--node", daemon.address, "launch", CONFIG, "--set", "gpus=1")
        assert late.returncode == 1 and "queued run(s) ahead" in late.stderr, late.stderr
        time.sleep(2)  # several queue rounds: nothing moves while the GPUs are busy
        assert status(daemon, third).run.state is RunState.QUEUED

        force_stop(daemon, first)
        s = wait_for(daemon, third, {"running"}, timeout=60)
        assert s.attempts[-1].gpus == [0, 1, 2, 3]  # what the first gave back
        assert state_column(daemon, fourth) == "queued #1"

        cancelled = gpuctl("--node", daemon.address, "stop", fourth)
        assert cancelled.returncode == 0, cancelled.stderr
        s = status(daemon, fourth)
        assert s.run.state is RunState.STOPPED and s.attempts == []
        assert "cancelled while queued" in (s.run.reason or "")
    finally:
        for run_id in (second, third, fourth, first):
            gpuctl("--node", daemon.address, "stop", run_id, "--force")
    for run_id in (second, third):
        wait_for(daemon, run_id, {"stopped"}, timeout=60)
        nothing_left(run_id)
    listed = json.loads(gpuctl("--node", daemon.address, "--json", "ps").stdout)["runs"]
    assert all(r["gpus"] == [] for r in listed)


def test_a_resume_waits_in_the_queue_when_its_gpus_are_busy(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    first = launch(daemon, FAST, LONG, "gpus=all")
    wait_for_step(daemon, first, 3)
    stopped = gpuctl("--node", daemon.address, "stop", first)  # checkpoints on the way out
    assert stopped.returncode == 0, stopped.stderr
    other = launch(daemon, "gpus=1", config=holder_spec(tmp_path))
    try:
        refused = gpuctl("--node", daemon.address, "resume", first)
        assert refused.returncode == 1 and "needs 8 GPU(s), 7 free" in refused.stderr
        queued = gpuctl("--node", daemon.address, "resume", first, "--queue")
        assert queued.returncode == 0, queued.stderr
        assert queued.stdout.startswith(f"{first} is queued #1: waiting for GPUs: "), queued.stdout
        assert state_column(daemon, first) == "queued #1"
        assert status(daemon, first).attempts[-1].attempt == 1  # no attempt until it starts
    finally:
        force_stop(daemon, other)
    s = wait_for(daemon, first, {"running"}, timeout=60)
    assert [a.attempt for a in s.attempts] == [1, 2]
    assert s.attempts[-1].gpus == list(range(8)) and s.attempts[-1].resume_from
    force_stop(daemon, first)


def test_two_multi_node_runs_queued_on_two_daemons_both_finish(
    daemons: Daemons, tmp_path: Path
) -> None:
    n0, n1 = daemons(node="n0"), daemons(node="n1")
    both = (n0.address, n1.address)
    whole = ("gpus=8", "nproc_per_node=1")
    blocker = launch(n1, *whole, config=holder_spec(tmp_path, nproc=1))
    # Two runs that each need every GPU of both nodes, coordinated from different nodes;
    # each ends well 3 s after its ranks started.
    brief = str(holder_spec(tmp_path, nproc=1, seconds=3))
    a = queue_launch(n0, *whole, nodes=both, config=brief)
    b = queue_launch(n1, *whole, nodes=both[::-1], config=brief)
    try:
        time.sleep(3)  # queue rounds on both coordinators: neither may hold anything
        assert status(n0, a).run.state is RunState.QUEUED
        assert status(n1, b).run.state is RunState.QUEUED
        for node in (n0, n1):
            table = ps(node)
            assert table[a][4] == table[b][4] == "-", table
        assert state_column(n1, a) == "queued #1" and state_column(n1, b) == "queued #2"
        force_stop(n1, blocker)
        # First come, first served on every node: a starts, b waits for all of it.
        s = wait_for(n0, a, {"running", "succeeded"}, timeout=60)
        assert [p.gpus for p in s.parts] in ([list(range(8))] * 2, [[], []])
        assert status(n1, b).run.state is RunState.QUEUED
        assert wait_for(n0, a, {"succeeded", "failed"}).run.state is RunState.SUCCEEDED
        assert wait_for(n1, b, {"succeeded", "failed"}).run.state is RunState.SUCCEEDED
    finally:
        for node, run_id in ((n1, blocker), (n0, a), (n1, b)):
            gpuctl("--node", node.address, "stop", run_id, "--force")
    for run_id in (a, b):
        nothing_left(run_id)
    for node in (n0, n1):
        listed = json.loads(gpuctl("--node", node.address, "--json", "ps").stdout)["runs"]
        assert all(r["gpus"] == [] for r in listed), listed
