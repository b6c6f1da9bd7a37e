"""`gpuctl metrics RUN` and `gpuctl health RUN`: what the trainers reported, and how they are."""

from __future__ import annotations

import click

from gpud.model.run import NO_HEARTBEATS, HealthSummary, steps_text
from gpud.wire.client import Client, ClientError
from gpud.wire.protocol import RUN_HEALTH, RUN_METRICS
from gpud.wire.run_messages import MetricsReply, MetricsRequest, RunRef
from launch.gpuctl import slurm_jobs
from launch.gpuctl.completion import run_argument
from launch.gpuctl.context import Ctl, exit_code_for, fail, json_option
from launch.gpuctl.output import emit_json, table
from launch.gpuctl.runref import find_run


@click.command("metrics")
@run_argument
@click.option("--name", help="Only this metric (e.g. loss).")
@click.option("--attempt", type=click.IntRange(min=1), help="Only this attempt [all].")
@json_option
@click.pass_obj
def metrics_command(ctl: Ctl, run: str, name: str | None, attempt: int | None) -> None:
    """A run's metric history, across all attempts (from node 0, which holds rank 0's)."""
    if (on_slurm := slurm_jobs.find(run)) is not None:
        show_metrics(ctl, on_slurm.metrics(name, attempt))
        return
    found = find_run(ctl, run)
    try:
        with Client(found.coordinator, timeout_s=max(ctl.timeout, 15.0)) as client:
            reply = client.call(
                RUN_METRICS, MetricsRequest(run=found.id, name=name, attempt=attempt)
            )
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(reply, MetricsReply)
    show_metrics(ctl, reply)


def show_metrics(ctl: Ctl, reply: MetricsReply) -> None:
    if ctl.json:
        emit_json(reply)
        return
    names = sorted({key for row in reply.rows for key in row.values})
    rows = [
        [str(r.attempt), str(r.step), *(_number(r.values.get(n)) for n in names)]
        for r in reply.rows
    ]
    click.echo(table(["ATTEMPT", "STEP", *(n.upper() for n in names)], rows))
    if reply.resumed_at:
        click.echo(f"resumed at step(s): {', '.join(str(s) for s in reply.resumed_at)}")


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}"


@click.command("health")
@run_argument
@json_option
@click.pass_obj
def health_command(ctl: Ctl, run: str) -> None:
    """The latest health summary: verdict and why, every rank, straggler, stall, busbw."""
    found = find_run(ctl, run)
    try:
        with Client(found.coordinator, timeout_s=ctl.timeout) as client:
            health = client.call(RUN_HEALTH, RunRef(run=found.id))
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(health, HealthSummary)
    if ctl.json:
        emit_json(health)
        return
    click.echo("\n".join(render_health(health, found.status.run.max_steps)))


def _verdict(h: HealthSummary) -> str:
    """`OK: why`; for an `ok` judged from output alone, NO_HEARTBEATS in place of `OK`."""
    if h.ok_from_output:
        # The first reason is NO_HEARTBEATS and what was heard (for readers without the flag).
        why = [r.removeprefix(NO_HEARTBEATS).removeprefix("; ") for r in h.reasons]
        return "; ".join([NO_HEARTBEATS] + [r for r in why if r])
    return h.verdict.upper() + (f": {'; '.join(h.reasons)}" if h.reasons else "")


def render_health(h: HealthSummary, max_steps: int | None = None) -> list[str]:
    """The health report; each rank's step as steps done/`max_steps` (as `ps` shows it)."""
    lines = [
        f"run       {h.run_id} (attempt {h.attempt}), backend {h.backend or '?'}, "
        f"world size {h.world_size or '?'}",
        f"verdict   {_verdict(h)}",
    ]
    if h.stall is not None:
        who = f"rank {h.stall.rank}" if h.stall.rank is not None else "no single rank"
        lines.append(
            f"stall     {who}, stuck {h.stall.stuck_for_s:.1f}s; collective timeout in "
            f"{h.stall.countdown_s:.0f}s (of {h.stall.timeout_s:.0f}s)"
        )
    if h.straggler is not None:
        s = h.straggler
        lines.append(
            f"straggler rank {s.rank}: {s.step_time_s * 1000:.1f} ms compute per step, "
            f"{s.ratio}× the median {s.median_step_time_s * 1000:.1f} ms"
        )
    if h.bandwidth is not None:
        b = h.bandwidth
        base = f" (baseline {b.baseline_gbps:.0f} GB/s for {b.baseline})" if b.baseline_gbps else ""
        lines.append(f"busbw     {b.busbw_gbps:.2f} GB/s at step {b.step}{base}")
    if h.nccl_warnings:
        lines.append(f"nccl      {h.nccl_warnings} warning(s); last: {h.last_nccl_warning}")
    for t in h.gpu_trouble:
        lines.append(f"gpu       {t.node} GPU {t.gpu_index}: {'; '.join(t.events) or t.throttle}")
    rows = [
        [
            str(r.rank),
            "?" if r.node_rank < 0 else str(r.node_rank),
            steps_text(r.steps_done, max_steps),
            _ms(r.step_time_s),
            _ms(r.collective_s),
            "-" if r.heartbeat_age_s is None else f"{r.heartbeat_age_s:.1f}s",
            r.phase,
            "STALLED" if r.stalled else ("STRAGGLER" if r.straggler else ""),
        ]
        for r in h.ranks
    ]
    lines += [
        "",
        table(["RANK", "NODE", "STEP", "STEP TIME", "COLLECTIVES", "HEARTBEAT", "PHASE", ""], rows),
    ]
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"
