"""`gpuctl drain` and `gpuctl undrain`: an operator takes a node, or some of its GPUs, out
of service and puts them back (gpud.heal). Runs already there go on until they end, unless
`--stop-runs`, which stops each through its node 0 with its checkpoint, as `gpuctl stop`."""

from __future__ import annotations

import sys

import click

from gpud.model.run import RunState
from gpud.security.known_nodes import load_known_nodes
from gpud.wire.client import Client, ClientError, NodeTarget, resolve_target
from gpud.wire.node_messages import DrainReply, DrainRequest, UndrainRequest
from gpud.wire.protocol import NODE_DRAIN, NODE_UNDRAIN
from gpud.wire.run_messages import StopRequest
from launch.gpuctl.context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Ctl,
    exit_code_for,
    fail,
    json_option,
)
from launch.gpuctl.follow import follow
from launch.gpuctl.output import emit_json
from launch.gpuctl.runref import find_run
from launch.gpuctl.runs import ask_to_stop

node_argument = click.argument("node", metavar="NODE")
gpu_option = click.option(
    "--gpu", "gpus", type=click.IntRange(min=0), multiple=True,
    help="A GPU index; repeatable [the whole node].",
)  # fmt: skip


def target_of_node(ref: str) -> NodeTarget:
    """NODE: a name from `gpuctl nodes`, or a HOST:PORT; anything else exits 2."""
    try:
        known = load_known_nodes()
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    named = [n for n in known.nodes if n.name == ref]
    address = named[0].control if named else ref
    try:
        return resolve_target(address, known)
    except ClientError as exc:
        names = ", ".join(sorted(n.name for n in known.nodes if n.name)) or "none known"
        fail(f"{ref}: {exc} (nodes by name: {names})", exit_code_for(exc))


def _render(reply: DrainReply) -> list[str]:
    lines = []
    if reply.drained is not None:
        lines.append(f"{reply.node}: drained by {reply.drained.by}: {reply.drained.reason}")
    else:
        lines.append(f"{reply.node}: takes new runs")
    for gpu in reply.gpus:
        kind = "quarantined" if gpu.hold.kind == "quarantine" else f"drained by {gpu.hold.by}"
        lines.append(f"  GPU {gpu.index} {kind}: {gpu.hold.reason}")
    lines += [f"  note: {note}" for note in reply.notes]
    return lines


@click.command("drain")
@node_argument
@gpu_option
@click.option("--reason", required=True, help="Why: kept with the drain, shown everywhere.")
@click.option(
    "--stop-runs", is_flag=True, help="Also stop the runs on it, each with its checkpoint."
)
@json_option
@click.pass_obj
def drain_command(ctl: Ctl, node: str, gpus: tuple[int, ...], reason: str, stop_runs: bool) -> None:
    """No new runs or attempts on NODE (or on its GPUs --gpu N ...): runs there go on until
    they end, or --stop-runs. Operators only; audited."""
    target = target_of_node(node)
    try:
        with Client(target, timeout_s=ctl.timeout) as client:
            reply = client.call(NODE_DRAIN, DrainRequest(gpus=list(gpus) or None, reason=reason))
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(reply, DrainReply)
    stopped = _stop_runs(ctl, target, reply.runs) if stop_runs else {}
    if ctl.json:
        emit_json({"drain": reply, "stopped": stopped})
    else:
        for line in _render(reply):
            click.echo(line)
        for run_id in reply.runs:
            click.echo(
                f"  {run_id}: " + (stopped.get(run_id) or "goes on until it ends (--stop-runs)")
            )
    failed = any(not state.startswith("stopped") for state in stopped.values())
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _stop_runs(ctl: Ctl, target: NodeTarget, runs: list[str]) -> dict[str, str]:
    """Stop each run through its node 0 (checkpoint handshake), wait for it: run → outcome."""
    here = Ctl(nodes=[target.control.removeprefix("tcp://")], json=True, timeout=ctl.timeout)
    outcome = {}
    for run_id in runs:
        found = find_run(here, run_id)
        errors = ask_to_stop(here, found, StopRequest(run=run_id))
        if errors and len(errors) == len(found.nodes):
            outcome[run_id] = f"not stopped: {errors[0]}"
            continue
        follow(here, found, quiet=True)
        state = found.status.run.state
        outcome[run_id] = (
            "stopped with its checkpoint" if state is RunState.STOPPED else state.value
        )
    return outcome


@click.command("undrain")
@node_argument
@gpu_option
@json_option
@click.pass_obj
def undrain_command(ctl: Ctl, node: str, gpus: tuple[int, ...]) -> None:
    """New work on NODE again (or on its GPUs --gpu N ...: lifts a drain or a quarantine,
    unless the GPU still reads unsafe). Operators only; audited."""
    target = target_of_node(node)
    try:
        with Client(target, timeout_s=ctl.timeout) as client:
            reply = client.call(NODE_UNDRAIN, UndrainRequest(gpus=list(gpus) or None))
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(reply, DrainReply)
    if ctl.json:
        emit_json({"drain": reply})
    else:
        for line in _render(reply):
            click.echo(line)
    sys.exit(EXIT_OK)
