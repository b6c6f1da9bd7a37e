"""gputop in a real terminal (tmux), against a real daemon with a real run: the screen a
person sees, read back with `tmux capture-pane`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon
from tests.support.runs import FAST, launch, wait_for, wait_for_step

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(TMUX is None, reason="tmux is not installed: no real terminal to drive"),
]


class Terminal:
    """One tmux session on a private server, 120×40."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"gputop-test-{uuid.uuid4().hex[:8]}"
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"env {line} {shlex.join(command)}"
        self.tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "t", shell)

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        result = subprocess.run(
            [TMUX, "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def alive(self) -> bool:
        """Whether the pane's program still runs: tmux ends the session, and the server with
        it, once the program exits."""
        assert TMUX is not None
        result = subprocess.run(
            [TMUX, "-L", self.socket, "has-session", "-t", "t"], capture_output=True, timeout=30
        )
        return result.returncode == 0

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, *texts: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"{texts} never showed; the screen:\n{screen}")

    def close(self) -> None:
        subprocess.run([TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def terminal_factory() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def test_gputop_in_a_real_terminal_shows_the_fleet_and_a_run_and_stops_and_resumes_it(
    daemon: RunningDaemon, config_dir: Path, terminal_factory: list[Terminal]
) -> None:
    run_id = launch(daemon, "training.max_steps=100000", FAST)
    wait_for_step(daemon, run_id, 10, timeout=90)
    env = {
        "GPUD_CONFIG_DIR": str(config_dir),
        "PYTHONPATH": os.getcwd(),
        "TERM": "xterm-256color",
        "COLORTERM": "",  # truecolor is optional: draw with 256 colours
    }
    terminal = Terminal([sys.executable, "-m", "tui", "--node", daemon.address], env)
    terminal_factory.append(terminal)
    try:
        fleet = terminal.wait_for("1/1 nodes up", "8 GPUs", "node0", "sim", run_id)
        assert "online" in fleet or "● node0" in fleet
        terminal.keys(":")
        terminal.wait_for("jump to")
        terminal.keys("runs", "Enter")
        runs = terminal.wait_for("RUN", "STATE", run_id, "running")
        row = next(line for line in runs.splitlines() if line.startswith(run_id))
        assert "1×2" in row and "st/s" in row, runs
        terminal.keys("Enter")
        run = terminal.wait_for("cpu-ddp · running", "torchrun/gloo", "loss", "step ")
        assert any(0x2800 < ord(ch) <= 0x28FF for ch in run), "no braille loss curve"
        assert "health" in run
        # Stop, then resume, from the run screen: each asks first, naming the run.
        terminal.keys("s")
        confirm = terminal.wait_for("Stop run?", f"Stop run {run_id}", "node0")
        assert "× 2 processes" in confirm and "2 ranks in all" in confirm, confirm
        terminal.keys("y")
        terminal.wait_for("cpu-ddp · stopped", timeout=60)
        wait_for(daemon, run_id, {"stopped"}, timeout=30)
        terminal.keys("r")
        terminal.wait_for("Resume run?", run_id)
        terminal.keys("y")
        terminal.wait_for("cpu-ddp · running", "attempt 2", timeout=90)
        terminal.keys("Escape", "Escape")
        terminal.wait_for("Fleet", "node0")
        terminal.keys("q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and terminal.alive():
            time.sleep(0.2)
        assert not terminal.alive(), f"gputop still runs after q:\n{terminal.screen()}"
    finally:
        with_client_stop(daemon, run_id)


def with_client_stop(daemon: RunningDaemon, run_id: str) -> None:
    from gpud.wire.client import Client

    with Client(daemon.target()) as client:
        client.stop_run(run_id, force=True)
    wait_for(daemon, run_id, {"stopped", "failed", "succeeded"}, timeout=60)
