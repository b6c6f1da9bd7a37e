"""Runs end to end: real daemons, real torchrun, real gloo training on CPU."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gpud.model.run import CauseKind
from gpud.runs.diagnosis.attempt_log import AttemptLog
from tests.integration.test_health import metrics, steps_by_attempt
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    CPU_DDP,
    FAST,
    ROOT,
    holder_spec,
    kill_rank,
    launch,
    nothing_left,
    ranks_of,
    script_spec,
    status,
    wait_for,
    wait_for_step,
)

pytestmark = pytest.mark.slow


def test_one_node_two_processes_succeeds_with_wait(daemon: RunningDaemon) -> None:
    result = gpuctl(
        "--node",
        daemon.address,
        "launch",
        str(CPU_DDP),
        "--wait",
        "--set",
        FAST,
        "--set",
        "training.max_steps=30",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "succeeded" in result.stdout.splitlines()[-1]
    run_id = result.stdout.split()[1]
    s = status(daemon, run_id)
    assert s.run.state.value == "succeeded"
    assert s.run.last_step == 29 and "loss" in s.run.last_values
    assert s.attempts[0].nproc == 2 and s.attempts[0].exit and s.attempts[0].exit.exit_code == 0
    kinds = [e.kind for e in s.events]
    assert "verified" in kinds  # the daemon checked that no process is left
    nothing_left(run_id)
    final = Path(daemon.state_dir, "runs", run_id, "final.pt")
    assert final.exists()
    logs = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "0")
    assert "[default0]:done: 30 steps" in logs.stdout
    assert all(line.startswith("[default0]:") for line in logs.stdout.splitlines())


@pytest.mark.parametrize(
    ("simulate_gpus", "memory"),
    [
        (None, "no GPUs on this node"),
        (2, "no GPU memory held by it (simulated GPUs: no NVML check)"),
    ],
)
def test_the_end_of_run_check_says_what_it_checked(
    daemons: Callable[..., RunningDaemon],
    tmp_path: Path,
    simulate_gpus: int | None,
    memory: str,
) -> None:
    """A node without GPUs does not claim simulated ones in its "verified" event."""
    daemon = daemons(simulate_gpus=simulate_gpus)
    run_id = launch(daemon, config=script_spec(tmp_path, "print('hello')"))
    wait_for(daemon, run_id, {"succeeded"})
    deadline = time.monotonic() + 10
    while not (verified := [e for e in status(daemon, run_id).events if e.kind == "verified"]):
        assert time.monotonic() < deadline, "no verified event"
        time.sleep(0.1)
    (event,) = verified
    assert event.message == f"no process of attempt 1 is left on node0; {memory}"


CHATTY = """\
import os, pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if os.environ["RANK"] == "1":
    for i in range(5):
        print(f"rank one says {i}", flush=True)
    marker.touch()
else:  # rank 0 talks after rank 1 is done, well past torchrun's tee interval
    while not marker.exists():
        time.sleep(0.05)
    time.sleep(1)
    for i in range(50):
        print(f"rank zero says {i}", flush=True)
"""


def test_logs_of_one_rank_tail_that_ranks_last_lines(daemon: RunningDaemon, tmp_path: Path) -> None:
    """`--rank 1 --tail 3` is rank 1's last 3 lines, even when other ranks talked since."""
    spec = script_spec(
        tmp_path, CHATTY, name="chatty", launcher="torchrun", nproc=2, args=(str(tmp_path / "m"),)
    )
    run_id = launch(daemon, config=spec)
    assert wait_for(daemon, run_id, {"succeeded", "failed"}).run.state.value == "succeeded"
    logs = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "1", "--tail", "3")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [f"[default1]:rank one says {i}" for i in (2, 3, 4)]
    everyone = gpuctl("--node", daemon.address, "logs", run_id, "--tail", "3").stdout
    assert everyone.splitlines() == [f"[default0]:rank zero says {i}" for i in (47, 48, 49)]


def test_two_daemons_run_one_two_node_job(daemons: Callable[..., RunningDaemon]) -> None:
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    result = gpuctl(
        "--node",
        node0.address,
        "--node",
        node1.address,
        "launch",
        str(CPU_DDP),
        "--wait",
        "--set",
        FAST,
        "--set",
        "training.max_steps=20",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split()[1]
    s0, s1 = status(node0, run_id), status(node1, run_id)
    assert (s0.run.state.value, s1.run.state.value) == ("succeeded", "succeeded")
    assert (s0.run.node_rank, s1.run.node_rank) == (0, 1)
    assert [p.state.value if p.state else None for p in s0.parts] == ["succeeded", "succeeded"]
    # Same MASTER_PORT on both nodes, leased by node 0.
    assert s0.attempts[0].master_port == s1.attempts[0].master_port
    logs = gpuctl("--node", node0.address, "logs", run_id, "--rank", "3")
    assert logs.returncode == 0
    assert logs.stdout.splitlines()[0].startswith("[node1] [default1]:rank 3 of 4 on ")
    nothing_left(run_id)


def test_stopped_run_ended_the_same_as_an_uninterrupted_one(daemon: RunningDaemon) -> None:
    """Exact resume: stop at step k (a checkpoint of step k, nothing left running), resume
    from it at step k + 1, and the run ends with every step in its history once and the
    final weights of a straight run, whose history has every step once too."""
    steps = 150
    # Side by side, on GPUs of their own (the daemon has 8): the same seed, the same data.
    straight = launch(daemon, FAST, f"training.max_steps={steps}", "name=straight")
    interrupted = launch(daemon, FAST, f"training.max_steps={steps}", "name=interrupted")
    wait_for_step(daemon, interrupted, 20)
    assert gpuctl("--node", daemon.address, "stop", interrupted, timeout=120).returncode == 0
    stopped = status(daemon, interrupted)
    assert stopped.run.state.value == "stopped"
    checkpoint = stopped.run.last_checkpoint
    assert checkpoint is not None and checkpoint.step is not None
    assert Path(checkpoint.path).exists()
    assert checkpoint.step == stopped.run.last_step  # the step it stopped after
    assert checkpoint.step < steps // 2, "the stop must land well before the end to test resume"
    nothing_left(interrupted)
    assert "stopped at step" in gpuctl("--node", daemon.address, "logs", interrupted).stdout

    resumed = gpuctl("--node", daemon.address, "--json", "resume", interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["run"]["attempt"] == 2
    wait_for(daemon, interrupted, {"succeeded"})
    logs = gpuctl("--node", daemon.address, "logs", interrupted, "--rank", "0").stdout
    assert f"resumed from {checkpoint.path} at step {checkpoint.step + 1}" in logs
    assert status(daemon, interrupted).attempts[-1].resume_from == checkpoint.path
    # No step missing or twice in the history, each under the attempt that made it.
    history = metrics(daemon, interrupted)
    assert steps_by_attempt(history) == {
        1: list(range(checkpoint.step + 1)),
        2: list(range(checkpoint.step + 1, steps)),
    }
    assert history["resumed_at"] == [checkpoint.step + 1]

    wait_for(daemon, straight, {"succeeded"})
    history = metrics(daemon, straight)
    assert steps_by_attempt(history) == {1: list(range(steps))}
    assert all("loss" in row["values"] for row in history["rows"])
    table = gpuctl("--node", daemon.address, "metrics", straight).stdout.splitlines()
    assert table[0].split()[:2] == ["ATTEMPT", "STEP"] and "LOSS" in table[0]
    assert len(table) == 1 + steps  # a header and one row per step
    a = torch.load(Path(daemon.state_dir, "runs", straight, "final.pt"))
    b = torch.load(Path(daemon.state_dir, "runs", interrupted, "final.pt"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from a straight run"


def test_killed_rank_fails_the_run_on_both_nodes(daemons: Callable[..., RunningDaemon]) -> None:
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    run_id = launch(
        node0, FAST, "training.max_steps=100000", "nproc_per_node=1",
        nodes=(node0.address, node1.address),
    )  # fmt: skip
    wait_for_step(node0, run_id, 3)
    killed_at = time.monotonic()
    kill_rank(run_id, 1)  # node 1's rank
    s0 = wait_for(node0, run_id, {"failed"}, timeout=60)
    s1 = wait_for(node1, run_id, {"failed", "stopped"}, timeout=60)
    took = time.monotonic() - killed_at
    assert took < 30, f"failure took {took:.1f}s to settle"
    # The cause is the killed rank, named with its node, not its peers' connection errors.
    assert (s0.run.reason or "").startswith("rank 1 on node n1: killed by SIGKILL (signal, ")
    assert s0.run.cause is not None and s0.run.cause.kind is CauseKind.SIGNAL
    assert s1.run.state.value in ("failed", "stopped")
    nothing_left(run_id)


def test_restart_recovers_a_killed_rank_from_the_last_checkpoint(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon,
        FAST,
        "training.max_steps=120",
        "checkpoint.every_steps=10",
        "restart.max_attempts=1",
        "restart.backoff_s=0.5",
    )
    wait_for_step(daemon, run_id, 25)
    kill_rank(run_id, 1)
    s = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=180)
    assert s.run.state.value == "succeeded", s.run.reason
    assert (s.run.attempt, s.run.restarts) == (2, 1)
    resumed_from = s.attempts[1].resume_from
    assert resumed_from is not None and "step_000000" in resumed_from
    assert s.attempts[0].state.value == "failed"
    first = s.attempts[0]
    # From torchrun; if not, the end of what the node read it from says why.
    assert first.reason == "rank 1: killed by SIGKILL (signal)", AttemptLog.of(
        first.attempt_dir
    ).tail_text(4096)
    nothing_left(run_id)


def test_daemon_killed_mid_run_readopts_and_the_run_succeeds(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    first = daemons(node="n0")
    run_id = launch(first, FAST, "training.max_steps=150")
    wait_for_step(first, run_id, 5)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    time.sleep(1.0)  # the run goes on without its daemon
    control_port = int(first.address.rsplit(":", 1)[1])
    events_port = int(first.events.rsplit(":", 1)[1])
    second = daemons(
        node="n0", state_dir=first.state_dir, control_port=control_port, events_port=events_port
    )
    assert "re-adopted" in second.log()
    s = wait_for(second, run_id, {"succeeded", "failed"}, timeout=180)
    assert s.run.state.value == "succeeded", s.run.reason
    assert any(e.kind == "adopt" for e in s.events)
    nothing_left(run_id)


def test_bad_config_is_refused_before_anything_starts(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscript: t.py\ntraning: {}\n")
    result = gpuctl("--node", daemon.address, "launch", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"gpuctl: error: {bad}: traning: unknown key (did you mean 'training'?)"
    )
    listed = gpuctl("--node", daemon.address, "--json", "ps")
    assert json.loads(listed.stdout)["runs"] == []


def test_run_commands_with_unknown_runs_fail_in_one_line(daemon: RunningDaemon) -> None:
    for verb in ("status", "stop", "resume", "logs"):
        result = gpuctl("--node", daemon.address, verb, "no-such-run")
        assert result.returncode == 1, (verb, result.stderr)
        assert result.stderr.strip() == f"gpuctl: error: no run 'no-such-run' on {daemon.address}"


def test_free_port_is_never_shared_by_two_runs(daemon: RunningDaemon, tmp_path: Path) -> None:
    holder = holder_spec(tmp_path)  # torchrun runs whose ranks only hold: no torch in them
    a = launch(daemon, "name=a", config=holder)
    b = launch(daemon, "name=b", config=holder)
    pa = status(daemon, a).attempts[0].master_port
    pb = status(daemon, b).attempts[0].master_port
    assert pa != pb
    for run_id in (a, b):
        assert (
            gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0
        )
        nothing_left(run_id)


def test_simulated_gpus_carry_the_ranks_of_a_running_run(daemon: RunningDaemon) -> None:
    # Unpaced: a simulated GPU's utilization is its rank's CPU, and FAST's paced ranks idle.
    run_id = launch(
        daemon, "args=[--width, '128', --depth, '2', --log-every, '5']", "training.max_steps=100000"
    )
    wait_for_step(daemon, run_id, 3)
    pids = {p.pid for p in ranks_of(run_id).values()}
    client = daemon.client()
    deadline = time.monotonic() + 20
    busy: list[int] = []
    while time.monotonic() < deadline:
        gpus = client.node_hw().gpus
        busy = [g.index for g in gpus if g.processes and (g.utilization_gpu_pct or 0) > 20]
        if busy == [0, 1]:
            break
        time.sleep(0.3)
    assert busy == [0, 1], "local ranks 0 and 1 should load simulated GPUs 0 and 1"
    on_gpus = {p.pid for g in client.node_hw().gpus for p in g.processes or []}
    assert on_gpus == pids
    assert gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0
    nothing_left(run_id)


def test_an_abort_at_exit_after_training_finished_is_reported_for_what_it_is(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    spec = tmp_path / "abort.yaml"
    spec.write_text(
        f"name: abort\nnproc_per_node: 2\nbackend: gloo\nworkdir: {ROOT}\n"
        "script: tests/support/abort_at_exit.py\nrestart:\n  max_attempts: 2\n"
    )
    run_id = launch(daemon, config=spec)
    s = wait_for(daemon, run_id, {"failed", "succeeded"})
    assert s.run.state.value == "failed"
    reason = s.attempts[0].reason or ""
    assert "training finished, but rank 1 aborted at interpreter exit (SIGABRT)" in reason
    assert s.attempts[0].exit is not None and s.attempts[0].exit.teardown_abort
    assert s.run.attempt == 1  # finished training is not restarted
