"""`gpud stop` with runs going: a plain stop leaves them to their shims and says so;
`--runs` stops them first. Real daemons, real runs (a one-process `python` launcher running
a sleeping script, so nothing heavy), simulated GPUs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from gpud.runs.process import procs
from tests.support.daemons import RunningDaemon
from tests.support.runs import launch, nothing_left, status, wait_for

pytestmark = pytest.mark.slow

SLEEPER = """\
import signal, sys, time
if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("sleeping", flush=True)
while True:
    time.sleep(0.1)
"""


def sleeper(tmp_path: Path, *args: str) -> Path:
    """A run spec whose one process sleeps until it is signalled."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    spec = tmp_path / "sleeper.yaml"
    spec.write_text(
        f"name: sleeper\nlauncher: python\nnproc_per_node: 1\nworkdir: {tmp_path}\n"
        f"script: sleeper.py\nargs: {list(args)}\nstop_grace_s: 2\n"
    )
    return spec


def gpud_stop(daemon: RunningDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpud", "stop", "--state-dir", str(daemon.state_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def running_sleeper(daemon: RunningDaemon, tmp_path: Path, *args: str) -> tuple[str, int]:
    """Launch the sleeper and wait until it runs; returns (run id, shim pid)."""
    run_id = launch(daemon, config=sleeper(tmp_path, *args))
    wait_for(daemon, run_id, {"running"}, timeout=60)
    shim = status(daemon, run_id).attempts[-1].shim_pid
    assert shim is not None and procs.tagged(run_id)
    return run_id, shim


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def restart(daemons: Callable[..., RunningDaemon], old: RunningDaemon) -> RunningDaemon:
    return daemons(
        node=old.node,
        state_dir=old.state_dir,
        control_port=int(old.address.rsplit(":", 1)[1]),
        events_port=int(old.events.rsplit(":", 1)[1]),
    )


def test_plain_stop_leaves_a_run_going_and_says_how_to_stop_it(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    first = daemons(node="n0")
    run_id, shim = running_sleeper(first, tmp_path)
    result = gpud_stop(first)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"stopped gpud pid {first.proc.pid}",
        f"1 run keeps going under its shim: {run_id}",
        "gpud adopts it again when it starts; stop runs with `gpuctl stop <run>` while it "
        "runs, or with `gpud stop --runs`",
    ]
    assert first.proc.wait(timeout=5) == 0
    time.sleep(0.5)  # were the run signalled on the way out, it would be gone by now
    assert alive(shim) and procs.tagged(run_id), "a plain gpud stop must not stop runs"

    second = restart(daemons, first)
    assert status(second, run_id).run.state.value == "running"  # adopted again
    stopped = gpud_stop(second, "--runs")
    assert stopped.returncode == 0, stopped.stderr
    assert f"{run_id} stopped" in stopped.stdout
    assert second.proc.wait(timeout=5) == 0
    nothing_left(run_id)


def test_stop_runs_stops_every_run_then_the_daemon(daemon: RunningDaemon, tmp_path: Path) -> None:
    run_id, shim = running_sleeper(daemon, tmp_path)
    result = gpud_stop(daemon, "--runs")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"stopping 1 run: {run_id}"
    assert lines[1].startswith(f"{run_id} stopped")
    assert lines[2:] == [f"stopped gpud pid {daemon.proc.pid}"]
    assert daemon.proc.wait(timeout=5) == 0
    assert not alive(shim)
    nothing_left(run_id)


def test_stop_runs_with_no_runs_says_so(daemon: RunningDaemon) -> None:
    result = gpud_stop(daemon, "--runs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "no runs are going",
        f"stopped gpud pid {daemon.proc.pid}",
    ]
    assert daemon.proc.wait(timeout=5) == 0


def test_runs_that_do_not_end_in_time_keep_the_daemon_running(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    run_id, _ = running_sleeper(daemon, tmp_path, "--ignore-sigterm")
    result = gpud_stop(daemon, "--runs", "--runs-timeout", "1")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"gpud: error: 1 run did not end within 1s ({run_id}); gpud pid {daemon.proc.pid} "
        "keeps running to finish stopping them: see `gpuctl status <run>`, or "
        "`gpuctl stop <run> --force`"
    )
    assert daemon.proc.poll() is None
    assert status(daemon, run_id).run.state.value == "stopping"  # the daemon goes on with it
    with daemon.client() as client:
        client.stop_run(run_id, force=True)  # SIGKILL now, not 10 s after the SIGTERM
    assert wait_for(daemon, run_id, {"stopped"}, timeout=30)
    nothing_left(run_id)
    assert daemon.stop(signal.SIGTERM) == 0
