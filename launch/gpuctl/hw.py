"""`gpuctl hw`: a hardware report with recommended training settings for each node."""

from __future__ import annotations

import sys

import click

from gpud.snapshot import NodeSnapshot
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


def render_report(address: str, snap: NodeSnapshot, rec: Recommendation) -> str:
    flag = "  [SIMULATED GPUs]" if snap.simulated else ""
    lines = [
        f"node {snap.node} ({address}){flag}",
        f"driver {snap.driver_version or 'n/a'}, CUDA {snap.cuda_driver_version or 'n/a'}, "
        f"{len(snap.gpus)} GPU(s)",
    ]
    if snap.gpus:
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
            ]
            for g in snap.gpus
        ]
        lines += ["", table(["GPU", "MODEL", "MEMORY", "CC", "PCIE", "UUID"], rows)]
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
    results = ctl.on_each(ctl.targets(), lambda client: client.node_hw())
    if ctl.json:
        nodes = []
        for r in results:
            entry: dict[str, object] = {
                "address": r.address,
                "error": str(r.error) if r.error else None,
            }
            if r.value is not None:
                entry.update(
                    node=r.value.node,
                    simulated=r.value.simulated,
                    backend=r.value.backend,
                    driver_version=r.value.driver_version,
                    cuda_driver_version=r.value.cuda_driver_version,
                    gpus=r.value.gpus,
                    host=r.value.host,
                    recommendation=recommend_for_node(r.value, target_batch),
                )
            nodes.append(entry)
        emit_json({"nodes": nodes})
    else:
        reports = [
            render_report(r.address, r.value, recommend_for_node(r.value, target_batch))
            for r in results
            if r.value is not None
        ]
        if reports:
            click.echo("\n\n".join(reports))
    report_errors(results)
    sys.exit(worst_exit_code(results))
