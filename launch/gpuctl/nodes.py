"""`gpuctl nodes`: which daemons answer, what they serve, since when."""

from __future__ import annotations

import sys

import click

from gpud.wire.client import UnknownNode
from gpud.wire.node_messages import NodeInfo
from launch.gpuctl.context import Ctl, json_option, worst_exit_code
from launch.gpuctl.output import emit_json, human_duration, table


@click.command("nodes")
@json_option
@click.pass_obj
def nodes_command(ctl: Ctl) -> None:
    """Every node: reachable or not, its GPUs, daemon version and uptime.

    Without --node (or GPUD_NODES) it lists every node in the known-nodes file, the nodes
    the other verbs and gputop use. A node that does not answer is UNREACHABLE on its row,
    one gpuctl has no key for is UNKNOWN (pin it with `gpuctl keys trust`); the exit code is
    the worst row's (3 unreachable, 2 unknown).
    """
    results = ctl.on_every_node(lambda client: client.node_info())
    if ctl.json:
        emit_json(
            {
                "nodes": [
                    {
                        "address": r.address,
                        "reachable": r.ok,
                        "known": not isinstance(r.error, UnknownNode),
                        "error": str(r.error) if r.error else None,
                        "info": r.value,
                    }
                    for r in results
                ]
            }
        )
    else:
        rows = []
        for r in results:
            info: NodeInfo | None = r.value
            if info is None:
                status = "UNKNOWN" if isinstance(r.error, UnknownNode) else "UNREACHABLE"
                rows.append([r.address, "-", status, "-", "-", "-", "-", str(r.error)])
                continue
            gpus = f"{info.gpu_count}" + (" (simulated)" if info.simulated else "")
            rows.append(
                [
                    r.address,
                    info.node,
                    "online",
                    gpus,
                    info.gpu_name or "-",
                    info.version,
                    human_duration(info.uptime_s),
                    "insecure" if not info.secure else info.role.value,
                ]
            )
        click.echo(
            table(["ADDRESS", "NODE", "STATUS", "GPUS", "MODEL", "VERSION", "UPTIME", "NOTE"], rows)
        )
    sys.exit(worst_exit_code(results))
