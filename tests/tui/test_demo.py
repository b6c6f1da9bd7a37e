"""`gpud demo`, the README's main command: daemon, CPU DDP run, then gputop — here without
a terminal, where it prints where everything is instead of opening gputop."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from gpud.commands.demo import gputop_argv, run_demo
from gpud.node.statedir import StateDir, held_by
from gpud.wire.client import Client, resolve_target
from tests.support.daemons import free_port
from tests.support.runs import FAST


@pytest.mark.slow
def test_demo_without_a_terminal_starts_everything_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "demo-state"
    control = f"tcp://127.0.0.1:{free_port()}"
    events = f"tcp://127.0.0.1:{free_port()}"
    address = control.removeprefix("tcp://")
    sets = ("training.max_steps=100000", FAST)
    try:
        # stdout is captured here, so not a TTY: the demo must not try to open gputop.
        run_demo(state, simulate_gpus=2, control=control, events=events, sets=sets)
        out = capsys.readouterr().out
        assert "Started gpud" in out and "Launched cpu-ddp-" in out
        run_id = out.split("Launched ", 1)[1].split(":", 1)[0]
        assert f"gputop --node {address} --run {run_id}" in out
        assert "No terminal here (stdin or stdout is not a TTY), so gputop is not opened" in out
        # Every hint runs as printed: an activated venv's bare name, else its path.
        hints = {
            label.strip(): words.split()[0]
            for label, _, words in (line.partition(":") for line in out.splitlines())
            if label.startswith("  ") and words.strip() and label.strip() != "the daemon"
        }
        assert len(hints) == 5, out
        for label, program in hints.items():
            assert shutil.which(program) or Path(program).is_file(), (label, program, out)
        with Client(resolve_target(address)) as client:
            assert client.run_status(run_id).run.state.value in ("starting", "running")
        # A second demo reuses the daemon and the run.
        run_demo(state, simulate_gpus=2, no_tui=True, control=control, events=events, sets=sets)
        again = capsys.readouterr().out
        assert "Using the running gpud" in again and f"demo run {run_id} is still going" in again
        assert "No terminal here" not in again  # --no-tui: asked for, nothing to explain
        assert gputop_argv(address, run_id)[1:] == ["-m", "tui", "--node", address, "--run", run_id]
        with Client(resolve_target(address)) as client:
            client.stop_run(run_id, force=True)
            deadline = time.monotonic() + 30
            while not client.run_status(run_id).run.state.terminal:
                assert time.monotonic() < deadline, "the demo run did not stop"
                time.sleep(0.2)
    finally:
        pid = held_by(StateDir(state).pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while held_by(StateDir(state).pid_file) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
