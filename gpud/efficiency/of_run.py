"""A run's `RunFlops` from what node 0's daemon holds: its spec, its ranks' heartbeats,
rank 0's latest metrics, its lease and the node's latest hardware sample. Where no rank
beats (a script that knows nothing of gpud), its step time is the one its pattern
captured (`step_time_ms`), else the pace of the steps it printed (issue 32 §4).

The GPUs are node 0's leased ones; a run on several nodes is assumed to use the same model
and count on each node of its attempt (a gang is leased alike on every node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpud.efficiency.mfu import FlopsInputs, RunGpus, utilization
from gpud.efficiency.model import RunFlops
from gpud.model.run import (
    RankView,
    RunRecord,
    logged_step_time,
    samples_per_rank_step,
    throughput,
)
from gpud.model.snapshot import NodeSnapshot
from launch.spec import RunSpec


def run_precision(spec: RunSpec) -> str | None:
    """The dtype the run computes in: its launcher's setting, else training.mixed_precision."""
    if spec.deepspeed is not None and spec.deepspeed.precision is not None:
        return spec.deepspeed.precision
    if spec.accelerate is not None and spec.accelerate.mixed_precision is not None:
        return spec.accelerate.mixed_precision
    return spec.training.mixed_precision


def run_gpus(run: RunRecord, lease: Sequence[str], snapshot: NodeSnapshot) -> RunGpus:
    """Node 0's leased GPUs as the latest sample has them, times the attempt's nodes."""
    by_uuid = {g.uuid: g for g in snapshot.gpus}
    mine = [by_uuid[uuid] for uuid in lease if uuid in by_uuid]
    nodes = len(run.members) if run.members is not None else len(run.nodes)
    return RunGpus(
        names=[g.name for g in mine],
        count=len(lease) * max(nodes, 1),
        simulated=any(g.simulated for g in mine),
        sm_active_pct=[g.sm_activity_pct for g in mine if g.sm_activity_pct is not None],
    )


def run_flops(
    spec: RunSpec,
    ranks: Sequence[RankView],
    world_size: int | None,
    logged: Mapping[str, float],
    gpus: RunGpus,
    pace_s: float | None = None,
) -> RunFlops:
    """The run's efficiency now (while it trains: the rates are the recent ones). `pace_s`:
    seconds per step from the steps the run printed lately (None: too few)."""
    training = spec.training
    step_times = [r.step_time_s for r in ranks if r.step_time_s]
    if not step_times:
        found = logged_step_time(logged) or pace_s
        step_times = [found] if found else []
    samples, tokens = throughput(
        logged,
        step_times,
        world_size,
        samples_per_rank_step(training.model_dump()),
        training.seq_len,
    )
    inputs = FlopsInputs(
        counted=[
            (r.flops_per_step, r.step_time_s) for r in ranks if r.flops_per_step and r.step_time_s
        ],
        world_size=world_size,
        logged=logged,
        samples_per_s=samples,
        tokens_per_s=tokens,
        flops_per_sample=training.flops_per_sample,
        model_params=training.model_params,
    )
    return utilization(inputs, gpus, run_precision(spec))


__all__ = ["run_flops", "run_gpus", "run_precision"]
