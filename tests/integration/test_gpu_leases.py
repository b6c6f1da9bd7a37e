"""Shared GPU boxes: each run gets its own GPUs (issue 9), on a real daemon with 8
simulated GPUs, real torchrun and real gloo ranks.

What a user sees: the CUDA_VISIBLE_DEVICES in each rank's environment, the GPUs in
`gpuctl status`, the refusal (exit 1, one line naming who holds the GPUs and how many are
free), and leases that outlive a `kill -9` of the daemon.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.model.run import RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    FAST,
    ROOT,
    force_stop,
    holder_spec,
    launch,
    nothing_left,
    ranks_of,
    status,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

LONG = "training.max_steps=100000"
Daemons = Callable[..., RunningDaemon]


def visible_devices(run_id: str) -> set[str]:
    """CUDA_VISIBLE_DEVICES as every rank of the run has it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ranks = ranks_of(run_id)
        if len(ranks) == 2:
            return {proc.environ().get("CUDA_VISIBLE_DEVICES", "") for proc in ranks.values()}
        time.sleep(0.2)
    raise AssertionError(f"the ranks of {run_id} never showed up")


def refused(daemon: RunningDaemon, *sets: str) -> str:
    args = ["--node", daemon.address, "launch", str(ROOT / "config/examples/cpu-ddp.yaml")]
    for s in sets:
        args += ["--set", s]
    result = gpuctl(*args)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process outside gpud, as someone's notebook would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_two_runs_get_disjoint_gpus_and_a_third_is_refused_naming_the_holders(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    holder = holder_spec(tmp_path)  # runs that only hold their GPUs: no torch in their ranks
    first = launch(daemon, "gpus=4", config=holder)
    second = launch(daemon, "gpus=4", config=holder)
    try:
        assert visible_devices(first) == {"0,1,2,3"}
        assert visible_devices(second) == {"4,5,6,7"}
        assert status(daemon, first).run.gpus == [0, 1, 2, 3]
        assert [a.gpus for a in status(daemon, second).attempts] == [[4, 5, 6, 7]]
        line = refused(daemon, "gpus=1")
        assert line == (
            f"gpuctl: error: {daemon.address}: no GPUs for cpu-ddp on node0: needs 1 GPU(s), "
            f"0 free: GPU 0-3 held by run {first} (holder); GPU 4-7 held by run {second} "
            "(holder) [unavailable]"
        )
        force_stop(daemon, first)
        assert status(daemon, first).run.gpus == []  # an ended run holds nothing
        third = launch(daemon, "gpus=4", config=holder)  # gets what the first gave back
        assert visible_devices(third) == {"0,1,2,3"}
        force_stop(daemon, third)
    finally:
        gpuctl("--node", daemon.address, "stop", second, "--force")
    wait_for(daemon, second, {"stopped"}, timeout=60)


def test_a_foreign_process_keeps_its_gpu_out_of_every_lease(
    daemons: Daemons, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    daemon = daemons(extra=("--simulate-foreign", f"2:{sleeper.pid}"))
    line = refused(daemon, "gpus=[2]")
    assert line.startswith(
        f"gpuctl: error: {daemon.address}: no GPUs for cpu-ddp on node0: needs 1 GPU(s), 7 free: "
        f"GPU 2 held by pid {sleeper.pid} (python"
    ), line
    assert line.endswith(") outside gpud [unavailable]"), line
    run_id = launch(daemon, "gpus=4", config=holder_spec(tmp_path))
    try:
        assert visible_devices(run_id) == {"0,1,3,4"}
        report = gpuctl("--node", daemon.address, "hw")
        assert report.returncode == 0, report.stderr
        rows = {
            line.split()[0]: line
            for line in report.stdout.splitlines()
            if line[:1].isdigit() and "GPU-" in line
        }
        assert all(rows[i].endswith(f"{run_id} (holder)") for i in "0134"), rows
        assert rows["2"].endswith(") outside gpud") and f"pid {sleeper.pid} (" in rows["2"]
        assert all(rows[i].endswith(" -") for i in "567"), rows
    finally:
        force_stop(daemon, run_id)
    sleeper.kill()
    sleeper.wait()
    with daemon.client() as client:
        until("GPU 2 without the foreign process", lambda: not client.node_hw().gpus[2].processes)
    run_id = launch(daemon, FAST, "training.max_steps=20", "gpus=[2]")
    assert visible_devices(run_id) == {"2"}
    assert wait_for(daemon, run_id, {"succeeded", "failed"}).run.state is RunState.SUCCEEDED


def test_leases_survive_a_daemon_kill_and_no_gpu_is_leased_twice(daemons: Daemons) -> None:
    daemon = daemons()
    first = launch(daemon, FAST, LONG, "gpus=4")
    wait_for_step(daemon, first, 3)
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)
    again = daemons(
        state_dir=daemon.state_dir,
        control_port=int(daemon.address.rsplit(":", 1)[1]),
        events_port=int(daemon.events.rsplit(":", 1)[1]),
    )
    try:
        assert "re-adopted" in again.log()
        assert status(again, first).run.gpus == [0, 1, 2, 3]
        second = launch(again, FAST, LONG, "gpus=4")
        assert visible_devices(second) == {"4,5,6,7"}
        line = refused(again, "gpus=[3]")
        assert f"GPU 3 held by run {first} (cpu-ddp)" in line
        force_stop(again, second)
    finally:
        gpuctl("--node", again.address, "stop", first, "--force")
    wait_for(again, first, {"stopped"}, timeout=60)
    nothing_left(first)


def test_resume_takes_gpus_again_and_is_refused_while_they_are_busy(
    daemon: RunningDaemon,
) -> None:
    first = launch(daemon, FAST, LONG, "gpus=all")
    wait_for_step(daemon, first, 3)
    force_stop(daemon, first)
    other = launch(daemon, FAST, LONG, "gpus=1")
    try:
        result = gpuctl("--node", daemon.address, "resume", first)
        assert result.returncode == 1, result.stdout
        assert "needs 8 GPU(s), 7 free: GPU 0 held by run" in result.stderr
        assert status(daemon, first).run.state is RunState.STOPPED  # nothing half started
    finally:
        force_stop(daemon, other)
    result = gpuctl("--node", daemon.address, "resume", first)
    assert result.returncode == 0, result.stderr
    assert visible_devices(first) == {"0,1,2,3,4,5,6,7"}
    assert status(daemon, first).attempts[-1].gpus == list(range(8))
    force_stop(daemon, first)


def test_the_deepspeed_launcher_puts_its_ranks_on_the_leased_gpus(daemon: RunningDaemon) -> None:
    """A real `deepspeed` launcher run: --include, not CUDA_VISIBLE_DEVICES, picks its GPUs."""
    run_id = launch(
        daemon,
        "launcher=deepspeed",
        "gpus=[2, 3]",
        "args=[--width, '64', --depth, '2']",
        LONG,
        config=ROOT / "config/examples/cpu-deepspeed-zero2.yaml",
    )
    wait_for_step(daemon, run_id, 3)
    assert visible_devices(run_id) == {"2,3"}
    assert status(daemon, run_id).run.gpus == [2, 3]
    result = gpuctl("--node", daemon.address, "stop", run_id)
    assert result.returncode == 0, result.stderr
    s = wait_for(daemon, run_id, {"stopped", "failed"}, timeout=60)
    assert s.run.state is RunState.STOPPED and s.run.gpus == []
    assert s.run.last_checkpoint is not None  # the launcher passed the stop on to the ranks
    nothing_left(run_id)


# --------------------------------------------------------------------------- dry runs, specs


def dry_run(daemon: RunningDaemon, config: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = ["--node", daemon.address, "launch", str(ROOT / "config/examples" / config), "--dry-run"]
    for s in sets:
        args += ["--set", s]
    return gpuctl(*args)


def test_a_dry_run_shows_the_gpus_and_the_exact_variables(daemon: RunningDaemon) -> None:
    torchrun = dry_run(daemon, "cpu-ddp.yaml", "gpus=[1, 3]")
    assert torchrun.returncode == 0, torchrun.stderr
    assert "# GPUs: 1,3" in torchrun.stdout
    assert "CUDA_VISIBLE_DEVICES=1,3" in torchrun.stdout
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in torchrun.stdout
    deepspeed = dry_run(daemon, "deepspeed-zero2-offload.yaml", "gpus=[2, 3]")
    assert deepspeed.returncode == 0, deepspeed.stderr
    assert "--include=node0:2,3" in deepspeed.stdout
    assert "--num_gpus" not in deepspeed.stdout
    assert "CUDA_VISIBLE_DEVICES" not in deepspeed.stdout  # DeepSpeed's runner sets it
    # A dry run leases nothing.
    assert json.loads(gpuctl("--node", daemon.address, "--json", "ps").stdout)["runs"] == []


@pytest.mark.parametrize(
    ("gpus", "exit_code", "message"),
    [
        ("[1, 1]", 2, "gpus: GPU 1 is listed twice"),
        ("[0, 8]", 2, "node0: gpus: the node has no GPU 8 (it has GPUs 0-7)"),
        ("9", 2, "node0: gpus: 9 GPU(s) asked for, the node has 8"),
    ],
)
def test_gpus_the_node_cannot_give_are_refused_before_anything_starts(
    daemon: RunningDaemon, gpus: str, exit_code: int, message: str
) -> None:
    args = ["--node", daemon.address, "launch", str(ROOT / "config/examples/cpu-ddp.yaml")]
    result = gpuctl(*args, "--set", f"gpus={gpus}")
    assert result.returncode == exit_code, (result.stdout, result.stderr)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert json.loads(gpuctl("--node", daemon.address, "--json", "ps").stdout)["runs"] == []


def test_a_node_without_gpus_leases_nothing(daemons: Daemons, tmp_path: Path) -> None:
    cpu = daemons(simulate_gpus=None)
    run_id = launch(cpu, FAST, "training.max_steps=20")
    s = wait_for(cpu, run_id, {"succeeded", "failed"})
    assert s.run.state is RunState.SUCCEEDED and s.attempts[-1].gpus == []


def test_a_gpu_that_fails_its_preflight_is_left_out_of_the_attempt(
    daemons: Daemons, tmp_path: Path
) -> None:
    """Issue 21 §2: a free GPU whose NVML reading says it would start badly (here an XID
    92, a high single-bit ECC rate: not fatal, not the application's) is left out of the
    attempt with an event that says why, a launch that names it is refused saying why, and
    `preflight: false` takes it."""
    xids = tmp_path / "xids"
    daemon = daemons(simulate_gpus=4, extra=("--simulate-xid-file", str(xids)))
    xids.write_text("0:92\n")

    def xid_seen() -> bool:
        done = gpuctl("--node", daemon.address, "--json", "hw")
        return bool(json.loads(done.stdout)["nodes"][0]["gpus"][0]["xid"]["total"])

    until("GPU 0's XID in the snapshot", xid_seen, timeout=10)
    holder = holder_spec(tmp_path)  # runs that only hold their GPUs: no torch in their ranks
    run_id = launch(daemon, "gpus=2", config=holder)
    s = status(daemon, run_id)
    assert s.attempts[0].gpus == [1, 2], s.attempts[0]
    assert [e.message for e in s.events if e.kind == "preflight"] == [
        "GPU 0 of node0 left out of attempt 1: it failed its preflight: XID 92 (high"
        " single-bit ECC error rate) in the last 5 min"
    ]
    line = refused(daemon, "gpus=[0]")
    assert "GPU 0" in line and "failed its preflight: XID 92" in line, line
    force_stop(daemon, run_id)
    unchecked = launch(daemon, "gpus=[0]", "preflight=false", config=holder)
    assert status(daemon, unchecked).attempts[0].gpus == [0]
    force_stop(daemon, unchecked)
