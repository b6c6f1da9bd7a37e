"""`gpuctl ps | status | stop | resume | logs` for runs under Slurm (see slurm_jobs)."""

from __future__ import annotations

import os
import sys
import time

import click

from gpud.model.run import RunState, steps_text
from gpud.wire.run_messages import RunSummary
from launch import slurm_states
from launch.gpuctl import slurm_jobs
from launch.gpuctl.context import EXIT_FAILED, EXIT_OK, Ctl, fail
from launch.gpuctl.output import emit_json

#: How long `gpuctl stop` waits for the job to end (the trainers checkpoint first).
STOP_WAIT_S = 300.0


def summaries(active: bool) -> list[RunSummary]:
    """Every Slurm run gpuctl submitted from here; a run Slurm cannot describe is one
    stderr line, and the others are still listed."""
    found = []
    for run in slurm_jobs.known_runs():
        try:
            summary = run.summary()
        except slurm_jobs.SlurmError as exc:
            click.echo(f"gpuctl: error: {run.id}: {exc}", err=True)
            continue
        if not (active and summary.state.terminal):
            found.append(summary)
    return found


def with_progress(slurm: RunSummary, daemon: RunSummary) -> RunSummary:
    """A Slurm run's row: its state from Slurm (the truth), its progress from the daemon it
    reports to (live; the run's metrics.jsonl lags by a flush)."""
    if daemon.attached is None:
        return slurm
    fresher = (daemon.last_step or -1) >= (slurm.last_step or -1)
    return slurm.model_copy(
        update={
            "attached": daemon.attached,
            "last_step": daemon.last_step if fresher else slurm.last_step,
            "last_values": daemon.last_values if fresher else slurm.last_values,
        }
    )


def status(ctl: Ctl, run: slurm_jobs.SlurmRun) -> None:
    try:
        summary = run.summary()
    except slurm_jobs.SlurmError as exc:
        fail(str(exc), EXIT_FAILED)
    if ctl.json:
        emit_json({"run": summary, "slurm": {"jobs": run.jobs, "run_dir": str(run.run_dir)}})
        return
    loss = summary.last_values.get("loss")
    click.echo(f"{summary.id} ({summary.name}): {summary.state_label}, attempt {summary.attempt}")
    click.echo(f"  why:     {summary.reason}")
    if summary.state is RunState.FAILED and summary.cause is not None and summary.cause.hint:
        click.echo(f"  hint:    {summary.cause.hint}")
    click.echo(
        f"  step:    {steps_text(summary.steps_done, summary.max_steps)}"
        + (f"  loss {loss:.4f}" if loss is not None else "")
    )
    click.echo(f"  jobs:    {', '.join(str(j['job']) for j in run.jobs) or '-'}")
    click.echo(f"  files:   {run.run_dir}")


def stop(ctl: Ctl, run: slurm_jobs.SlurmRun, force: bool, no_wait: bool) -> None:
    try:
        state = run.state().state
        if state.terminal:
            fail(f"run {run.id} is already {state.value}", EXIT_FAILED)
        cancel = force or slurm_states.cancel_to_stop(state)
        job = slurm_jobs.stop(run, cancel=cancel)
    except slurm_jobs.SlurmError as exc:
        fail(str(exc), EXIT_FAILED)
    how = "cancelled" if cancel else "asked to checkpoint and stop"
    if no_wait:
        click.echo(f"{run.id}: Slurm job {job} {how}")
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        status = run.state()
        if status.state.terminal:
            click.echo(f"{run.id} {status.state.value}: {status.reason}")
            sys.exit(EXIT_OK)
        time.sleep(1.0)
    fail(f"{run.id}: Slurm job {job} has not ended after {STOP_WAIT_S:.0f} s", EXIT_FAILED)


def resume(ctl: Ctl, run: slurm_jobs.SlurmRun, checkpoint: str | None) -> None:
    """A new job for the run: the next attempt, from its newest checkpoint (or --from, made
    absolute here as for a gpud run: the job runs in another directory)."""
    try:
        status = run.state()
        state, attempt = status.state, status.attempt
        if not state.terminal:
            fail(f"run {run.id} is {state.value}: stop it before resuming", EXIT_FAILED)
        if state is RunState.SUCCEEDED:
            fail(f"run {run.id} succeeded: nothing to resume", EXIT_FAILED)
        if checkpoint is not None:
            checkpoint = os.path.abspath(checkpoint)
        job = slurm_jobs.submit(run, attempt_base=attempt + 1, resume_from=checkpoint)
    except slurm_jobs.SlurmError as exc:
        fail(str(exc), EXIT_FAILED)
    click.echo(f"resumed {run.id} as attempt {attempt + 1}: Slurm job {job}")


def logs(run: slurm_jobs.SlurmRun, tail: int | None) -> None:
    """Every node's launcher output of the latest attempt, node by node."""
    from gpud.runs.diagnosis.attempt_log import AttemptLog

    attempts = sorted(
        run.run_dir.glob("attempt-*"), key=lambda p: int(p.name.removeprefix("attempt-"))
    )
    if not attempts:
        fail(f"run {run.id} has no output yet", EXIT_FAILED)
    for node in sorted(attempts[-1].glob("node-*/output.log")):
        lines = AttemptLog(node).whole().decode(errors="replace").splitlines()
        for line in lines[-tail:] if tail else lines:
            click.echo(line)
