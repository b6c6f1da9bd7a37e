"""The row a run leaves when retention removes it: who used how many GPUs for how long.

GPU-hour accounting (issue 23) must survive retention, so before a run's records go, this
node writes one compact `run_usage` row: the run, the key that launched it (or the user
an attached run runs as), this node's GPUs, its wall time and GPU-seconds over every
attempt, and when it started and ended. Pure: records in, a row out.
"""

from __future__ import annotations

import re

from pydantic import Field

from gpud.model.run import AttemptRecord, RunEvent, RunRecord
from gpud.model.snapshot import Reading

_LAUNCHED_BY = re.compile(r"^(?:launched|joined[^b]*) by (\S+)")


class RunUsage(Reading):
    """One run's use of this node, kept after the run is removed."""

    run_id: str
    name: str
    user: str | None = Field(description="the launching key's name, or an attached run's user")
    node_rank: int
    state: str
    attempts: int
    gpus: int = Field(description="most GPUs one attempt leased here")
    gpu_seconds: float = Field(description="GPUs × seconds, summed over its attempts here")
    wall_s: float = Field(description="seconds its attempts ran here, summed")
    created_at: float
    started_at: float | None
    ended_at: float | None
    goodput: float | None = Field(
        None, description="node 0's goodput of the run, 0 to 1 (None: not node 0, or unknown)"
    )
    removed: bool = Field(False, description="its records are gone: this row is what is left")


def launched_by(events: list[RunEvent]) -> str | None:
    """The key that launched (or joined) the run here, from its first such event."""
    for event in events:
        if event.kind in ("launch", "join"):
            by = event.data.get("by")
            if isinstance(by, str):
                return by
            found = _LAUNCHED_BY.match(event.message)
            if found:
                return found.group(1)
    return None


def usage_of(
    run: RunRecord,
    attempts: list[AttemptRecord],
    events: list[RunEvent],
    now: float | None = None,
) -> RunUsage:
    """The run's use of this node; an attempt still running counts up to `now`."""
    gpu_seconds = wall = 0.0
    for a in attempts:
        if a.started_at is None:
            continue
        end = a.ended_at if a.ended_at is not None else a.state_since
        if now is not None and a.ended_at is None and not a.state.terminal:
            end = now
        took = max(0.0, end - a.started_at)
        wall += took
        gpu_seconds += took * len(a.gpus)
    started = [a.started_at for a in attempts if a.started_at is not None]
    ended = [a.ended_at for a in attempts if a.ended_at is not None]
    user = run.attached.user if run.attached is not None else launched_by(events)
    return RunUsage(
        run_id=run.id,
        name=run.name,
        user=user,
        node_rank=run.node_rank,
        state=run.state.value,
        attempts=run.attempt,
        gpus=max((len(a.gpus) for a in attempts), default=0),
        gpu_seconds=round(gpu_seconds, 3),
        wall_s=round(wall, 3),
        created_at=run.created_at,
        started_at=min(started) if started else None,
        ended_at=max(ended) if ended else (run.state_since if run.state.terminal else None),
        goodput=run.goodput.ratio if run.goodput is not None else None,
    )
