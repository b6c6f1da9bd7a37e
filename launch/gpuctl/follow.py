"""Following a run until it ends: a progress line for people, exit codes for scripts."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import click

from gpud.model.run import RunState, steps_text
from gpud.wire.client import ClientError
from gpud.wire.run_messages import RunStatus, RunSummary
from launch.gpuctl.context import EXIT_FAILED, EXIT_OK, Ctl
from launch.gpuctl.runref import FoundRun, refresh

BAR_WIDTH = 24
POLL_S = 0.5


def progress_line(run: RunSummary) -> str:
    done = run.steps_done
    total = run.max_steps
    if done is not None and total:
        filled = int(min(1.0, done / total) * BAR_WIDTH)
        bar = "█" * filled + "░" * (BAR_WIDTH - filled)
        where = f"[{bar}] step {steps_text(done, total)}"
    elif done is not None:
        where = f"step {steps_text(done, total)}"
    else:
        where = "waiting for the first step"
    loss = run.last_values.get("loss")
    loss_text = f"  loss {loss:.4f}" if loss is not None else ""
    return f"{run.id}  {run.state.value:<9} attempt {run.attempt}  {where}{loss_text}"


def outcome_line(run: RunSummary) -> str:
    """How the run ended; for a known failure, a second line says what to do about it."""
    line = f"{run.id} {run.state.value}" + (f": {run.reason}" if run.reason else "")
    hint = run.cause.hint if run.cause is not None else None
    if run.state is RunState.FAILED and hint:
        line += f"\nhint: {hint}"
    return line


def follow(
    ctl: Ctl,
    run: FoundRun,
    quiet: bool = False,
    watch: Callable[[RunStatus], None] | None = None,
) -> int:
    """Poll until the run ends; prints progress (not with --json). 0 if it succeeded.
    `watch` sees every status read, the last one included."""
    tty = sys.stderr.isatty() and not ctl.json and not quiet
    last_printed = ""
    unreachable_since: float | None = None
    status: RunStatus = run.status
    while True:
        try:
            status = refresh(ctl, run)
            unreachable_since = None
        except ClientError as exc:
            # A daemon restarting is not the end of the run: wait a while for it.
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > max(30.0, ctl.timeout * 3):
                click.echo(f"gpuctl: error: lost the run's nodes: {exc}", err=True)
                return EXIT_FAILED
            time.sleep(1.0)
            continue
        summary = status.run
        if watch is not None:
            watch(status)
        line = progress_line(summary)
        if not ctl.json and not quiet and line != last_printed:
            if tty:
                click.echo("\r" + line.ljust(len(last_printed)), nl=False, err=True)
            else:
                click.echo(line, err=True)
            last_printed = line
        if summary.state.terminal:
            break
        time.sleep(POLL_S)
    if tty:
        click.echo("", err=True)
    return EXIT_OK if status.run.state is RunState.SUCCEEDED else EXIT_FAILED
