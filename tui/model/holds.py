"""Drain and undrain, as gputop asks for them (the Node screen's `d`, `D`, `u`, `U`): what
the confirmation says, and the request. Like stop and resume (`actions`), the question
names exactly what is hit: the node or its GPUs, and the runs on them, which go on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpud.wire.client import Client, NodeTarget
from gpud.wire.node_messages import DrainReply, DrainRequest, UndrainRequest
from gpud.wire.protocol import NODE_DRAIN, NODE_UNDRAIN
from tui.model.actions import ActionRefused
from tui.model.fleet import FleetModel

VERBS = ("drain", "drain_node", "undrain", "undrain_node")


@dataclass(frozen=True)
class HoldPlan:
    verb: str  # drain or undrain
    node: str
    gpus: list[int] | None  # None: the whole node
    target: NodeTarget
    question: str

    @property
    def what(self) -> str:
        return f"GPU {self.gpus[0]} of {self.node}" if self.gpus else self.node


def plan_hold(model: FleetModel, verb: str, key: str, gpu: int | None) -> HoldPlan:
    """`verb`: drain or undrain; `gpu` None for the whole node. ActionRefused when it
    cannot apply (nothing to undrain, the node unknown)."""
    with model.lock:
        node = model.nodes.get(key)
        if node is None or node.snapshot is None:
            raise ActionRefused("the node's GPUs are not known (yet)")
        snap = node.snapshot
        runs = sorted(r.id for r in model.runs_on(key) if r.active)
        name, target = node.name, node.target
    on = f" (runs there go on until they end: {', '.join(runs)})" if runs else ""
    if gpu is None:
        held = snap.drained
        if verb == "undrain" and held is None:
            raise ActionRefused(f"{name} is not drained")
        if verb == "drain":
            question = f"Drain node {name}: no new runs or attempts start there{on}?"
        else:
            assert held is not None
            question = f"Undrain node {name} (drained by {held.by}: {held.reason})?"
        return HoldPlan(verb, name, None, target, question)
    sample = next((g for g in snap.gpus if g.index == gpu), None)
    if sample is None:
        raise ActionRefused(f"{name} has no GPU {gpu}")
    if verb == "undrain" and sample.hold is None:
        raise ActionRefused(f"GPU {gpu} of {name} is neither drained nor quarantined")
    if verb == "drain":
        question = f"Drain GPU {gpu} of {name}: it gets no new work{on}?"
    else:
        assert sample.hold is not None
        kind = "quarantined" if sample.hold.kind == "quarantine" else "drained"
        question = (
            f"Put GPU {gpu} of {name} back to work? It is {kind}: {sample.hold.reason}.\n"
            "A GPU that still reads unsafe (lost, a row remap pending) stays held."
        )
    return HoldPlan(verb, name, [gpu], target, question)


def perform_hold(
    plan: HoldPlan,
    reason: str,
    client_factory: Callable[[NodeTarget], Client] | None = None,
) -> DrainReply:
    """Send it (blocking: call it from a worker thread). Raises ClientError."""
    factory = client_factory or (lambda target: Client(target, timeout_s=5.0))
    with factory(plan.target) as client:
        if plan.verb == "drain":
            return client.call(NODE_DRAIN, DrainRequest(gpus=plan.gpus, reason=reason))
        return client.call(NODE_UNDRAIN, UndrainRequest(gpus=plan.gpus))
