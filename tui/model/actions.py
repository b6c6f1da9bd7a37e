"""Stop and resume, as gputop asks for them: what the confirmation says, where it goes.

The confirmation names exactly what an action hits — the run, each of its nodes and the
processes on each — the way k9s names what it deletes. Both actions go to node 0 of the
run, which coordinates the gang (stop reaches the other nodes through it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpud.model.run import RunState
from gpud.wire.client import Client, NodeTarget
from gpud.wire.run_messages import RunSummary
from tui.model.fleet import FleetModel
from tui.model.runs import RunView

VERBS = ("stop", "resume")


class ActionRefused(Exception):
    """The action makes no sense for the run as it is now; `str()` says why."""


@dataclass(frozen=True)
class ActionPlan:
    verb: str
    run_id: str
    target: NodeTarget
    question: str


def _node_names(model: FleetModel, run: RunView) -> list[str]:
    names = []
    for ref in run.summary.nodes:
        key = model.key_of(ref.control)
        node = model.nodes.get(key) if key else None
        label = ref.control.removeprefix("tcp://")
        name = node.name if node is not None else ref.name
        names.append(f"{name} ({label})" if name and name != label else label)
    return names


def describe(model: FleetModel, run: RunView) -> str:
    """`on 2 nodes: gpu1 (10.0.0.1:7711) × 4 processes, gpu2 (...) × 4 processes — 8 ranks`."""
    names = _node_names(model, run)
    counts = run.nproc_by_node()
    parts = []
    for name, count in zip(names, counts, strict=True):
        procs = "? processes" if count is None else f"{count} process{'es' if count != 1 else ''}"
        parts.append(f"{name} × {procs}")
    total = run.world_size()
    ranks = f" — {total} rank{'s' if total != 1 else ''} in all" if total else ""
    where = f"{len(names)} node{'s' if len(names) != 1 else ''}"
    return f"on {where}: {', '.join(parts)}{ranks}"


def plan(model: FleetModel, verb: str, run_id: str) -> ActionPlan:
    """The confirmation and the coordinator to ask; ActionRefused when it cannot apply."""
    with model.lock:
        run = model.runs.get(run_id)
        if run is None or not run.known:
            raise ActionRefused(f"run {run_id} is not known (yet)")
        summary = run.summary
        state = summary.state
        attached = summary.attached
        if attached is not None:
            job = f"Slurm job {attached.job_id}" if attached.job_id else attached.scheduler
            raise ActionRefused(
                f"run {run_id} is {job}: gpud only watches it; {verb} it as its owner"
                f" ({attached.user or attached.uid}) with `gpuctl {verb} {run_id}`"
            )
        if verb == "stop" and state.terminal:
            raise ActionRefused(f"run {run_id} is already {state.value}")
        if verb == "resume" and not state.terminal:
            raise ActionRefused(f"run {run_id} is {state.value}: stop it before resuming")
        if verb == "resume" and state is RunState.SUCCEEDED:
            raise ActionRefused(f"run {run_id} succeeded: nothing to resume")
        where = describe(model, run)
        target = coordinator(model, run)
    if verb == "stop":
        question = (
            f"Stop run {run_id} ({summary.name}), attempt {summary.attempt}, {where}?\n"
            "The trainers are asked to checkpoint and exit; SIGTERM follows after the grace period."
        )
    else:
        step = summary.last_checkpoint.step if summary.last_checkpoint else None
        ckpt = f"its checkpoint at step {step}" if step is not None else "its latest checkpoint"
        question = (
            f"Resume run {run_id} ({summary.name}) as attempt {summary.attempt + 1}, {where}?\n"
            f"Every node starts its part again from {ckpt}."
        )
    return ActionPlan(verb, run_id, target, question)


def coordinator(model: FleetModel, run: RunView) -> NodeTarget:
    """Node 0 of the run: our own target for it when we watch it, else its NodeRef."""
    ref = run.summary.nodes[0]
    key = model.key_of(ref.control)
    if key is not None:
        return model.nodes[key].target
    server_key = ref.server_key.encode("ascii") if ref.server_key else None
    return NodeTarget(ref.control, server_key, None, ref.name)


def perform(
    action: ActionPlan, client_factory: Callable[[NodeTarget], Client] | None = None
) -> RunSummary:
    """Send the action (blocking: call it from a worker thread). Raises ClientError."""
    factory = client_factory or (lambda target: Client(target, timeout_s=5.0))
    with factory(action.target) as client:
        if action.verb == "stop":
            return client.stop_run(action.run_id)
        return client.resume_run(action.run_id)
