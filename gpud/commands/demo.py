"""`gpud demo`: the README's first command, the whole flow on a fresh machine.

1. Start `gpud serve` in the background (simulated GPUs where NVML finds none) and wait
   until it answers. A daemon that already holds the state dir is reused.
2. Launch the CPU DDP example (`config/examples/cpu-ddp.yaml`: two gloo processes, 1800
   steps, about a minute on two idle cores; `--steps N` for fewer) with `gpuctl launch`,
   unless one is already running.
3. Open gputop on it, in the same terminal (as a child process: gpud itself never imports
   Textual). Quitting gputop leaves the daemon and the run going.

Without a terminal (stdout is not a TTY) or with `no_tui`, it prints where everything is
and how to look at it, and exits. Running the demo twice is harmless.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from gpud.node.statedir import StateDir, held_by
from gpud.wire.client import Client, ClientError, resolve_target

DEMO_SIMULATED_GPUS = 8
READY_TIMEOUT_S = 30.0
DEMO_CONFIG = Path(__file__).resolve().parents[2] / "config" / "examples" / "cpu-ddp.yaml"
DEMO_CONTROL = "tcp://127.0.0.1:7711"
DEMO_EVENTS = "tcp://127.0.0.1:7712"


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


def active_demo_run(address: str, name: str) -> str | None:
    """The id of a run of the demo's config that is still going, if there is one."""
    try:
        with Client(resolve_target(address), timeout_s=5.0) as client:
            runs = client.runs(active_only=True).runs
    except ClientError:
        return None
    mine = [r for r in runs if r.name == name and r.node_rank == 0]
    return mine[0].id if mine else None


def launch_demo_run(address: str, config: Path, sets: tuple[str, ...] = ()) -> str:
    """`gpuctl launch` the demo config on the local daemon; returns the run id."""
    if not config.exists():
        raise click.ClickException(
            f"the demo config {config} is missing: run the demo from a clone of the repository"
        )
    args = [sys.executable, "-m", "launch.gpuctl", "--node", address, "--json", "launch"]
    args.append(str(config))
    for item in sets:
        args += ["--set", item]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        raise click.ClickException(f"could not launch the demo run: {why[-1] if why else '?'}")
    return str(json.loads(result.stdout)["run"]["id"])


def command(name: str) -> str:
    """How to type one of our commands here: its bare name when PATH finds this install's
    (an activated venv), else its path (`.venv/bin/gpuctl`), so every hint works as printed."""
    mine = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found is not None and Path(found).resolve() == mine.resolve():
        return name
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


def _still_going(address: str, run_id: str) -> bool:
    try:
        with Client(resolve_target(address), timeout_s=5.0) as client:
            return not client.run_status(run_id).run.state.terminal
    except ClientError:
        return True  # cannot tell: say what is most likely


def gputop_argv(address: str, run_id: str) -> list[str]:
    return [sys.executable, "-m", "tui", "--node", address, "--run", run_id]


def run_demo(
    state_dir: Path,
    simulate_gpus: int | None,
    no_tui: bool | None = None,
    control: str = DEMO_CONTROL,
    events: str = DEMO_EVENTS,
    config: Path = DEMO_CONFIG,
    sets: tuple[str, ...] = (),
) -> None:
    """The whole flow; `no_tui=None` means: open gputop when stdout is a terminal."""
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    open_tui = interactive if no_tui is None else (not no_tui and interactive)
    address = control.removeprefix("tcp://")
    if simulate_gpus is None and not has_real_gpus():
        simulate_gpus = DEMO_SIMULATED_GPUS
        click.echo(f"No NVIDIA GPU here: the daemon serves {simulate_gpus} simulated GPUs.")
    pid, started = start_background_daemon(state_dir, control, events, simulate_gpus)
    click.echo(
        f"{'Started' if started else 'Using the running'} gpud (pid {pid}, state {state_dir})."
    )
    name = config.stem
    run_id = active_demo_run(address, name)
    if run_id is None:
        run_id = launch_demo_run(address, config, sets)
        click.echo(f"Launched {run_id}: {config.name}, 2 gloo processes on the CPU.")
    else:
        click.echo(f"The demo run {run_id} is still going; showing it.")
    gputop = gputop_argv(address, run_id)
    top, ctl, gpud = command("gputop"), command("gpuctl"), command("gpud")
    if not open_tui:
        click.echo("")
        if not interactive and not no_tui:
            click.echo("No terminal here (stdin or stdout is not a TTY), so gputop is not"
                       " opened; from a terminal:")  # fmt: skip
        click.echo(f"  watch it:        {top} --node {address} --run {run_id}")
        click.echo(f"  or, plain text:  {ctl} --node {address} status {run_id}")
        click.echo(f"  its logs:        {ctl} --node {address} logs {run_id} -f")
        click.echo(f"  stop / resume:   {ctl} --node {address} stop|resume {run_id}")
        click.echo(f"  the daemon:      {state_dir}/gpud.log")
        click.echo(f"  stop everything: {gpud} stop --state-dir {state_dir} --runs")
        click.echo("                   (without --runs, runs keep going under their shims)")
        return
    click.echo("Opening gputop: ? for help, s/r stop and resume the run, q quits.")
    sys.stdout.flush()
    # gputop in its own process (gpud never imports Textual), in this terminal.
    code = subprocess.run(gputop, check=False).returncode
    going = (
        f"The daemon and {run_id} keep going"
        if _still_going(address, run_id)
        else (f"{run_id} has ended; the daemon keeps going")
    )
    click.echo(f"{going}: `{top} --node {address}` to look again, `{ctl} --node {address} ps`")
    click.echo(f"for a list, `{gpud} stop --state-dir {state_dir} --runs` to stop the runs and")
    click.echo("the daemon (a plain `gpud stop` leaves runs going; the next gpud adopts them).")
    if code not in (0, None):
        sys.exit(code)
