"""`gpuctl launch CONFIG`: validate the spec, start it on every node, optionally follow it.

Node 0 creates the run; then every other node joins with its node rank. A run on one node
starts at once. A run on several starts once every node joined (`run.start`): node 0
reserves every node's GPUs, runs the preflight's collective check across them, leases its
MASTER_PORT and starts each part, as for any later attempt. If a node cannot join, or the
start is refused, the run is stopped everywhere, so nothing is left half started. With
`--queue` (or `queue: true`) a run whose GPUs are busy waits instead: node 0 queues it, the
other nodes join its queue, and node 0 starts it when every node can give its GPUs at once.
`--dry-run` asks every node what it would run and prints exactly that.

A node whose gpud is older than `run.start` (protocol 1, gpud 0.1.0) gets the two-phase
launch its own gpuctl sent: node 0's part starts at `run.launch`, each other node's at its
join, and the first attempt has no collective check. gpuctl asks each node's protocol
first, so a run with such a node among its nodes is launched that way on every node.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from gpud.model.run import RunState, new_run_id
from gpud.runs.state.checkpoints import unset_dir_warning
from gpud.wire.client import Client, ClientError, NodeTarget, RequestFailed
from gpud.wire.envelope import PROTOCOL_START_BY_CALL
from gpud.wire.protocol import RUN_JOIN, RUN_LAUNCH, RUN_START, RUN_STOP
from gpud.wire.run_messages import (
    JoinReply,
    JoinRequest,
    LaunchReply,
    LaunchRequest,
    NodeRefIn,
    PartPlan,
    RunStartRequest,
    StopRequest,
)
from launch.gpuctl.context import (
    DEFAULT_NODE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    START_TIMEOUT_S,
    Ctl,
    exit_code_for,
    fail,
    json_option,
)
from launch.gpuctl.follow import follow, outcome_line
from launch.gpuctl.output import emit_json
from launch.gpuctl.runref import find_run
from launch.scripts import USES_LIBRARY, script_text
from launch.sections import SpecError
from launch.spec import RunSpec, check_elastic, load_spec


def _node_ref(target: NodeTarget) -> NodeRefIn:
    return NodeRefIn(
        control=target.control,
        server_key=target.server_key.decode() if target.server_key else None,
        name=target.name,
    )


def render_plan(plan: PartPlan, address: str) -> str:
    """A shell-like rendering of what a node runs, for reading (never executed)."""
    unset = [f"-u {shlex.quote(name)}" for name in sorted(plan.unset)]
    env = " \\\n  ".join(unset + [f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())])
    files = "".join(f"\n# writes {name} into the attempt dir" for name in sorted(plan.files))
    gpus = ",".join(map(str, plan.gpus)) if plan.gpus else "none (no GPUs here)"
    return (
        f"# node {plan.node_rank}: {plan.node} ({address})\n"
        f"# GPUs: {gpus}\n"
        f"cd {shlex.quote(plan.cwd)}\n"
        f"env \\\n  {env} \\\n  {shlex.join(plan.argv)}{files}"
    )


def _targets(ctl: Ctl, spec: RunSpec) -> list[NodeTarget]:
    # `--wait` then finds the run on these nodes, not on every known one.
    ctl.nodes = list(ctl.nodes or spec.nodes or [DEFAULT_NODE])
    return ctl.targets()


def _spares(ctl: Ctl, spec: RunSpec, targets: list[NodeTarget]) -> list[NodeTarget]:
    """An elastic run's spares (`elastic.spares`), checked against its nodes."""
    if spec.elastic is None:
        return []
    try:
        check_elastic(spec.elastic, [t.label for t in targets], spec.restart, spec.launcher)
    except ValueError as exc:
        fail(f"spec: {exc}", EXIT_USAGE)
    if not spec.elastic.spares:
        return []
    return Ctl(nodes=list(spec.elastic.spares), json=ctl.json, timeout=ctl.timeout).targets()


class JoinFailed(Exception):
    """A node could not join a run node 0 created (node 0 was told to stop it)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def start(
    ctl: Ctl, spec: RunSpec, targets: list[NodeTarget], dry_run: bool = False, queue: bool = False
) -> tuple[LaunchReply, list[JoinReply]]:
    """Create the run on node 0 and join every other node to it. Raises `ClientError` when
    node 0 refuses, `JoinFailed` when another node does."""
    spares = _spares(ctl, spec, targets)
    refs = [_node_ref(t) for t in [*targets, *spares]]
    # What differs from the defaults only: each daemon fills in its own, so a key added in
    # a later release reaches an older daemon (which refuses keys it does not know) only
    # when the user set it.
    body = spec.model_dump(mode="json", exclude_defaults=True)
    by_call = len(targets) > 1 and _all_start_by_call(ctl, [*targets, *spares])
    launch = LaunchRequest(
        spec=body, nodes=refs, dry_run=dry_run, queue=queue, start_by_call=by_call
    )
    # On real GPUs a one-node launch answers after its GPUs' preflight (seconds).
    with Client(targets[0], timeout_s=max(ctl.timeout, START_TIMEOUT_S)) as client:
        reply = client.call(RUN_LAUNCH, launch)
    assert isinstance(reply, LaunchReply)
    joins: list[JoinReply] = []
    for rank, target in enumerate([*targets, *spares][1:], start=1):
        standby = rank >= len(targets)
        request = JoinRequest(
            run_id=reply.run.id,
            spec=body,
            nodes=refs,
            node_rank=rank,
            master_addr=reply.master_addr,
            master_port=None if standby else reply.master_port,
            dry_run=dry_run,
            queued_at=None if standby else reply.run.queued_at,
            standby=standby,
            hold=reply.start_by_call and not standby and not queue,
        )
        try:
            with Client(target, timeout_s=ctl.timeout) as client:
                joined = client.call(RUN_JOIN, request)
        except ClientError as exc:
            if not dry_run:
                _abandon(ctl, targets[0], reply.run.id)
            raise JoinFailed(
                f"{target.label} could not join run {reply.run.id}: {exc}", exit_code_for(exc)
            ) from None
        assert isinstance(joined, JoinReply)
        joins.append(joined)
    if reply.start_by_call:
        reply = _start_first_attempt(ctl, targets[0], reply, queue)
    return reply, joins


def _all_start_by_call(ctl: Ctl, targets: list[NodeTarget]) -> bool:
    """Whether every node's gpud has `run.start` (and `hold`): else the two-phase launch,
    which every gpud serves. A node that does not answer is left to the launch or join to
    report (as it would have)."""
    for target in targets:
        try:
            with Client(target, timeout_s=ctl.timeout) as client:
                if client.protocol() < PROTOCOL_START_BY_CALL:
                    return False
        except ClientError:
            continue
    return True


def _start_first_attempt(
    ctl: Ctl, coordinator: NodeTarget, launched: LaunchReply, queue: bool
) -> LaunchReply:
    """Every node joined: node 0 starts the first attempt (its preflight first, which
    takes seconds). Refused, node 0 has cancelled the run everywhere; no answer, gpuctl
    stops it, so nothing waits half-started."""
    run_id = launched.run.id
    try:
        with Client(coordinator, timeout_s=max(ctl.timeout, START_TIMEOUT_S)) as client:
            started = client.call(RUN_START, RunStartRequest(run=run_id, queue=queue))
    except ClientError as exc:
        if not isinstance(exc, RequestFailed):
            _abandon(ctl, coordinator, run_id)
        raise JoinFailed(f"run {run_id} could not start: {exc}", exit_code_for(exc)) from None
    assert isinstance(started, LaunchReply)
    return started.model_copy(update={"warnings": launched.warnings})


def _slurm_launch(ctl: Ctl, spec: RunSpec, dry_run: bool) -> None:
    from launch import slurm
    from launch.gpuctl import slurm_jobs

    python = spec.python or sys.executable
    if dry_run:
        run_id = new_run_id(spec.name)
        _warn_checkpoint_dir(spec, slurm.run_dir_for(spec, run_id))
        try:
            click.echo(
                slurm.render(spec, run_id, slurm.run_dir_for(spec, run_id), python), nl=False
            )
        except slurm.SlurmScriptError as exc:
            fail(str(exc), EXIT_USAGE)
        return
    try:
        run = slurm_jobs.create(spec, python)
    except (slurm.SlurmScriptError, OSError) as exc:
        fail(str(exc), EXIT_USAGE)
    _warn_checkpoint_dir(spec, str(run.run_dir))
    try:
        job = slurm_jobs.submit(run, attempt_base=1)
    except slurm_jobs.SlurmError as exc:
        fail(str(exc), EXIT_FAILED)
    if ctl.json:
        emit_json({"run": {"id": run.id, "slurm_job": job, "run_dir": str(run.run_dir)}})
    else:
        click.echo(f"submitted {run.id} as Slurm job {job}; its files: {run.run_dir}")


def _warn_checkpoint_dir(spec: RunSpec, run_dir: str) -> None:
    """A Slurm run looks for checkpoints as a daemon does: warn as a daemon would (and
    say what a script without the library gets)."""
    warning = unset_dir_warning(spec, os.path.join(run_dir, "checkpoints"))
    if warning:
        click.echo(f"gpuctl: warning: {warning}", err=True)
    if (note := plain_script_note(spec)) is not None:
        click.echo(note, err=True)


def _abandon(ctl: Ctl, coordinator: NodeTarget, run_id: str) -> None:
    try:
        with Client(coordinator, timeout_s=ctl.timeout) as client:
            client.call(RUN_STOP, StopRequest(run=run_id, force=True))
    except ClientError as exc:
        click.echo(f"gpuctl: warning: could not stop {run_id} on node 0: {exc}", err=True)


#: `--set KEY.PATH=VALUE`, as every verb that starts runs from a spec takes it.
overrides_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a spec key, e.g. --set training.max_steps=100 (repeatable).",
)


def plain_script_note(spec: RunSpec) -> str | None:
    """One line for a script that does not import the trainers library (read here; a
    script this machine cannot read gets no note): what gpud can see of its health."""
    if spec.workdir is None:
        return None
    text = script_text(spec)
    if text is None or USES_LIBRARY.search(text):
        return None
    hang = (
        f"a hang after {spec.restart.hang_timeout_s:g}s without output"
        if spec.restart.hang_timeout_s
        else "a hang when it prints nothing for restart.hang_timeout_s (unset)"
    )
    metrics = (
        "metrics from its framework's output (`metrics: auto`: Hugging Face Trainer,"
        " Lightning, nanoGPT, torchtitan, DeepSpeed, tqdm)"
        if spec.auto_metrics
        else "metrics from `metrics:` patterns"
        if spec.metric_patterns
        else "no metrics (`metrics: none`)"
    )
    return (
        f"gpuctl: note: {spec.script} does not import the trainers library, so gpud judges its"
        f" health from its output: {metrics}, {hang}; per-rank"
        " heartbeats, stragglers, a stall's culprit, the checkpoint-then-exit stop and"
        " the collective probe need `from trainers import ...`"
    )


@click.command("launch")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Run name (overrides the spec's `name`).")
@overrides_option
@click.option("--wait", is_flag=True, help="Follow the run; exit 0 if it succeeds, else 1.")
@click.option(
    "--dry-run", is_flag=True, help="Print each node's exact command and env; start nothing."
)
@click.option(
    "--queue",
    is_flag=True,
    help="If its GPUs are busy, wait for them in the queue (first come, first served).",
)
@click.option(
    "--slurm",
    is_flag=True,
    help="Run under Slurm (the spec's `slurm:` section); with --dry-run, print the batch script.",
)
@json_option
@click.pass_obj
def launch_command(
    ctl: Ctl,
    config: Path,
    name: str | None,
    overrides: tuple[str, ...],
    wait: bool,
    dry_run: bool,
    queue: bool,
    slurm: bool,
) -> None:
    """Launch the run described by CONFIG (a YAML run spec) on its nodes."""
    try:
        spec = load_spec(config, list(overrides), name)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    if queue:  # kept with the run: an elastic run's restarts below min_nodes wait too
        spec = spec.model_copy(update={"queue": True})
    note = plain_script_note(spec)  # said once the launch went through, as the warnings are
    if slurm or spec.slurm is not None:
        _slurm_launch(ctl, spec, dry_run)
        return
    targets = _targets(ctl, spec)
    try:
        reply, joins = start(ctl, spec, targets, dry_run, spec.queue)
    except ClientError as exc:
        fail(f"{targets[0].label}: {exc}", exit_code_for(exc))
    except JoinFailed as exc:
        fail(str(exc), exc.code)
    for warning in reply.warnings:
        click.echo(f"gpuctl: warning: {warning}", err=True)
    if note is not None:
        click.echo(note, err=True)
    if dry_run:
        plans = [p for p in [reply.plan, *(j.plan for j in joins)] if p is not None]
        if ctl.json:
            emit_json({"nodes": plans})
        else:
            click.echo(
                "\n\n".join(render_plan(p, t.label) for p, t in zip(plans, targets, strict=True))
            )
        return
    run = reply.run
    if ctl.json and not wait:
        # The rendezvous a script may need (its port is None while the run is queued).
        emit_json({"run": run, "master": {"addr": reply.master_addr, "port": reply.master_port}})
        return
    if not ctl.json:
        where = ", ".join(t.label for t in targets)
        if run.state is RunState.QUEUED:
            click.echo(
                f"queued {run.id} on {len(targets)} node(s) ({where}): {run.state_label};"
                f" {run.reason}"
            )
        else:
            click.echo(
                f"launched {run.id} on {len(targets)} node(s) ({where}); "
                f"master {reply.master_addr}:{reply.master_port}"
            )
    if not wait:
        return
    found = find_run(ctl, run.id)
    code = follow(ctl, found)
    if ctl.json:
        emit_json({"run": found.status.run})
    else:
        click.echo(outcome_line(found.status.run))
    sys.exit(code if code != EXIT_OK else EXIT_OK)
