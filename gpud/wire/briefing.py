"""Making a node's brief (`gpud.wire.brief`) from its snapshot and its runs' summaries.

Pure: no I/O. Apart from `gpud.wire.brief` because the brief's records are what the
protocol decodes, and these builders read the protocol's `RunSummary`.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpud.model.run import TRAINING, HealthSummary
from gpud.model.snapshot import NodeSnapshot
from gpud.wire.brief import (
    BRIEF_VALUES,
    ENDED_KEPT_S,
    NodeBrief,
    RunBrief,
    gpu_brief,
    node_health,
)
from gpud.wire.run_messages import RunSummary


def run_brief(summary: RunSummary, health: HealthSummary | None) -> RunBrief:
    values = {k: v for k in BRIEF_VALUES if (v := summary.last_values.get(k)) is not None}
    flops = health.flops if health is not None and summary.state in TRAINING else None
    return RunBrief(
        id=summary.id,
        name=summary.name,
        state=summary.state,
        attempt=summary.attempt,
        node_rank=summary.node_rank,
        last_step=summary.last_step,
        max_steps=summary.max_steps,
        values=values,
        verdict=health.verdict if health is not None else None,
        judged_from_output=health is not None and health.judged_from_output,
        flops_per_second=flops.flops_per_second if flops else None,
        mfu=flops.mfu if flops else None,
    )


def shown(summary: RunSummary, now: float) -> bool:
    """Active, or ended within `ENDED_KEPT_S`."""
    return not summary.state.terminal or now - summary.state_since <= ENDED_KEPT_S


def node_brief(
    snapshot: NodeSnapshot,
    runs: Iterable[tuple[RunSummary, HealthSummary | None]] = (),
) -> NodeBrief:
    return NodeBrief(
        node=snapshot.node,
        seq=snapshot.seq,
        time=snapshot.time,
        interval_s=snapshot.interval_s,
        backend=snapshot.backend,
        simulated=snapshot.simulated,
        gpus=[gpu_brief(g) for g in snapshot.gpus],
        health=node_health(snapshot),
        runs=[run_brief(s, h) for s, h in runs if shown(s, snapshot.time)],
    )
