"""`gpud demo`: the README's first command. Start a local daemon and show what it sees.

It starts `gpud serve` in the background (simulated GPUs where NVML finds none), waits
until the daemon answers, and prints the hardware report. A daemon that already holds the
state dir is reused, so running the demo twice is harmless.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

from gpud.client import Client, ClientError, resolve_target
from gpud.statedir import StateDir, held_by

DEMO_SIMULATED_GPUS = 8
READY_TIMEOUT_S = 30.0


def has_real_gpus() -> bool:
    from gpud.hardware.nvml import NvmlSampler, NvmlUnavailable

    try:
        NvmlSampler.open().close()
    except NvmlUnavailable:
        return False
    return True


def _wait_until_ready(address: str, proc: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = "it did not start"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise click.ClickException(
                f"gpud exited with {proc.returncode}: {tail[0] if tail else 'see ' + str(log)}"
            )
        try:
            with Client(resolve_target(address), timeout_s=1.0) as client:
                client.node_info()
            return
        except ClientError as exc:
            last_error = str(exc)
        time.sleep(0.1)
    raise click.ClickException(f"gpud did not answer within {READY_TIMEOUT_S:g}s: {last_error}")


def start_background_daemon(
    state_dir: Path, control: str, events: str, simulate_gpus: int | None
) -> tuple[int, bool]:
    """Ensure a daemon serves `state_dir`; returns (pid, started_now)."""
    state = StateDir(state_dir)
    running = held_by(state.pid_file)
    if running is not None:
        return running, False
    state.root.mkdir(parents=True, exist_ok=True)
    log = state.root / "gpud.log"
    args = [
        sys.executable,
        "-m",
        "gpud",
        "serve",
        "--state-dir",
        str(state.root),
        "--control",
        control,
        "--events",
        events,
    ]
    if simulate_gpus:
        args += ["--simulate-gpus", str(simulate_gpus)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this command and its terminal
        )
    _wait_until_ready(control, proc, log)
    return proc.pid, True


def run_demo(state_dir: Path, simulate_gpus: int | None) -> None:
    control, events = "tcp://127.0.0.1:7711", "tcp://127.0.0.1:7712"
    if simulate_gpus is None and not has_real_gpus():
        simulate_gpus = DEMO_SIMULATED_GPUS
        click.echo(f"No NVIDIA GPU here: the daemon serves {simulate_gpus} simulated GPUs.")
    pid, started = start_background_daemon(state_dir, control, events, simulate_gpus)
    click.echo(
        f"{'Started' if started else 'Using the running'} gpud (pid {pid}, state {state_dir})."
    )
    click.echo("")
    result = subprocess.run(
        [sys.executable, "-m", "launch.gpuctl", "--node", "127.0.0.1:7711", "hw"], check=False
    )
    click.echo("")
    click.echo("Next: `gpuctl nodes`, `gpuctl hw --json`; stop the daemon with `gpud stop`.")
    if result.returncode != 0:
        sys.exit(result.returncode)
