"""`gpuctl hw`: a hardware report with recommended training settings for each node, and
which run leases each GPU (or which process outside gpud holds it)."""

from __future__ import annotations

import sys

import click

from gpud.model.snapshot import GpuSample, NodeSnapshot
from gpud.wire.client import Client
from gpud.wire.protocol import RUN_LIST
from gpud.wire.run_messages import ListRequest, RunList, RunSummary
from launch.autotune import DEFAULT_TARGET_BATCH, Recommendation, recommend_for_node
from launch.gpuctl.context import Ctl, json_option, report_errors, worst_exit_code
from launch.gpuctl.output import emit_json, human_bytes, table

_SETTING_LABELS = {
    "batch_size_per_gpu": "batch size per GPU",
    "gradient_accumulation": "gradient accumulation",
    "dataloader_workers_per_gpu": "dataloader workers per GPU",
    "mixed_precision": "mixed precision",
    "gradient_checkpointing": "gradient checkpointing",
    "zero_stage": "DeepSpeed ZeRO stage",
}


def _setting_value(rec: Recommendation, key: str) -> str:
    value = getattr(rec, key)
    if key == "gradient_checkpointing":
        return "on" if value else "off"
    if key == "zero_stage":
        return "none (DDP)" if value == 0 else str(value)
    if key == "gradient_accumulation":
        return f"{value} (effective batch {rec.effective_batch})"
    return str(value)


def _hw_and_runs(client: Client) -> tuple[NodeSnapshot, list[RunSummary]]:
    runs = client.call(RUN_LIST, ListRequest(active_only=True))
    assert isinstance(runs, RunList)
    return client.node_hw(), runs.runs


def holders(snap: NodeSnapshot, runs: list[RunSummary]) -> dict[int, str]:
    """Who holds each GPU: the run that leases it, else the Kubernetes pod it belongs to
    and the processes on it (outside gpud: no run leases that GPU), else nobody ("-")."""
    leased = {index: run for run in runs for index in run.gpus}
    return {g.index: _holder(g, leased.get(g.index)) for g in snap.gpus}


def _holder(gpu: GpuSample, run: RunSummary | None) -> str:
    if run is not None:
        return f"{run.id} ({run.name})"
    outside = [f"pid {p.pid} ({p.name or '?'})" for p in gpu.processes or []]
    if gpu.pod is not None:
        return gpu.pod.describe() + (": " + ", ".join(outside) if outside else "")
    return ", ".join(outside) + " outside gpud" if outside else "-"


def gpu_state(gpu: GpuSample) -> str:
    """ok, lost, quarantined or drained: whether the GPU takes new work."""
    if gpu.hold is not None:
        return "quarantined" if gpu.hold.kind == "quarantine" else "drained"
    return "lost" if gpu.lost else "ok"


def render_report(
    address: str, snap: NodeSnapshot, rec: Recommendation, runs: list[RunSummary]
) -> str:
    flag = "  [SIMULATED GPUs]" if snap.simulated else ""
    drained = (
        f"  DRAINED by {snap.drained.by}: {snap.drained.reason} (no new runs)"
        if snap.drained
        else ""
    )
    if snap.state_dir_full:
        drained += f"  STATE DIR FULL: {snap.state_dir_full} (new launches are refused)"
    lines = [
        f"node {snap.node} ({address}){flag}{drained}",
        f"driver {snap.driver_version or 'n/a'}, CUDA {snap.cuda_driver_version or 'n/a'}, "
        f"{len(snap.gpus)} GPU(s)",
    ]
    if snap.gpus:
        held = holders(snap, runs)
        rows = [
            [
                g.index,
                g.name,
                human_bytes(g.memory_total_bytes),
                f"{g.compute_capability[0]}.{g.compute_capability[1]}"
                if g.compute_capability
                else "n/a",
                f"gen{g.pcie_link_gen_max} x{g.pcie_link_width_max}"
                if g.pcie_link_gen_max
                else "n/a",
                g.uuid,
                gpu_state(g),
                held[g.index],
            ]
            for g in snap.gpus
        ]
        header = ["GPU", "MODEL", "MEMORY", "CC", "PCIE", "UUID", "STATE", "HELD BY"]
        lines += ["", table(header, rows)]
        lines += [
            f"  GPU {g.index} {gpu_state(g)}: {g.hold.reason}"
            + (f" (by {g.hold.by})" if g.hold.by else "")
            for g in snap.gpus
            if g.hold is not None
        ]
    host = snap.host
    physical = f" ({host.cpu_count_physical} physical)" if host.cpu_count_physical else ""
    lines += [
        "",
        f"CPU  {host.cpu_count_logical} cores{physical}, load {host.load_1m or 0:.2f}",
        f"RAM  {human_bytes(host.memory_total_bytes)} "
        f"({human_bytes(host.memory_available_bytes)} available)",
        "",
        f"Recommended training settings — memory class {rec.memory_class}, "
        f"{rec.gpus} GPU(s), target batch {rec.target_batch}:",
        table(
            ["  SETTING", "VALUE", "WHY"],
            [
                [f"  {label}", _setting_value(rec, key), rec.reasons[key]]
                for key, label in _SETTING_LABELS.items()
            ],
        ),
    ]
    return "\n".join(lines)


@click.command("hw")
@click.option(
    "--target-batch",
    default=DEFAULT_TARGET_BATCH,
    show_default=True,
    type=click.IntRange(min=1),
    help="Effective batch (samples per optimizer step) to plan gradient accumulation for.",
)
@json_option
@click.pass_obj
def hw_command(ctl: Ctl, target_batch: int) -> None:
    """Hardware report (GPUs, CPU, RAM) and recommended training settings per node."""
    results = ctl.on_every_node(_hw_and_runs)
    if ctl.json:
        nodes = []
        for r in results:
            entry: dict[str, object] = {
                "address": r.address,
                "error": str(r.error) if r.error else None,
            }
            if r.value is not None:
                snap, runs = r.value
                entry.update(
                    node=snap.node,
                    simulated=snap.simulated,
                    backend=snap.backend,
                    driver_version=snap.driver_version,
                    cuda_driver_version=snap.cuda_driver_version,
                    gpus=snap.gpus,
                    held_by=holders(snap, runs),
                    host=snap.host,
                    recommendation=recommend_for_node(snap, target_batch),
                )
            nodes.append(entry)
        emit_json({"nodes": nodes})
    else:
        reports = [
            render_report(
                r.address, r.value[0], recommend_for_node(r.value[0], target_batch), r.value[1]
            )
            for r in results
            if r.value is not None
        ]
        if reports:
            click.echo("\n\n".join(reports))
    report_errors(results)
    sys.exit(worst_exit_code(results))
