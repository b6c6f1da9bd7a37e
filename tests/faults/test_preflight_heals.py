"""What the preflight does with what it finds (issue 21 §2), on two real daemons with real
gloo check processes (`trainers.preflight`) and real gpuctl.

A run of several nodes is checked before its first attempt too (gpuctl joins every node,
then node 0 starts it: `run.start`). A GPU that fails its matmul check (the test hook
`GPUD_TEST_BAD_GPU_CHECK` in node 1's daemon: GPU 0 reads wrong) is quarantined there and
the attempt does not start on it: the launch fails with one line that says why, the next
launch gets the other GPU, and an operator's undrain puts GPU 0 back. A node whose
all-reduce with node 0 falls far below its own earlier attempts in the run is named, even
with no peers to compare it with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    CPU_DDP,
    FAST,
    force_stop,
    launch,
    nothing_left,
    status,
    wait_for,
    wait_for_step,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]
Daemons = Callable[..., RunningDaemon]
LONG = ("training.max_steps=100000", "nproc_per_node=1")


def gpu_hold(daemon: RunningDaemon, index: int) -> dict[str, object] | None:
    done = gpuctl("--node", daemon.address, "--json", "hw")
    assert done.returncode == 0, done.stderr
    hold: dict[str, object] | None = json.loads(done.stdout)["nodes"][0]["gpus"][index]["hold"]
    return hold


def test_a_gpu_that_fails_its_check_is_quarantined_and_the_run_starts_elsewhere(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = []
    for i in range(2):
        with monkeypatch.context() as env:
            if i == 1:
                env.setenv("GPUD_TEST_BAD_GPU_CHECK", "0")
            nodes.append(daemons(node=f"n{i}", simulate_gpus=2))
    where = [a for n in nodes for a in ("--node", n.address)]
    sets = [a for s in (FAST, *LONG, "gpus=1") for a in ("--set", s)]
    refused = gpuctl(*where, "launch", str(CPU_DDP), *sets, timeout=120)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "attempt 1 did not start: node 1: its GPU check failed: GPU 0: wrong matmul" in lines[0]
    assert "quarantined" in lines[0], lines[0]
    hold = gpu_hold(nodes[1], 0)
    assert hold is not None and hold["kind"] == "quarantine", hold
    assert "failed the preflight of run" in str(hold["reason"]), hold
    assert "wrong matmul result" in str(hold["reason"]), hold
    assert gpu_hold(nodes[1], 1) is None
    table = gpuctl("--node", nodes[1].address, "hw").stdout
    assert "quarantined" in table, table
    # The refused run left nothing behind on either node, and is not queued.
    for node in nodes:
        listed = json.loads(gpuctl("--node", node.address, "--json", "ps").stdout)
        assert [r["state"] for r in listed["runs"]] == ["stopped"], listed

    run_id = launch(
        nodes[0], FAST, *LONG, "gpus=1", nodes=tuple(n.address for n in nodes), preflight=True
    )
    wait_for_step(nodes[0], run_id, 10)
    mine = status(nodes[1], run_id)
    assert mine.attempts[-1].gpus == [1], mine.attempts  # not the quarantined GPU 0
    checks = [e.message for e in status(nodes[0], run_id).events if e.kind == "preflight"]
    assert checks and checks[0].startswith("preflight across 2 nodes in "), checks
    force_stop(nodes[0], run_id)
    nothing_left(run_id, timeout=30)

    undone = gpuctl("--node", nodes[1].address, "undrain", nodes[1].address, "--gpu", "0")
    assert undone.returncode == 0, undone.stderr
    assert gpu_hold(nodes[1], 0) is None


def test_a_node_far_below_its_own_baseline_is_named_in_a_two_node_run(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slow = tmp_path / "slow-s"
    slow.write_text("0")
    nodes = []
    for i in range(2):
        with monkeypatch.context() as env:
            if i == 1:
                env.setenv("GPUD_TEST_SLOW_PREFLIGHT_S", f"@{slow}")
            nodes.append(daemons(node=f"n{i}", simulate_gpus=None))
    run_id = launch(nodes[0], FAST, *LONG, nodes=tuple(n.address for n in nodes), preflight=True)
    wait_for_step(nodes[0], run_id, 10)
    first = [e.message for e in status(nodes[0], run_id).events if e.kind == "preflight"]
    assert len(first) == 1 and "all-reduce with node 0: node 1 " in first[0], first
    stopped = gpuctl("--node", nodes[0].address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    wait_for(nodes[0], run_id, {"stopped"}, timeout=60)

    slow.write_text("0.1")  # node 1's link is now far slower than at attempt 1
    resumed = gpuctl("--node", nodes[0].address, "resume", run_id, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    s = status(nodes[0], run_id)
    named = [e.message for e in s.events if "baseline" in e.message]
    assert len(named) == 1, [e.message for e in s.events]
    assert named[0].startswith("node 1: all-reduce with node 0 at "), named
    assert "under 50% of its baseline" in named[0], named
    assert s.run.attempt == 2 and s.run.state.value in ("starting", "running"), s.run
    force_stop(nodes[0], run_id)
    nothing_left(run_id, timeout=30)
