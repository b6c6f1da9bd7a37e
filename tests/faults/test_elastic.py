"""Elastic runs (issue 21 §3): a 3-node run that loses a node goes on with what is left.

Three daemons on one host make a 3-node run of the CPU DDP example (one gloo rank per
node, `elastic: {min_nodes: 2}`, `lost_after_s: 10`, a checkpoint every 20 steps). One
node freezes whole (SIGSTOP of its daemon and its rank): node 0 calls it lost, stops the
others, and restarts from the checkpoint on the two that answer, with the gradient
accumulation raised so the global batch is kept; the run finishes with no step missing
from its metrics, and node 0's /metrics says 2 of 3 nodes. With a spare, the next attempt
is back at three nodes. With `min_nodes: 3`, the run waits, queued, saying why (`queue:
true`), or fails, saying why (without it). When the frozen node wakes, what is left of its
part of the old attempt is stopped, and `gpuctl resize` brings it back in, as does the
next automatic restart.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from gpud.model.run import RunState
from gpud.runs.process import procs
from tests.integration.test_prometheus import parse, scrape
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.runs import (
    FAST,
    assert_no_gap,
    launch,
    nothing_left,
    status,
    steps_recorded,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

pytestmark = [pytest.mark.faults, pytest.mark.slow]
Daemons = Callable[..., RunningDaemon]

TOTAL = 150  # attempt 2 resumes from step 40 at the latest: 110 steps more
ELASTIC = (
    "nproc_per_node=1", "lost_after_s=10", "checkpoint.every_steps=20",
    "restart.max_attempts=2", "restart.backoff_s=0",
)  # fmt: skip


@contextmanager
def frozen(daemon: RunningDaemon, run_id: str, node_rank: int) -> Iterator[None]:
    """The node freezes whole: its daemon and every process of the run on it."""
    victims = [daemon.proc.pid, *(p.pid for p in procs.tagged(run_id, node_rank=node_rank))]
    for pid in victims:
        psutil.Process(pid).suspend()
    try:
        yield
    finally:
        for pid in victims:
            try:
                psutil.Process(pid).resume()
            except psutil.NoSuchProcess:
                pass


def three(daemons: Daemons, spares: int = 0, metrics_port: int = 0) -> list[RunningDaemon]:
    """Three daemons (and spares); node 0 serves /metrics on `metrics_port` if one is given."""
    scraped = ("--metrics", f"127.0.0.1:{metrics_port}") if metrics_port else ()
    return [
        daemons(node=f"n{i}", simulate_gpus=None, extra=scraped if i == 0 else ())
        for i in range(3 + spares)
    ]


def run_series(port: int, run_id: str) -> dict[str, float]:
    """Node 0's /metrics: the run's world and node counts."""
    samples = parse(scrape(f"http://127.0.0.1:{port}/metrics"))
    wanted = ("gpud_run_world_size", "gpud_run_nodes", "gpud_run_planned_nodes")
    return {
        name: value
        for name in wanted
        for labels, value in samples.get(name, [])
        if labels["run"] == run_id
    }


def launch_on_two_of_three(nodes: list[RunningDaemon], preflight: bool = False) -> str:
    """A 3-node run that goes on with two (`min_nodes: 2`), training until stopped."""
    return launch(
        nodes[0], FAST, "training.max_steps=100000", "elastic={min_nodes: 2}", *ELASTIC,
        nodes=tuple(n.address for n in nodes[:3]), preflight=preflight,
    )  # fmt: skip


def stop_with_every_step(node: RunningDaemon, run_id: str) -> None:
    """gpuctl stop through node 0; no step missing from its metrics over every attempt,
    and nothing of the run left running."""
    stopped = gpuctl("--node", node.address, "stop", run_id, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    last = status(node, run_id).run.last_step or 0
    assert_no_gap(steps_recorded(node, run_id), last + 1)
    nothing_left(run_id, timeout=30)


def trains(node: RunningDaemon, run_id: str, attempt: int | None, past: int = 5) -> bool:
    """The run is running (`attempt`, where given) and has made `past` steps since its
    attempt's resume point."""
    s = status(node, run_id)
    return (
        (attempt is None or s.run.attempt == attempt)
        and s.run.state is RunState.RUNNING
        and (s.run.last_step or 0) > (s.attempts[-1].resume_step or 0) + past
    )


@pytest.mark.timeout(600)
def test_a_frozen_node_is_left_out_and_the_run_goes_on_with_two(daemons: Daemons) -> None:
    port = free_port()
    nodes = three(daemons, metrics_port=port)
    run_id = launch_on_two_of_three(nodes)
    wait_for_step(nodes[0], run_id, 45)  # past two checkpoints
    assert run_series(port, run_id) == {
        "gpud_run_world_size": 3, "gpud_run_nodes": 3, "gpud_run_planned_nodes": 3,
    }  # fmt: skip
    with frozen(nodes[2], run_id, 2):
        froze = time.monotonic()
        until(
            "attempt 2 training on two nodes",
            lambda: trains(nodes[0], run_id, 2),
            timeout=90,
        )
        print(f"freeze to attempt 2 training: {time.monotonic() - froze:.1f}s")
        s = status(nodes[0], run_id)
        assert s.run.members == [0, 1] and s.run.world_size == 2, s.run
        second = s.attempts[-1]
        assert second.world_size == 2 and second.grad_accum == 3  # 2 × 3 nodes / 2 nodes
        assert second.resume_from is not None
        listed = next(line for line in gpuctl("ps").stdout.splitlines() if run_id in line)
        assert " 2/3x1 " in listed, listed
        shown = gpuctl("--node", nodes[0].address, "status", run_id).stdout
        assert "on 2/3 nodes (0, 1), world 2" in shown, shown
        # The NODE table lists the node the attempt goes on without, and why (issue 33 §4).
        assert re.search(r"^2 +\S+ +left out +- +it did not answer \(lost\)", shown, re.M), shown
        events = [e.message for e in s.events if e.kind == "attempt"]
        assert any("on 2/3 node(s) without node(s) 2" in m for m in events), events
        assert any("gradient accumulation 3 (the global batch kept)" in m for m in events), events
        assert run_series(port, run_id) == {
            "gpud_run_world_size": 2, "gpud_run_nodes": 2, "gpud_run_planned_nodes": 3,
        }  # fmt: skip
    # Node 2 woke up: its part of attempt 1 is stopped; it does not rejoin by itself.
    until("node 2's old part stopped", lambda: not procs.tagged(run_id, node_rank=2), 30)
    # Its own log says why: the run went on without it, not that it ended (issue 33 §4).
    told = [e.message for e in status(nodes[2], run_id).events if e.kind == "stop"]
    assert any("stale: run " + run_id + " went on without node 2" in m for m in told), told
    assert not any(f"run {run_id} ended" in m for m in told), told
    assert status(nodes[0], run_id).run.members == [0, 1]
    resized = gpuctl("--node", nodes[0].address, "resize", run_id, timeout=120)
    assert resized.returncode == 0, resized.stderr
    assert "attempt 3 on 3 node(s) (attempt 2 had 2/3)" in resized.stdout, resized.stdout
    third = status(nodes[0], run_id)
    assert third.run.members == [0, 1, 2] and third.attempts[-1].grad_accum == 2
    until(
        "attempt 3 training on three nodes",
        lambda: trains(nodes[0], run_id, None),
        timeout=120,
    )
    stop_with_every_step(nodes[0], run_id)  # over three attempts


@pytest.mark.timeout(600)
def test_a_node_that_came_back_rejoins_at_the_next_automatic_restart(daemons: Daemons) -> None:
    """Node 2 froze and was left out of attempt 2; it came back. When a rank of attempt 2
    then dies, the automatic restart asks every node again: attempt 3 is on all three,
    with the spec's own gradient accumulation, resumed from the newest checkpoint."""
    nodes = three(daemons)
    run_id = launch_on_two_of_three(nodes)
    wait_for_step(nodes[0], run_id, 45)
    with frozen(nodes[2], run_id, 2):
        until(
            "attempt 2 training on two nodes",
            lambda: trains(nodes[0], run_id, 2, 25),
            timeout=90,
        )
    until("node 2's old part stopped", lambda: not procs.tagged(run_id, node_rank=2), 30)
    # Its own log says why: the run went on without it, not that it ended (issue 33 §4).
    told = [e.message for e in status(nodes[2], run_id).events if e.kind == "stop"]
    assert any("stale: run " + run_id + " went on without node 2" in m for m in told), told
    assert not any(f"run {run_id} ended" in m for m in told), told
    assert status(nodes[0], run_id).run.members == [0, 1]
    ranks = [
        p for p in procs.tagged(run_id, node_rank=1)
        if "ddp.py" in (line := " ".join(p.cmdline())) and "torch.distributed.run" not in line
    ]  # fmt: skip
    assert len(ranks) == 1, [p.cmdline() for p in ranks]
    for rank in ranks:  # node 1's rank dies: a failure, restarted by the spec's policy
        rank.kill()
    until(
        "attempt 3 training on three nodes",
        lambda: trains(nodes[0], run_id, 3),
        timeout=120,
    )
    s = status(nodes[0], run_id)
    assert s.run.members == [0, 1, 2] and s.run.world_size == 3, s.run
    second, third = s.attempts[1], s.attempts[2]
    assert second.state is RunState.FAILED and third.grad_accum == 2, third  # the spec's
    assert third.resume_from is not None
    stop_with_every_step(nodes[0], run_id)  # over three attempts


@pytest.mark.timeout(600)
def test_with_a_spare_the_next_attempt_is_back_at_three_nodes(daemons: Daemons) -> None:
    nodes = three(daemons, spares=1)
    spare = nodes[3].address
    run_id = launch(
        nodes[0], FAST, f"training.max_steps={TOTAL}",
        f"elastic={{min_nodes: 2, spares: ['{spare}']}}", *ELASTIC,
        nodes=tuple(n.address for n in nodes[:3]),
    )  # fmt: skip
    assert status(nodes[3], run_id).run.state is RunState.PENDING  # a spare, idle
    wait_for_step(nodes[0], run_id, 45)
    with frozen(nodes[1], run_id, 1):
        until(
            "attempt 2 on nodes 0, 2 and the spare",
            lambda: (
                (s := status(nodes[0], run_id)).run.attempt == 2 and s.run.state is RunState.RUNNING
            ),
            timeout=90,
        )
        s = status(nodes[0], run_id)
        assert s.run.members == [0, 2, 3] and s.run.world_size == 3, s.run
        assert s.attempts[-1].grad_accum == 2  # three nodes again: the spec's own
        assert status(nodes[3], run_id).run.state in {RunState.STARTING, RunState.RUNNING}
    ended = wait_for(nodes[0], run_id, {"succeeded", "failed", "stopped"}, timeout=240)
    assert ended.run.state is RunState.SUCCEEDED, ended.run.reason
    assert_no_gap(steps_recorded(nodes[0], run_id), TOTAL)
    nothing_left(run_id, timeout=30)


def three_at_min_nodes(daemons: Daemons, queue: bool) -> tuple[list[RunningDaemon], str]:
    """A 3-node run with `min_nodes: 3`, trained past its first checkpoint; `gpuctl launch
    --queue` (kept in its spec as `queue: true`) with `queue`."""
    nodes = three(daemons)
    run_id = launch(
        nodes[0], FAST, "training.max_steps=100000", "elastic={min_nodes: 3}", *ELASTIC,
        nodes=tuple(n.address for n in nodes), extra=("--queue",) if queue else (),
    )  # fmt: skip
    wait_for_step(nodes[0], run_id, 25)
    return nodes, run_id


def test_below_min_nodes_the_run_waits_queued_and_says_why(daemons: Daemons) -> None:
    nodes, run_id = three_at_min_nodes(daemons, queue=True)
    with frozen(nodes[2], run_id, 2):
        queued = wait_for(nodes[0], run_id, {"queued"}, timeout=60)
        assert "fewer than elastic.min_nodes 3" in (queued.run.reason or ""), queued.run.reason
    # Awake again: the run starts on all three.
    until(
        "attempt 2 running on three nodes",
        lambda: (
            (s := status(nodes[0], run_id)).run.state is RunState.RUNNING and s.run.attempt == 2
        ),
        timeout=90,
    )
    assert status(nodes[0], run_id).run.members == [0, 1, 2]
    stopped = gpuctl("--node", nodes[0].address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    nothing_left(run_id, timeout=30)


def test_below_min_nodes_without_queue_the_run_fails_and_says_why(daemons: Daemons) -> None:
    """`queue` is false by default: an automatic restart below min_nodes fails the run at
    once instead of waiting, naming the nodes that are healthy and the one that is not."""
    nodes, run_id = three_at_min_nodes(daemons, queue=False)
    with frozen(nodes[2], run_id, 2):
        failed = wait_for(nodes[0], run_id, {"failed", "queued"}, timeout=60)
        assert failed.run.state is RunState.FAILED, failed.run
        assert failed.run.reason == (
            "not restarted: 2 healthy node(s) (0, 1), fewer than elastic.min_nodes 3;"
            " node(s) 2 do not answer (queue: false; with queue: true it would wait, queued)"
        ), failed.run.reason
        assert failed.run.cause is not None  # the attempt's own failure, kept
        assert failed.run.attempt == 1 and len(failed.attempts) == 1
        shown = gpuctl("--node", nodes[0].address, "status", run_id)
        assert "fewer than elastic.min_nodes 3" in shown.stdout, shown.stdout + shown.stderr
        # Node 1 was asked without `queue`: it holds no place in its queue for the run.
        assert status(nodes[1], run_id).run.state is not RunState.QUEUED
    # Awake again: what is left of node 2's part is stopped; the run stays failed.
    nothing_left(run_id, timeout=30)
    assert status(nodes[0], run_id).run.state is RunState.FAILED


def test_a_node_whose_gpu_fails_its_preflight_is_left_out_of_the_next_attempt(
    daemons: Daemons, tmp_path: Path
) -> None:
    """Issue 21 §2: node 2's only GPU reports an XID 92 (not fatal: no quarantine, the run
    goes on); at the next attempt (`gpuctl resize`) its preflight fails, so node 2 cannot
    give its part and the attempt starts on nodes 0 and 1, saying why."""
    xids = tmp_path / "xids-n2"
    nodes = [
        daemons(node=f"n{i}", simulate_gpus=1,
                extra=("--simulate-xid-file", str(xids)) if i == 2 else ())
        for i in range(3)
    ]  # fmt: skip
    run_id = launch_on_two_of_three(nodes, preflight=True)
    wait_for_step(nodes[0], run_id, 25)
    xids.write_text("0:92\n")
    until("n2's XID", lambda: bool(nodes[2].client().node_hw().gpus[0].xid.total), timeout=10)
    resized = gpuctl("--node", nodes[0].address, "resize", run_id, timeout=120)
    assert resized.returncode == 0, resized.stderr
    s = status(nodes[0], run_id)
    assert (s.run.attempt, s.run.members) == (2, [0, 1]), (s.run, resized.stdout)
    left = [e.message for e in s.events if "left out of attempt 2" in e.message]
    assert len(left) == 1 and left[0].startswith("node 2 left out of attempt 2: "), left
    assert "failed its preflight: XID 92 (high single-bit ECC error rate)" in left[0], left
    stopped = gpuctl("--node", nodes[0].address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    nothing_left(run_id, timeout=30)


def test_a_node_slow_in_the_preflights_all_reduce_is_left_out_of_each_attempt(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 §2: before each attempt, the first too, the nodes run the collective check
    (`trainers.preflight`): node 2, made slow by the test hook in its daemon's environment,
    reads far below its peers in its all-reduce with node 0 and is left out of the elastic
    attempt, saying why; the check's figures are an event of the run."""
    nodes = []
    for i in range(3):
        with monkeypatch.context() as env:
            if i == 2:
                env.setenv("GPUD_TEST_SLOW_PREFLIGHT_S", "0.05")
            nodes.append(daemons(node=f"n{i}", simulate_gpus=None))
    run_id = launch_on_two_of_three(nodes, preflight=True)
    first = status(nodes[0], run_id)
    assert (first.run.attempt, first.run.members) == (1, [0, 1]), first.run
    left = [e.message for e in first.events if "left out of attempt 1" in e.message]
    assert len(left) == 1 and "node 2 left out of attempt 1: it failed its preflight:" in left[0]
    ps = gpuctl("--node", nodes[0].address, "ps").stdout
    assert " 2/3x1 " in ps, ps
    wait_for_step(nodes[0], run_id, 25)
    resized = gpuctl("--node", nodes[0].address, "resize", run_id, timeout=120)
    assert resized.returncode == 0, resized.stderr
    s = status(nodes[0], run_id)
    checks = [e.message for e in s.events if e.kind == "preflight"]
    print("\n".join(checks))
    assert checks and checks[0].startswith("preflight across 3 nodes in "), checks
    assert "all-reduce with node 0: node 1 " in checks[0] and ", node 2 " in checks[0]
    left = [e.message for e in s.events if "left out of attempt 2" in e.message]
    assert len(left) == 1, left
    assert left[0].startswith("node 2 left out of attempt 2: it failed its preflight:"), left
    assert "under 50% of its peers' median" in left[0], left
    assert (s.run.attempt, s.run.members) == (2, [0, 1]), s.run
    wait_for_step(nodes[0], run_id, 45)  # it trains on, on two nodes
    stopped = gpuctl("--node", nodes[0].address, "stop", run_id, "--force", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    nothing_left(run_id, timeout=30)


def test_bad_elastic_specs_are_one_line(daemons: Daemons) -> None:
    node = daemons()
    spec = "config/examples/cpu-ddp.yaml"
    too_many = gpuctl(
        "--node", node.address, "launch", spec,
        "--set", "elastic={min_nodes: 2}", "--set", "restart.max_attempts=1",
    )  # fmt: skip
    assert too_many.returncode == 2
    assert too_many.stderr.strip().splitlines() == [
        "gpuctl: error: spec: elastic.min_nodes 2 is more than the 1 node(s) listed"
    ]
    no_restart = gpuctl("--node", node.address, "launch", spec, "--set", "elastic={min_nodes: 1}")
    assert no_restart.returncode == 2 and len(no_restart.stderr.strip().splitlines()) == 1
    assert "restart.max_attempts" in no_restart.stderr
