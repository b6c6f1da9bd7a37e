"""Finding a run by id or name across nodes, and reaching every node of it."""

from __future__ import annotations

from dataclasses import dataclass

from gpud.model.run import NodeRef
from gpud.wire.client import Client, ClientError, NodeTarget, RequestFailed
from gpud.wire.protocol import RUN_STATUS
from gpud.wire.run_messages import RunRef, RunStatus
from launch.gpuctl.context import EXIT_FAILED, Ctl, exit_code_for, fail


def target_of(ref: NodeRef) -> NodeTarget:
    return NodeTarget(
        control=ref.control,
        server_key=ref.server_key.encode() if ref.server_key else None,
        name=ref.name,
    )


@dataclass
class FoundRun:
    status: RunStatus
    nodes: list[NodeTarget]  # index = node rank

    @property
    def id(self) -> str:
        return self.status.run.id

    @property
    def coordinator(self) -> NodeTarget:
        return self.nodes[0]


def find_run(ctl: Ctl, ref: str) -> FoundRun:
    """The run `ref` (id, or newest of that name) on the given nodes; exits when absent."""
    results = ctl.on_every_node(lambda client: client.call(RUN_STATUS, RunRef(run=ref)))
    found = [r.value for r in results if isinstance(r.value, RunStatus)]
    if not found:
        errors = [r.error for r in results if r.error is not None]
        unreachable = [e for e in errors if not isinstance(e, RequestFailed)]
        if unreachable:
            fail(str(unreachable[0]), exit_code_for(unreachable[0]))
        fail(f"no run {ref!r} on {', '.join(r.address for r in results)}", EXIT_FAILED)
    # Node 0 knows the whole gang; among equals, the newest run of the name wins.
    best = max(found, key=lambda s: (s.run.created_at, s.run.node_rank == 0))
    if best.run.node_rank != 0:
        coordinator = target_of(best.run.nodes[0])
        try:
            with Client(coordinator, timeout_s=ctl.timeout) as client:
                status = client.call(RUN_STATUS, RunRef(run=best.run.id))
            if isinstance(status, RunStatus):
                best = status
        except ClientError:
            pass  # node 0 is unreachable: what this node knows will have to do
    return FoundRun(status=best, nodes=[target_of(n) for n in best.run.nodes])


def refresh(ctl: Ctl, run: FoundRun) -> RunStatus:
    """The run's status from node 0 (or, when node 0 is unreachable, from any node)."""
    last_error: ClientError | None = None
    for target in run.nodes:
        try:
            with Client(target, timeout_s=ctl.timeout) as client:
                status = client.call(RUN_STATUS, RunRef(run=run.id))
            if isinstance(status, RunStatus):
                run.status = status
                return status
        except ClientError as exc:
            last_error = exc
    assert last_error is not None
    raise last_error
