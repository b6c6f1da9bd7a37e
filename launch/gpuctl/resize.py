"""`gpuctl resize RUN`: an elastic run's next attempt on every node healthy now.

An elastic run that lost a node goes on with fewer (gpud.runs.multinode.elastic) and does not grow
back by itself: a node that answers again, or a spare freed since, joins at the run's next
attempt boundary, and growing back costs a restart, so it is asked for: resize stops the
run with its checkpoint handshake, then resumes it, and node 0 starts the attempt on every
node that can take part (up to `elastic.max_nodes`)."""

from __future__ import annotations

import sys

import click

from gpud.model.run import RunState
from gpud.wire.client import Client, ClientError
from gpud.wire.protocol import RUN_RESUME
from gpud.wire.run_messages import ResumeRequest, RunSummary, StopRequest
from launch.gpuctl.completion import run_argument
from launch.gpuctl.context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    START_TIMEOUT_S,
    Ctl,
    exit_code_for,
    fail,
    json_option,
)
from launch.gpuctl.follow import follow
from launch.gpuctl.output import emit_json
from launch.gpuctl.runref import find_run
from launch.gpuctl.runs import ask_to_stop, nodes_text


@click.command("resize")
@run_argument
@json_option
@click.pass_obj
def resize_command(ctl: Ctl, run: str) -> None:
    """Start an elastic RUN's next attempt on every node that is healthy now: it stops
    with its checkpoint, then resumes there (a node back since it was left out, a spare)."""
    found = find_run(ctl, run)
    summary = found.status.run
    if not summary.elastic:
        fail(f"{found.id} is not elastic: it always runs on all its nodes", EXIT_USAGE)
    if not summary.state.terminal:
        errors = ask_to_stop(ctl, found, StopRequest(run=found.id))
        if errors and len(errors) == len(found.nodes):
            fail(str(errors[0]), exit_code_for(errors[0]))
        follow(ctl, found, quiet=True)
        if found.status.run.state is not RunState.STOPPED:
            fail(f"{found.id} did not stop: {found.status.run.state.value}", EXIT_FAILED)
    before = found.status.run
    try:
        with Client(found.coordinator, timeout_s=max(ctl.timeout, START_TIMEOUT_S)) as client:
            after = client.call(RUN_RESUME, ResumeRequest(run=found.id))
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(after, RunSummary)
    if ctl.json:
        emit_json({"run": after})
    elif after.state is RunState.QUEUED:
        click.echo(f"{after.id} is {after.state_label}: {after.reason}")
    else:
        click.echo(
            f"resized {after.id}: attempt {after.attempt} on {nodes_text(after)} node(s)"
            f" (attempt {before.attempt} had {nodes_text(before)})"
        )
    sys.exit(EXIT_OK)
